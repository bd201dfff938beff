"""onnxruntime as the core's runtime: sessions report their tensors and the memory their
weights take; files it must not open are refused; a provider that cannot load falls back to
the CPU and says so once, or refuses the start when strict; CUDA serves where it is."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from service.errors import ModelLoadError, StartupError
from service.rest.app import create_app
from tests.helpers import DIGITS, start_app
from tests.onnx_models import adding
from tests.servers import ROOT

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def test_onnxruntime_sessions_report_their_tensors_and_memory(model_repository: Path) -> None:
    from service.onnxrt import OnnxRuntime, SessionFactory, session_options

    runtime = OnnxRuntime(SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False))
    model = (model_repository / "digits-mlp" / "1" / "model.onnx").read_bytes()
    session = runtime.open(model, "digits-mlp/1")
    assert [(t.name, t.datatype, t.dims) for t in session.inputs] == [("input", "FP32", (-1, 64))]
    assert [t.name for t in session.outputs] == ["logits", "probabilities"]
    assert session.providers == ["CPUExecutionProvider"]
    assert session.metadata_props["task"] == "classification"
    (probabilities,) = session.run(["probabilities"], {"input": DIGITS[:2]})
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    session.close()


# Run in a process of its own: a session opened in memory that an earlier one freed adds
# nothing to the process's resident memory (the repository counts such a session at its file's
# size), so only where no session but a small one (warming onnxruntime up) came before is what
# a session holds known: its weights.
MEASURE = """
import sys

import numpy as np
from onnx import numpy_helper

from service.onnxrt import OnnxRuntime, SessionFactory, session_options
from tests.onnx_models import adding

runtime = OnnxRuntime(SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False))
for count in (1024, int(sys.argv[1])):
    weight = numpy_helper.from_array(np.random.default_rng(0).random(count, np.float32), "w")
    model = adding(weight).SerializeToString()
    del weight
    session = runtime.open(model, "m/1")
print(session.memory_bytes)
"""


def test_a_sessions_memory_is_what_its_weights_take() -> None:
    """``memory_bytes`` is what opening the session added to resident memory: 64 MiB of
    weights (larger than any allocation glibc serves from its heap) add 64 MiB, and onnxruntime
    keeps little else per session (4 KiB here)."""
    weights = 64 << 20
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(weights // 4)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    measured = int(done.stdout)
    assert weights <= measured < weights + (4 << 20), measured / 2**20


@pytest.mark.parametrize("location", ["weights.bin", "../../etc/hostname", "/dev/zero"])
def test_a_model_with_external_data_is_refused(location: str, tmp_path: Path) -> None:
    """onnx CVE-2024-27318 / CVE-2026-27489 (issue 62, item 4): a tensor whose data lives in
    an external file is refused before onnxruntime sees the bytes; given bytes, onnxruntime
    would read a relative location from the working directory, outside what was verified."""
    from onnx import TensorProto, numpy_helper

    from service.onnxrt import OnnxRuntime, SessionFactory, session_options

    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    model = adding(weight)
    runtime = OnnxRuntime(SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False))
    with pytest.raises(ModelLoadError, match="tensor 'w' keeps its data in an external file"):
        runtime.open(model.SerializeToString(), "m/1")


def test_corrupt_model_file(tmp_path: Path, model_repository: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "digits-mlp-tanh", repo / "digits-mlp-tanh")
    (repo / "digits-mlp-tanh" / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(StartupError, match="digits-mlp-tanh/1: onnxruntime cannot load it"):
        start_app(repo)


def test_cuda_request_falls_back_to_cpu_and_says_so(settings_factory, caplog) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: no fallback to observe")
    caplog.set_level(logging.WARNING, logger="gelu_serve")
    with TestClient(create_app(settings_factory(providers=["cuda", "cpu"]))) as client:
        summary = client.get("/v1/models/digits-mlp").json()
        assert summary["providers"] == ["CPUExecutionProvider"]
        metrics = client.get("/metrics").text
        assert 'gelu_execution_provider{model="digits-mlp",provider="CPUExecutionProvider"' \
               ',version="2"} 1.0' in metrics  # fmt: skip
        assert "CUDAExecutionProvider" not in metrics
        assert client.get("/v1/activations").json()["providers"] == ["CPUExecutionProvider"]
    assert "CUDAExecutionProvider unavailable" in caplog.text
    assert "running on CPUExecutionProvider" in caplog.text


def test_strict_providers_refuse_to_start(settings_factory) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: nothing to refuse")
    app = create_app(settings_factory(providers=["cuda", "cpu"], strict_providers=True))
    # The refusal names what is missing: here, the provider library itself (a CPU build).
    with pytest.raises(StartupError, match="refusing to start") as refused, TestClient(app):
        pass
    assert "no libonnxruntime_providers_cuda.so" in str(refused.value)


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a GPU")
def test_cuda_provider_serves(settings_factory) -> None:
    settings = settings_factory(providers=["cuda", "cpu"], strict_providers=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/models/digits-mlp").json()["providers"][0] == "CUDAExecutionProvider"
        response = client.post(
            "/v1/models/digits-mlp:predict", json={"instances": DIGITS[:4].tolist()}
        )
        assert response.status_code == 200


def test_provider_fallback_is_logged_once(settings_factory, caplog) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: no fallback to observe")
    caplog.set_level(logging.WARNING, logger="gelu_serve")
    settings = settings_factory(providers=["cuda", "tensorrt", "cpu"])
    with TestClient(create_app(settings)) as client:
        assert client.get("/v2/health/ready").status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    # Four model versions and fourteen activation graphs, but one line per provider.
    assert len(warnings) == 2, warnings
    assert "CUDAExecutionProvider unavailable" in warnings[0]
    assert "TensorrtExecutionProvider unavailable" in warnings[1]


@pytest.mark.parametrize("spinning", [False, True])
def test_sessions_spin_only_when_asked(spinning: bool, model_repository: Path) -> None:
    """What onnxruntime's session holds, read back from it: the pools' threads spin between
    runs only when asked, and the thread counts are the ones given."""
    from service.onnxrt import SPINNING_KEYS, SessionFactory, session_options

    factory = SessionFactory(["CPUExecutionProvider"], session_options(2, 3, spinning), False)
    model = (model_repository / "digits-mlp" / "2" / "model.onnx").read_bytes()
    session, _ = factory.create(model, "digits-mlp/2")
    applied = session.get_session_options()
    assert [applied.get_session_config_entry(key) for key in SPINNING_KEYS] == [
        "1" if spinning else "0"
    ] * 2
    assert (applied.intra_op_num_threads, applied.inter_op_num_threads) == (2, 3)


@pytest.mark.anyio
@pytest.mark.parametrize("spinning", [None, True])
async def test_the_spinning_setting_reaches_every_model_session(
    spinning: bool | None, settings_factory, model_repository: Path
) -> None:
    """GELU_OP_THREAD_SPINNING as the started core applies it to each loaded model's
    session (off when unset), read back from onnxruntime's sessions themselves."""
    from service.onnxrt import SPINNING_KEYS
    from tests.helpers import started

    overrides = {"intra_op_threads": 2} | ({} if spinning is None else {"op_thread_spinning": True})
    core = await started(settings_factory, model_repository, **overrides)
    try:
        for name in core.model_names():
            # OrtSession.run is onnxruntime's own bound method: its session is what serves.
            session = core.model(name).session.run.__self__  # type: ignore[attr-defined]
            applied = session.get_session_options()
            entries = {applied.get_session_config_entry(key) for key in SPINNING_KEYS}
            assert entries == {"1" if spinning else "0"}, name
            assert applied.intra_op_num_threads == 2
    finally:
        await core.stop()
