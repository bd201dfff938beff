"""The live model repository: version policies, control modes, failures that leave the rest
serving, swaps and unloads that lose no request, and polling."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from service.control import CONTROL_FORBIDDEN, ControlForbiddenError, ModelControl
from service.dataplane import DataPlane
from service.errors import BadInputError, ModelLoadError, NotFoundError, StartupError
from service.inference import InferenceRequest, RequestInput
from service.runtime import Model
from tests.helpers import DIGITS, until
from tests.onnx_models import write_foreign, write_model

pytestmark = pytest.mark.anyio


def request(rows: int = 1) -> InferenceRequest:
    return InferenceRequest([RequestInput(DIGITS[:rows], "input", "FP32")])


def set_policy(repo: Path, name: str, policy: str) -> None:
    config = repo / name / "config.pbtxt"
    lines = [x for x in config.read_text().splitlines() if not x.startswith("version_policy")]
    config.write_text("\n".join([*lines, policy]) + "\n")


async def started(settings_factory, repo: Path, **overrides) -> DataPlane:
    core = DataPlane(settings_factory(model_repository=repo, **overrides))
    await core.start()
    return core


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
            await core.infer("digits-mlp", "4", request())
    finally:
        await core.stop()


async def test_odd_version_directories_are_skipped(settings_factory, repo: Path, caplog) -> None:
    for odd in ("²", "0", "v3", "-1"):
        (repo / "digits-mlp" / odd).mkdir()
    core = await started(settings_factory, repo)
    try:
        assert core.model_info("digits-mlp").versions == ["1", "2"]
        assert "digits-mlp/² : not a version".replace(" ", "") in caplog.text.replace(" ", "")
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


async def test_control_is_forbidden_outside_explicit_mode(settings_factory, repo: Path) -> None:
    core = await started(settings_factory, repo)
    control = ModelControl.over(core)
    try:
        for action in (control.load, control.unload):
            with pytest.raises(ControlForbiddenError, match=CONTROL_FORBIDDEN) as caught:
                await action("digits-mlp")
            assert caught.value.status_code == 503
    finally:
        await core.stop()


async def test_explicit_mode_loads_and_unloads(settings_factory, repo: Path) -> None:
    core = await started(
        settings_factory, repo, model_control_mode="explicit", load_models=["digits-mlp"]
    )
    control = ModelControl.over(core)
    try:
        assert core.model_names() == ["digits-mlp"]
        assert {"name": "digits-mlp-tanh"} in await control.index()  # never loaded
        await control.load("digits-mlp-tanh")
        assert (await core.infer("digits-mlp-tanh", None, request())).outputs["logits"].shape
        await control.unload("digits-mlp")
        with pytest.raises(NotFoundError):
            await core.infer("digits-mlp", None, request())
        states = [e for e in await control.index() if e["name"] == "digits-mlp"]
        assert {(e["version"], e["state"], e["reason"]) for e in states} == {
            ("1", "UNAVAILABLE", "unloaded"), ("2", "UNAVAILABLE", "unloaded")
        }  # fmt: skip
        await control.load("digits-mlp")  # and back
        assert core.model_info("digits-mlp").versions == ["1", "2"]
        with pytest.raises(NotFoundError, match="no model 'nope'"):
            await control.load("nope")
        index = await control.index()
        # only a model's own directory, by its own name: no other path becomes an index entry
        (repo / ".staging").mkdir()
        for path in ("", ".", "..", ".staging", "digits-mlp/", "digits-mlp/1", "digits-mlp/./1"):
            for change in (control.load, control.unload):
                with pytest.raises(NotFoundError, match=f"no model {path!r}"):
                    await change(path)
        assert await control.index() == index
        assert 'model=""' not in core.metrics.exposition().decode()
        (repo / "digits-autoencoder" / "config.pbtxt").write_text("name: ")
        with pytest.raises(BadInputError, match="failed to load 'digits-autoencoder'"):
            await control.load("digits-autoencoder")
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
        before = (await core.infer("digits-mlp", "2", request())).outputs["logits"]
        flights = [asyncio.create_task(core.infer("digits-mlp", None, request())) for _ in range(8)]
        await asyncio.sleep(0.01)
        shutil.copy(repo / "digits-mlp" / "1" / "model.onnx", repo / "digits-mlp" / "2")
        await ModelControl.over(core).load("digits-mlp")  # version 2's file changed: swapped
        results = await asyncio.gather(*flights)
        assert all(np.array_equal(r.outputs["logits"], before) for r in results)
        after = (await core.infer("digits-mlp", "2", request())).outputs["logits"]
        one = (await core.infer("digits-mlp", "1", request())).outputs["logits"]
        np.testing.assert_array_equal(after, one)
        flights = [asyncio.create_task(core.infer("digits-mlp", None, request())) for _ in range(8)]
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
        assert (await core.infer("digits-mlp", "3", request())).outputs["logits"].shape == (1, 10)
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
        assert "digits-mlp/config.pbtxt: optimization, parameters read but not honoured" in (
            caplog.text
        )
        assert core.repository is not None
        batches = core.repository.get("digits-mlp").scheduler.batching
        assert batches is not None and batches.instances == 2
    finally:
        await core.stop()


async def test_any_onnx_file_without_config_or_batch_axis(settings_factory, repo: Path) -> None:
    """As Triton's auto-complete: a fixed shape means no batch axis (max_batch_size 0, dims
    as declared); a symbolic first dimension is the batch axis, other symbolic dims -1."""
    write_foreign(repo, "fixed", [2, 3], "Relu")
    write_foreign(repo, "dynamic", ["N", "L"], "Relu")
    core = await started(settings_factory, repo)
    try:
        fixed, dynamic = core.model_info("fixed"), core.model_info("dynamic")
        assert fixed.config_max_batch_size == 0 and fixed.inputs[0].dims == (2, 3)
        assert dynamic.config_max_batch_size == 4 and dynamic.inputs[0].dims == (-1,)
        x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
        result = await core.infer("fixed", None, InferenceRequest([RequestInput(x, "x", "FP32")]))
        np.testing.assert_array_equal(result.outputs["y"], np.maximum(x, 0))
        with pytest.raises(BadInputError, match=r"shape \[1, 3\] does not match the model's "
                           r"\[2, 3\] \(it has no batch axis\)"):  # fmt: skip
            await core.infer("fixed", None, InferenceRequest([RequestInput(x[:1], "x", "FP32")]))
        for shape in ((3, 5), (1, 7)):
            z = np.ones(shape, np.float32)
            result = await core.infer("dynamic", None, InferenceRequest([RequestInput(z)]))
            assert result.outputs["y"].shape == shape
        stats = core.statistics("fixed")[0]
        assert stats["inference_count"] == 1 and stats["execution_count"] == 1
    finally:
        await core.stop()
    with pytest.raises(StartupError, match=r"config\.pbtxt"):
        await started(settings_factory, repo, strict_model_config=True)


async def test_a_config_without_a_name_is_named_by_its_directory(
    settings_factory, repo: Path
) -> None:
    """As Triton reads config.pbtxt, and as ModelMesh's Triton adapter writes it: no `name`
    (the directory's), `backend` in place of `platform`."""
    config = repo / "digits-mlp" / "config.pbtxt"
    lines = config.read_text().splitlines()
    kept = [x for x in lines if not x.startswith(("name:", "platform:"))]
    config.write_text("\n".join(['backend: "onnxruntime"', *kept]) + "\n")
    core = await started(settings_factory, repo)
    try:
        assert core.model_config("digits-mlp")["name"] == "digits-mlp"
        assert (await core.infer("digits-mlp", None, request())).outputs["logits"].shape == (1, 10)
    finally:
        await core.stop()


WARMUP = """
model_warmup [
  {
    name: "sample"
    batch_size: 8
    inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 64 ] random_data: true } }
    count: 2
  },
  {
    name: "digit"
    batch_size: 1
    inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 64 ] input_data_file: "zero" } }
  }
]
"""


async def test_model_warmup_runs_before_ready(settings_factory, repo: Path, caplog) -> None:
    """config.pbtxt's model_warmup samples (random data, and a file from the model's warmup/
    folder) run before the version is ready: in the log before "ready", and counted."""
    import logging

    caplog.set_level(logging.INFO, logger="gelu_serve")
    config = repo / "digits-mlp" / "config.pbtxt"
    config.write_text(config.read_text() + WARMUP)
    (repo / "digits-mlp" / "warmup").mkdir()
    (repo / "digits-mlp" / "warmup" / "zero").write_bytes(DIGITS[0].astype("<f4").tobytes())
    core = await started(settings_factory, repo)
    try:
        lines = [r.getMessage() for r in caplog.records]
        ran = [i for i, x in enumerate(lines) if "digits-mlp/2: model_warmup" in x]
        assert ran and "'sample' (2 x batch 8)" in lines[ran[0]]
        assert "'digit' (1 x batch 1)" in lines[ran[1]]
        ready = next(i for i, x in enumerate(lines) if x.startswith("ready:"))
        assert max(ran) < ready
        exposed = core.metrics.exposition().decode()
        assert 'gelu_model_warmup_runs_total{model="digits-mlp",version="2"} 3.0' in exposed
    finally:
        await core.stop()


async def test_a_warmup_that_does_not_fit_refuses_the_version(settings_factory, repo: Path) -> None:
    config = repo / "digits-mlp" / "config.pbtxt"
    config.write_text(config.read_text() + WARMUP.replace('key: "input"', 'key: "pixels"', 1))
    (repo / "digits-mlp" / "warmup").mkdir()
    (repo / "digits-mlp" / "warmup" / "zero").write_bytes(DIGITS[0].astype("<f4").tobytes())
    core = await started(settings_factory, repo, exit_on_error=False)
    try:
        (entry,) = [e for e in await ModelControl.over(core).index() if e.get("version") == "2"
                    and e["name"] == "digits-mlp"]  # fmt: skip
        assert entry["state"] == "UNAVAILABLE" and "input 'pixels' is not one of" in entry["reason"]
    finally:
        await core.stop()


@pytest.mark.parametrize(
    ("data_file", "why"),
    [
        ("/dev/zero", "must name a file under warmup/"),
        ("../config.pbtxt", "must name a file under warmup/"),
        ("/etc/hostname", "must name a file under warmup/"),
        ("out", "warmup/out: a symbolic link"),
        ("fifo", "warmup/fifo: not a regular file"),
        ("big", "warmup/big: larger than"),
        ("inner/out", "warmup/inner: a symbolic link"),
        ("missing", "warmup/missing: no such file"),
    ],
)
def test_warmup_files_are_confined_to_the_warmup_folder(
    repo: Path, data_file: str, why: str, monkeypatch
) -> None:
    """Issue 62, item 4: a model_warmup input_data_file is a regular file under the model's
    warmup/, reached without a symbolic link and within a size bound; anything else (a device,
    a path that climbs out, an absolute one, a link out, a FIFO, a huge file) is refused with
    the reason before anything is read."""
    import os

    from service.repository import layout

    model_dir = repo / "digits-mlp"
    warmup = model_dir / "warmup"
    warmup.mkdir()
    made = {
        "out": lambda: (warmup / "out").symlink_to("/dev/zero"),
        "inner/out": lambda: (warmup / "inner").symlink_to(model_dir / "2"),
        "fifo": lambda: os.mkfifo(warmup / "fifo"),
        "big": lambda: (warmup / "big").write_bytes(b"\0" * 4096),
    }
    made.get(data_file, lambda: None)()
    monkeypatch.setattr(layout, "MAX_WARMUP_FILE_BYTES", 1024)
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text() + WARMUP.replace('"zero"', f'"{data_file}"'))
    for whole in (False, True):
        with pytest.raises(ModelLoadError, match=f"digits-mlp/2: .*{re.escape(why)}"):
            layout.read_version(model_dir, 2, layout.read_config(model_dir), whole)


def test_a_version_reads_each_file_once_and_no_link(repo: Path) -> None:
    """The files a version loads are read once into memory; a model file that is a symbolic
    link is refused, so what was read is what is below the model directory."""
    from service.repository.layout import read_version

    model_dir = repo / "digits-mlp"
    read = read_version(model_dir, 2, None, whole=False)
    assert read.files == {"2/model.onnx": (model_dir / "2" / "model.onnx").read_bytes()}
    (model_dir / "3").mkdir()
    (model_dir / "3" / "model.onnx").symlink_to(model_dir / "2" / "model.onnx")
    with pytest.raises(ModelLoadError, match=r"digits-mlp/3: 3/model\.onnx: a symbolic link"):
        read_version(model_dir, 3, None, whole=False)
