"""Start-up: repository checks, execution providers; /metrics and /docs."""

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
from service.runtime import ONE_INSTANCE, Placement, TensorSpec
from service.settings import Settings
from tests.helpers import DIGITS, load_model
from tests.onnx_models import adding
from tests.servers import ROOT

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


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


def _start(repository: Path) -> None:
    with TestClient(create_app(Settings(model_repository=repository))):
        pass


def test_missing_repository_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="does not exist; build the defaults with `make models`"):
        _start(tmp_path / "nowhere")


def test_config_that_does_not_match_the_model(tmp_path: Path, model_repository: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "digits-mlp-tanh", repo / "digits-mlp-tanh")
    config = repo / "digits-mlp-tanh" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 64 ]", "dims: [ 65 ]"))
    with pytest.raises(
        StartupError, match=r"input 'input' is FP32 \[64\] in model.onnx but FP32 \[65\]"
    ):
        _start(repo)
    config.write_text("name: ")
    with pytest.raises(StartupError, match=r"config\.pbtxt"):
        _start(repo)


def test_corrupt_model_file(tmp_path: Path, model_repository: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "digits-mlp-tanh", repo / "digits-mlp-tanh")
    (repo / "digits-mlp-tanh" / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(StartupError, match="digits-mlp-tanh/1: onnxruntime cannot load it"):
        _start(repo)


def test_metrics_count_requests_latency_and_batches(client) -> None:
    client.post("/v1/models/digits-mlp:predict", json={"instances": DIGITS[:3].tolist()})
    client.post("/v1/models/digits-mlp:predict", json={"instances": []})
    text = client.get("/metrics").text
    ok = (
        'gelu_requests_total{code="200",endpoint="/v1/models/{name}:predict",model="digits-mlp",'
        'version="2"}'
    )  # the version that served it
    assert ok in text
    assert 'gelu_request_failures_total{code="400",endpoint="/v1/models/{name}:predict"' in text
    assert 'gelu_request_duration_seconds_bucket{endpoint="/v1/models/{name}:predict"' in text
    assert "gelu_requests_in_flight 1.0" in text  # this very request
    assert 'gelu_batch_size_bucket{le="4.0",model="digits-mlp"}' in text


def test_openapi_documents_every_route(client) -> None:
    spec = client.get("/openapi.json").json()
    routes = {r.path for r in client.app.routes if hasattr(r, "methods")}
    documented = set(spec["paths"])
    assert routes - {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"} <= documented
    predict = spec["paths"]["/v1/models/{name}:predict"]["post"]
    schema = predict["requestBody"]["content"]["application/json"]["schema"]
    assert "instances" in schema["properties"]
    assert {"400", "404", "413"} <= set(predict["responses"])
    infer = spec["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]["content"]
    assert "application/octet-stream" in infer
    assert client.get("/docs").status_code == 200


def test_largest_batch_within_a_budget(model_repository: Path) -> None:
    model = load_model(model_repository, "digits-mlp", warmup=0)
    assert model.largest_batch_within(1e9, 300)[0] == 300  # powers of two, then the largest
    limit, cost = model.largest_batch_within(0, 300)
    assert limit == 0 and cost > 0  # not even one sample fits: the time of one is reported


class _NumpySession:
    """A second runtime's session, behind the same interface: softmax(x @ w) in numpy."""

    def __init__(self, features: int, classes: int) -> None:
        from service.runtime import TensorSpec

        self.w = np.random.default_rng(1).standard_normal((features, classes)).astype(np.float32)
        self.providers = ["numpy"]
        self.provider_options: dict[str, dict[str, str]] = {"numpy": {}}
        self.inputs = [TensorSpec("input", "FP32", (-1, features))]
        self.outputs = [
            TensorSpec("logits", "FP32", (-1, classes)),
            TensorSpec("probabilities", "FP32", (-1, classes)),
        ]
        self.metadata_props: dict[str, str] = {}
        self.memory_bytes = self.w.nbytes
        self.runs: list[int] = []
        self.closed = False

    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        assert not self.closed
        self.runs.append(len(feed["input"]))
        logits = feed["input"] @ self.w
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        answers = {"logits": logits, "probabilities": e / e.sum(axis=1, keepdims=True)}
        return [answers[name] for name in outputs]

    def close(self) -> None:
        self.closed = True


class _NumpyRuntime:
    def __init__(self) -> None:
        self.opened: dict[str, _NumpySession] = {}

    def open(self, model: bytes, label: str, placement: Placement = ONE_INSTANCE) -> _NumpySession:
        session = self.opened[label] = _NumpySession(64, 10)
        return session

    def declared(self, model: bytes, label: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        session = _NumpySession(64, 10)
        return session.inputs, session.outputs


def test_a_second_runtime_serves_behind_the_interface(model_repository: Path) -> None:
    """The core runs models through ``service.runtime.Runtime`` only: a numpy runtime's
    sessions are checked against config.pbtxt, warmed, batched, described and released as
    onnxruntime's are."""
    import asyncio

    from contract.metadata import ModelMetadata
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest, RequestInput

    props = ModelMetadata(name="digits-mlp", version="1", arch="mlp", activation="gelu",
                          task="classification", label_names=tuple("0123456789"),
                          input_normalisation={"divide_by": 16.0}, metrics={},
                          dataset="digits").to_props()  # fmt: skip
    runtime = _NumpyRuntime()
    real_open = runtime.open

    def open_with_metadata(
        model: bytes, label: str, placement: Placement = ONE_INSTANCE
    ) -> _NumpySession:
        session = real_open(model, label, placement)
        session.metadata_props = props
        return session

    runtime.open = open_with_metadata  # type: ignore[method-assign]
    settings = Settings(
        model_repository=model_repository,
        warmup_runs=2,
        grpc_port=0,
        model_control_mode="explicit",
        load_models=["digits-mlp"],
    )

    async def main() -> None:
        plane = DataPlane(settings, runtime=runtime)
        async with plane.running():
            info = plane.model_info("digits-mlp")
            assert info.providers == ["numpy"] and info.memory_bytes == 64 * 10 * 4
            x = DIGITS[:3]
            request = InferenceRequest([RequestInput(x, "input", "FP32")])
            result = await plane.infer("digits-mlp", None, request)
            session = runtime.opened["digits-mlp/2"]
            expected = session.run(["probabilities"], {"input": x})[0]
            np.testing.assert_allclose(result.outputs["probabilities"], expected)
            assert 3 in session.runs  # the request's batch, after the warm-up's
        assert all(s.closed for s in runtime.opened.values())  # every version released

    asyncio.run(main())


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
