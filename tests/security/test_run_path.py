"""One run path per model version (issue 62), against a real ``gelu-serve serve``: batch
poisoning by mixed shapes (item 2), declared-shape bombs answered 500 (item 5, vLLM
CVE-2025-62164's class) and stale ensemble answers from the response cache (item 8).

One server for the module, over a tiny repository built with ``onnx.helper``: ``varlen``, a
variable dim (``dims: [ -1 ]``) with dynamic batching; ``scale``, whose versions multiply by
their own factor; ``chain``, an ensemble of ``scale`` with ``response_cache``. Explicit model
control, so a test can move ``scale`` to a new version.
"""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from tests.onnx_models import write_scaling, write_variable
from tests.servers import free_port, running

pytestmark = pytest.mark.slow

HUGE = 2**31 - 1
BOMB = [0, HUGE, HUGE, HUGE]  # an empty tensor whose dims multiply past what numpy can describe
CLIENTS, PER_CLIENT = 32, 4

SCALE = """name: "scale"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy: { latest: { num_versions: 1 } }
"""
CHAIN = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "scale"
      model_version: -1
      input_map { key: "x" value: "x" }
      output_map { key: "y" value: "y" }
    }
  ]
}
response_cache { enable: true }
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run_path")
    write_variable(root, "varlen")
    write_scaling(root / "scale" / "1", 2.0)
    (root / "chain" / "1").mkdir(parents=True)
    for name, config in (("scale", SCALE), ("chain", CHAIN)):
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[tuple[int, int, subprocess.Popen[str]]]:
    """(HTTP port, gRPC port, process); the harness asserts no traceback in its log."""
    grpc_port = free_port()
    env = {
        "GELU_GRPC_PORT": str(grpc_port),
        "GELU_MODEL_CONTROL_MODE": "explicit",
        "GELU_LOAD_MODELS": "*",
        "GELU_RESPONSE_CACHE_BYTES": str(1 << 20),
    }
    with running(repository, **env) as (port, process):
        yield port, grpc_port, process


def post(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", path, body, {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def v2(name: str, shape: list[int], data: list[float]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data}]}
    ).encode()


def test_mixed_shapes_for_a_variable_dim_are_all_answered(server) -> None:
    """Issue 62, item 2 (batch poisoning): 32 clients sending shapes [1, 3] and [1, 5] to a
    variable-dim model with dynamic batching: of 128 requests 31 were never answered and 5 got
    500. Every one is answered now, each with its own right answer, within the timeout."""
    port, _, _ = server

    def client(number: int) -> list[tuple[int, list[float], list[float]]]:
        answers = []
        for i in range(PER_CLIENT):
            width = 3 if (number + i) % 2 else 5
            row = [float(number * 10 + i + k) for k in range(width)]
            status, body = post(port, "/v2/models/varlen/infer", v2("x", [1, width], row))
            got = json.loads(body)["outputs"][0]["data"] if status == 200 else []
            answers.append((status, row, got))
        return answers

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(client, n) for n in range(CLIENTS)]
        answers = [a for f in futures for a in f.result(timeout=60)]
    assert len(answers) == CLIENTS * PER_CLIENT
    assert [s for s, _, _ in answers if s != 200] == []
    for _, row, got in answers:
        assert got == [2 * v for v in row]


@pytest.mark.parametrize("shape", [BOMB, [HUGE, 0, HUGE], [65536] * 4, [46341, 46341]], ids=str)
def test_a_declared_shape_bomb_is_a_400_on_every_http_route(server, shape: list[int]) -> None:
    """Issue 62, item 5 (vLLM CVE-2025-62164, declared-shape bomb): an empty tensor with huge
    dims on the activation route (raw float32, X-Shape), in V2 JSON and in V2 binary answered
    500 with a traceback logged per request. A 400 that says why, on each; the server's log
    holds no traceback (the harness checks it as the server stops)."""
    port, _, _ = server
    text = ",".join(map(str, shape))
    raw = {"Content-Type": "application/octet-stream", "X-Shape": text}
    status, body = post(port, "/v1/activations/gelu", b"", raw)
    assert status == 400 and "elements" in json.loads(body)["error"], body
    status, body = post(port, "/v2/models/varlen/infer", v2("x", shape, []))
    assert status == 400 and "elements" in json.loads(body)["error"], body
    entry = {"name": "x", "shape": shape, "datatype": "FP32"}
    header = json.dumps({"inputs": [{**entry, "parameters": {"binary_data_size": 0}}]}).encode()
    length = {"Inference-Header-Content-Length": str(len(header))}
    status, body = post(port, "/v2/models/varlen/infer", header, length)
    assert status == 400 and "elements" in json.loads(body)["error"], body


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
def test_a_declared_shape_bomb_is_invalid_argument_over_grpc(server, raw: bool) -> None:
    """Issue 62, item 5 (vLLM CVE-2025-62164): the same empty tensor with huge dims over gRPC,
    as raw contents or typed contents: INVALID_ARGUMENT, not UNKNOWN or INTERNAL."""
    _, grpc_port, _ = server
    request = pb.ModelInferRequest(model_name="varlen")
    request.inputs.add(name="x", datatype="FP32", shape=BOMB)
    if raw:
        request.raw_input_contents.append(b"")
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "elements" in (caught.value.details() or "")


def test_an_ensemble_never_answers_from_a_step_version_gone_by(server, repository: Path) -> None:
    """Issue 62, item 8 (stale answers): an ensemble with ``response_cache`` kept answering
    from the cache after its step moved to a new version. Its cached answers are keyed by the
    versions its steps resolved to: after ``scale`` version 2 (x 3) loads, the same request is
    answered by it."""
    port, _, _ = server
    body = v2("x", [1, 4], [1.0, 2.0, 3.0, 4.0])

    def chain() -> list[float]:
        status, answer = post(port, "/v2/models/chain/infer", body)
        assert status == 200, answer
        return json.loads(answer)["outputs"][0]["data"]

    assert chain() == chain() == [2.0, 4.0, 6.0, 8.0]  # the second from the cache
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/v2/models/chain/stats")
    stats = json.loads(connection.getresponse().read())
    connection.close()
    assert stats["model_stats"][0]["inference_stats"]["cache_hit"]["count"] >= 1
    write_scaling(repository / "scale" / "2", 3.0)
    status, answer = post(port, "/v2/repository/models/scale/load", b"{}")
    assert status == 200, answer
    assert chain() == [3.0, 6.0, 9.0, 12.0]  # the load answered once the version serves
