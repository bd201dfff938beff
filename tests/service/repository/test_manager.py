"""The live repository's refusals (issue 62, items 3, 9 and 11): any error of one model's load,
of any type, is that model's refusal with its reason, in the index and one log line; start-up,
the poller and the other models go on; errors name what was asked, never another model or a
path on disk; an unknown name costs the event loop no directory listing."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import LoadFailedError, NotFoundError, StartupError
from service.repository import manager
from service.runtime import Model
from tests.helpers import ROW, assert_error, digits_request, started, until, v2_body
from tests.onnx_models import write_model

pytestmark = pytest.mark.anyio
V1 = "/v1/models/digits-mlp:predict"
V2 = "/v2/models/digits-mlp/infer"
# What a load may raise besides the repository's own refusal: a parser's, the disk's, a
# recursion limit's, onnxruntime's allocator's.
FOREIGN = [ValueError("invalid literal"), OSError(5, "Input/output error"),
           RecursionError("maximum recursion depth exceeded"), MemoryError()]  # fmt: skip


async def entries(core: DataPlane, name: str) -> list[dict[str, str]]:
    return [e for e in await ModelControl.over(core).index() if e["name"] == name]


def failing(real, name: str, error: BaseException):
    """``real`` (a loader of the repository's), raising ``error`` for model ``name``."""

    def load(model_dir: Path, *args, **kwargs):
        if Path(model_dir).name == name:
            raise error
        return real(model_dir, *args, **kwargs)

    return load


@pytest.mark.parametrize("error", FOREIGN, ids=lambda e: type(e).__name__)
async def test_any_error_of_a_version_is_its_refusal(
    settings_factory, repo: Path, monkeypatch, caplog, error: BaseException
) -> None:
    monkeypatch.setattr(manager, "load_version", failing(manager.load_version, "digits-mlp", error))
    with pytest.raises(StartupError, match=f"digits-mlp/2: {type(error).__name__}") as refused:
        await started(settings_factory, repo)  # GELU_EXIT_ON_ERROR=true: one line says why
    assert "\n" not in str(refused.value)
    core = await started(settings_factory, repo, exit_on_error=False, model_control_mode="explicit",
                         load_models=["*"])  # fmt: skip
    try:
        assert sorted(core.model_names()) == ["digits-autoencoder", "digits-mlp-tanh"]
        assert (await core.infer("digits-mlp-tanh", None, digits_request())).outputs["logits"].shape
        states = {
            e["version"]: (e["state"], e["reason"]) for e in await entries(core, "digits-mlp")
        }
        assert set(states) == {"1", "2"}
        assert all(s == "UNAVAILABLE" and type(error).__name__ in r for s, r in states.values())
        caplog.clear()
        with pytest.raises(LoadFailedError, match="failed to load 'digits-mlp'") as caught:
            await ModelControl.over(core).load("digits-mlp")  # explicit: 400, as Triton answers it
        assert caught.value.status_code == 400
        assert str(repo) not in caught.value.message  # named from the root, not the disk
        failed = [r for r in caplog.records if r.getMessage().startswith("load failed")]
        assert len(failed) == 2 and all("\n" not in r.getMessage() for r in failed)
        assert all(r.exc_info is None for r in failed)  # a line, no traceback
    finally:
        await core.stop()


@pytest.mark.parametrize("error", FOREIGN, ids=lambda e: type(e).__name__)
async def test_any_error_of_a_config_is_the_models_refusal(
    settings_factory, repo: Path, monkeypatch, error: BaseException
) -> None:
    monkeypatch.setattr(manager, "read_config", failing(manager.read_config, "digits-mlp", error))
    core = await started(settings_factory, repo, exit_on_error=False)
    try:
        assert sorted(core.model_names()) == ["digits-autoencoder", "digits-mlp-tanh"]
        (entry,) = await entries(core, "digits-mlp")  # the model as a whole: no version read
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"].startswith(f"digits-mlp/config.pbtxt: {type(error).__name__}")
    finally:
        await core.stop()


async def test_the_poller_outlives_a_bad_config(
    settings_factory, repo: Path, caplog, monkeypatch
) -> None:
    """Issue 62, item 3: a config the parser chokes on, and one whose reading raises what no
    parser should, each stop that model alone: another model's new version still loads."""
    core = await started(settings_factory, repo, model_control_mode="poll",
                         repository_poll_seconds=0.05)  # fmt: skip

    real = manager.read_config

    def read(model_dir: Path, *args, **kwargs):
        if model_dir.name == "digits-autoencoder":
            raise RecursionError("maximum recursion depth exceeded")
        return real(model_dir, *args, **kwargs)

    try:
        tanh = repo / "digits-mlp-tanh" / "config.pbtxt"
        tanh.write_text(tanh.read_text() + 'max_batch_size: "x"\n')
        monkeypatch.setattr(manager, "read_config", read)
        (repo / "digits-autoencoder" / "config.pbtxt").touch()

        def refused() -> bool:
            lines = [r.getMessage() for r in caplog.records]
            return any(x.startswith("load failed: digits-autoencoder") for x in lines)

        await until(refused, "the refusal")
        shutil.copytree(repo / "digits-mlp" / "2", repo / "digits-mlp" / "3")
        await until(lambda: core.model_info("digits-mlp").versions == ["1", "2", "3"], "v3")
        assert core.repository is not None and core.repository._poller is not None
        assert not core.repository._poller.done()
        # what served before the bad files still serves, and the index says why not the new
        for name in ("digits-mlp-tanh", "digits-autoencoder"):
            assert name in core.model_names()
            reasons = [e["reason"] for e in await entries(core, name)]
            assert all(r.startswith("new files failed to load") for r in reasons), reasons
        assert "RecursionError" in (await entries(core, "digits-autoencoder"))[0]["reason"]
        assert (
            "digits-mlp-tanh/config.pbtxt" in (await entries(core, "digits-mlp-tanh"))[0]["reason"]
        )
    finally:
        await core.stop()


async def test_a_404_names_only_what_was_asked(settings_factory, repo: Path) -> None:
    """Issue 62, item 9: no other model's name, no path on disk, for any face or mode."""
    for mode in ("none", "on_demand"):
        core = await started(settings_factory, repo, model_control_mode=mode)
        try:
            for name in ("nope", "../digits-mlp", "digits-mlp/1", "." * 300):
                with pytest.raises(NotFoundError) as caught:
                    await core.infer(name, None, digits_request())
                message = caught.value.message
                assert repr(name) in message, message
                assert "digits-" not in message.replace(repr(name), ""), message
                assert str(repo) not in message and str(repo.parent) not in message, message
        finally:
            await core.stop()


async def test_an_unknown_name_is_looked_up_off_the_loop(
    settings_factory, repo: Path, monkeypatch
) -> None:
    """Issue 62, item 11: one stat on a worker thread, never a listing on the event loop;
    a name that cannot be a model's directory costs no stat at all."""
    looked: list[tuple[str, bool]] = []
    real = manager.ModelRepository._is_model_dir

    def is_model_dir(self, name: str) -> bool:
        looked.append((name, threading.current_thread() is threading.main_thread()))
        return real(self, name)

    monkeypatch.setattr(manager.ModelRepository, "_is_model_dir", is_model_dir)
    core = await started(settings_factory, repo, model_control_mode="on_demand")
    # start-up lists the repository once; a request never does
    monkeypatch.setattr(manager, "model_names", lambda root: pytest.fail("listed the repository"))
    try:
        for name in ("nope", ".hidden", "a/b", "", "x" * 256, "nul\0"):
            with pytest.raises(NotFoundError):
                await core.infer(name, None, digits_request())
        assert looked == [("nope", False)]
        assert (await core.infer("digits-mlp", None, digits_request())).outputs["logits"].shape
        assert {entry for entry in looked[1:]} == {("digits-mlp", False)}  # its load's too
    finally:
        await core.stop()


async def test_the_index_lists_the_repository_off_the_loop_and_bounded(
    settings_factory, repo: Path, monkeypatch, caplog
) -> None:
    """Issue 62, item 11: the index lists the repository's directory on a worker thread, and
    reads at most INDEX_MAX of its entries, however many it holds; the models loaded or tried
    are listed whatever was read."""
    listed: list[tuple[int | None, bool]] = []
    real = manager.model_names

    def model_names(root: Path, limit: int | None = None) -> list[str]:
        listed.append((limit, threading.current_thread() is threading.main_thread()))
        return real(root, limit)

    for number in range(5):
        (repo / f"extra-{number}").mkdir()
    core = await started(settings_factory, repo, model_control_mode="explicit",
                         load_models=["digits-mlp"])  # fmt: skip
    monkeypatch.setattr(manager, "model_names", model_names)
    monkeypatch.setattr(manager, "INDEX_MAX", 2)
    try:
        names = {e["name"] for e in await ModelControl.over(core).index()}
    finally:
        await core.stop()
    assert listed == [(3, False)]
    assert "digits-mlp" in names and len(names - {"digits-mlp"}) <= 2
    assert "lists 2 of the models" in caplog.text


def set_policy(repo: Path, name: str, policy: str) -> None:
    config = repo / name / "config.pbtxt"
    lines = [x for x in config.read_text().splitlines() if not x.startswith("version_policy")]
    config.write_text("\n".join([*lines, policy]) + "\n")


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", ["3"]),  # absent: Triton's default, the latest one
        ("version_policy: { latest: { num_versions: 2 } }", ["2", "3"]),
        ("version_policy: { all: { } }", ["1", "2", "3"]),
        ("version_policy: { specific: { versions: [1, 3] } }", ["1", "3"]),
    ],
)
async def test_version_policy(settings_factory, repo: Path, policy: str, served: list[str]) -> None:
    shutil.copytree(repo / "digits-mlp" / "2", repo / "digits-mlp" / "3")
    set_policy(repo, "digits-mlp", policy)
    core = await started(settings_factory, repo)
    try:
        assert core.model_info("digits-mlp").versions == served
        with pytest.raises(NotFoundError):
            await core.infer("digits-mlp", "4", digits_request())
    finally:
        await core.stop()


async def test_a_model_that_fails_to_load(settings_factory, repo: Path) -> None:
    (repo / "digits-mlp-tanh" / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(StartupError, match="digits-mlp-tanh/1: onnxruntime cannot load it"):
        await started(settings_factory, repo)
    core = await started(settings_factory, repo, exit_on_error=False)
    try:
        assert sorted(core.model_names()) == ["digits-autoencoder", "digits-mlp"]
        (entry,) = [
            e for e in await ModelControl.over(core).index() if e["name"] == "digits-mlp-tanh"
        ]
        assert entry["state"] == "UNAVAILABLE" and "cannot load it" in entry["reason"]
        ready = await ModelControl.over(core).index(ready_only=True)
        assert {e["name"] for e in ready} == {"digits-autoencoder", "digits-mlp"}
        text = core.metrics.exposition().decode()
        assert 'gelu_model_load_failures_total{model="digits-mlp-tanh"} 1.0' in text
    finally:
        await core.stop()


async def test_unload_and_swap_finish_requests_in_flight(
    settings_factory, repo: Path, monkeypatch
) -> None:
    """Requests already running on a version that is unloaded, or replaced by a new file,
    all complete; the next request sees the change."""
    real = Model.infer

    def slow(self, inputs, outputs=None):
        time.sleep(0.05)  # on a worker thread: long enough to be cut if the swap were abrupt
        return real(self, inputs, outputs)

    monkeypatch.setattr(Model, "infer", slow)
    core = await started(
        settings_factory, repo, model_control_mode="explicit", load_models=["*"], inline_max_us=0
    )
    try:
        before = (await core.infer("digits-mlp", "2", digits_request())).outputs["logits"]
        flights = [
            asyncio.create_task(core.infer("digits-mlp", None, digits_request())) for _ in range(8)
        ]
        await asyncio.sleep(0.01)
        shutil.copy(repo / "digits-mlp" / "1" / "model.onnx", repo / "digits-mlp" / "2")
        await ModelControl.over(core).load("digits-mlp")  # version 2's file changed: swapped
        results = await asyncio.gather(*flights)
        assert all(np.array_equal(r.outputs["logits"], before) for r in results)
        after = (await core.infer("digits-mlp", "2", digits_request())).outputs["logits"]
        one = (await core.infer("digits-mlp", "1", digits_request())).outputs["logits"]
        np.testing.assert_array_equal(after, one)
        flights = [
            asyncio.create_task(core.infer("digits-mlp", None, digits_request())) for _ in range(8)
        ]
        await asyncio.sleep(0.01)
        await ModelControl.over(core).unload("digits-mlp")
        assert len(await asyncio.gather(*flights)) == 8
    finally:
        await core.stop()


async def test_poll_mode_follows_the_repository(settings_factory, repo: Path) -> None:
    """A new version appears, a corrupt one leaves the old serving and is reported, a new
    model appears and a removed one goes."""
    core = await started(
        settings_factory, repo, model_control_mode="poll", repository_poll_seconds=0.05
    )
    try:
        shutil.copytree(repo / "digits-mlp" / "2", repo / "digits-mlp" / "3")
        await until(lambda: core.model_info("digits-mlp").versions == ["1", "2", "3"], "v3")
        (repo / "digits-mlp" / "4").mkdir()
        (repo / "digits-mlp" / "4" / "model.onnx").write_bytes(b"half a file")
        (repo / "digits-mlp" / "3" / "model.onnx").write_bytes(b"half a file")

        async def states() -> dict[str, tuple[str, str]]:
            index = await ModelControl.over(core).index()
            return {e["version"]: (e["state"], e["reason"]) for e in index
                    if e["name"] == "digits-mlp"}  # fmt: skip

        async def reported() -> bool:
            return "4" in await states()

        await until(reported, "the corrupt new version reported")
        now = await states()
        assert now["4"][0] == "UNAVAILABLE" and "cannot load it" in now["4"][1]
        assert now["3"][0] == "READY" and "new files failed to load" in now["3"][1]
        assert core.model_info("digits-mlp").versions == ["1", "2", "3"]  # the old v3 serves
        assert (await core.infer("digits-mlp", "3", digits_request())).outputs["logits"].shape == (
            1,
            10,
        )
        write_model(repo, "digits-mlp-new", 1)
        await until(lambda: "digits-mlp-new" in core.model_names(), "a new model")
        shutil.rmtree(repo / "digits-autoencoder")
        await until(lambda: "digits-autoencoder" not in core.model_names(), "a removed model")
    finally:
        await core.stop()


async def test_fields_read_but_not_honoured_are_named(settings_factory, repo: Path, caplog) -> None:
    config = repo / "digits-mlp" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        + 'parameters { key: "x" value: { string_value: "y" } }\n'
        + "optimization { priority: PRIORITY_MAX }\n"
    )
    core = await started(settings_factory, repo, inline_max_us=0)
    try:
        assert "digits-mlp/config.pbtxt: optimization, parameters.x read but not honoured" in (
            caplog.text
        )
        assert core.repository is not None
        batches = core.repository.get("digits-mlp").scheduler.batching
        assert batches is not None and batches.instances == 2
    finally:
        await core.stop()


def test_request_batch_limit_from_settings(settings_factory) -> None:
    from fastapi.testclient import TestClient

    from service.rest.app import create_app

    with TestClient(create_app(settings_factory(max_request_batch=4))) as limited:
        assert limited.get("/v1/models/digits-mlp").json()["max_batch_size"] == 4
        ok = limited.post(V1, json={"instances": [ROW] * 4})
        assert ok.status_code == 200
        assert_error(limited.post(V1, json={"instances": [ROW] * 5}), 413, "maximum of 4")
        assert_error(limited.post(V2, json=v2_body(shape=[5, 64], data=ROW * 5)), 413,
                     "maximum of 4")  # fmt: skip
