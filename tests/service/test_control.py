"""Model control (Triton's model repository extension) over the core: load, unload and the
index, forbidden outside the explicit control mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.control import CONTROL_FORBIDDEN, ControlForbiddenError, ModelControl
from service.errors import BadInputError, NotFoundError
from tests.helpers import digits_request, started

pytestmark = pytest.mark.anyio


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
        assert (await core.infer("digits-mlp-tanh", None, digits_request())).outputs["logits"].shape
        await control.unload("digits-mlp")
        with pytest.raises(NotFoundError):
            await core.infer("digits-mlp", None, digits_request())
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


# Triton's load overrides (CVE-2023-31036: a ``file:`` override with ``..`` wrote outside the
# repository), and spellings a client or a proxy may make of them.
OVERRIDES = ["config", "file:1/model.onnx", "file:../../../tmp/x", "file:", "FILE:1/model.onnx",
             "Config", " config", "file:\x00", "File:1/model.onnx"]  # fmt: skip


@pytest.mark.parametrize("key", OVERRIDES)
async def test_a_load_override_in_any_spelling_is_refused(
    settings_factory, repo: Path, key: str
) -> None:
    core = await started(settings_factory, repo, model_control_mode="explicit", load_models=[])
    control = ModelControl.over(core)
    try:
        with pytest.raises(BadInputError, match="is not supported") as refused:
            await control.load("digits-mlp", [key])
        assert refused.value.status_code == 400
        assert core.model_names() == []  # nothing loaded on a refused request
        await control.load("digits-mlp", ["unrelated"])  # another parameter: ignored
        assert core.model_names() == ["digits-mlp"]
    finally:
        await core.stop()
