"""The model repository on disk: which version directories count, configs completed or named
as Triton completes them, model_warmup run before a version is ready, and the files a version
loads read once, from below the model's directory."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.control import ModelControl
from service.errors import BadInputError, ModelLoadError, StartupError
from service.inference import InferenceRequest, RequestInput
from service.rest.app import create_app
from tests.helpers import DIGITS, assert_error, digits_request, started
from tests.onnx_models import write_foreign

pytestmark = pytest.mark.anyio


async def test_odd_version_directories_are_skipped(settings_factory, repo: Path, caplog) -> None:
    for odd in ("²", "0", "v3", "-1"):
        (repo / "digits-mlp" / odd).mkdir()
    core = await started(settings_factory, repo)
    try:
        assert core.model_info("digits-mlp").versions == ["1", "2"]
        assert "digits-mlp/² : not a version".replace(" ", "") in caplog.text.replace(" ", "")
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
        assert (await core.infer("digits-mlp", None, digits_request())).outputs["logits"].shape == (
            1,
            10,
        )
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


def test_a_foreign_onnx_file_over_http(settings_factory, repo: Path) -> None:
    """No config.pbtxt, no metadata, no batch axis: listed, described and served."""
    write_foreign(repo, "fixed", [2, 3], "Relu")
    with TestClient(create_app(settings_factory(model_repository=repo))) as http:
        assert "fixed" in {m["name"] for m in http.get("/v1/models").json()["models"]}
        config = http.get("/v2/models/fixed/config").json()
        assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [2, 3]
        body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                            "data": [-1, 2, -3, 4, -5, 6]}]}  # fmt: skip
        response = http.post("/v2/models/fixed/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [0, 2, 0, 4, 0, 6]
        body["inputs"][0]["shape"] = [3, 2]
        assert_error(http.post("/v2/models/fixed/infer", json=body), 400, "no batch axis")
