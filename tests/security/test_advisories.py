"""The published attacks on Triton Inference Server, TorchServe and KServe (their CVEs and
advisories, 2023-2026), each class tried with variants on every face (REST V1, REST V2, gRPC)
against a real ``gelu-serve serve``: control by name and by override, log and trace files,
shared memory, model URLs, crafted numbers and nesting, names in logs and metrics, cancelled
streams, and where the faces listen by default. Each must end in a 4xx (gRPC: its status) with
the one error shape, and the server serves on. Where each class is decided: docs/security.md's
table of advisories."""

from __future__ import annotations

import ipaddress
import json
import math
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import psutil
import pytest

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from tests.helpers import DIGITS, put_parameters
from tests.servers import (
    ROOT,
    ServedFaces,
    environment,
    free_port,
    get,
    grpc_server,
    post,
    serve_command,
    tcp_connections,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.slow  # real server processes

ROW = DIGITS[0].tolist()
V1 = json.dumps({"instances": [ROW]}).encode()
V2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW}]}
# Model names that are no model's directory: they climb out, name a file, smuggle a byte.
NAMES = ["..", ".", "../digits-mlp", "digits-mlp/../digits-mlp", "/etc/passwd", "digits-mlp/1",
         "digits-mlp\x00", "digits-mlp\r\nX-Forged: 1", "digits-mlp\\..\\x", "~root",
         "%2e%2e", "a" * 5000]  # fmt: skip
# Model "names" that are where TorchServe and KServe would fetch a model from.
URLS = ["http://127.0.0.1:{port}/m.mar", "https://127.0.0.1:{port}/m", "file:///etc/passwd",
        "s3://bucket/model", "gs://bucket/model", "hdfs://127.0.0.1:{port}/m",
        "http://169.254.169.254/latest/meta-data/"]  # fmt: skip


@pytest.fixture(scope="module")
def faces(model_repository: Path) -> Iterator[ServedFaces]:
    """Both faces, every route open (Triton's default), models under explicit control."""
    with grpc_server(model_repository, GELU_MODEL_CONTROL_MODE="explicit",
                     GELU_LOAD_MODELS="*") as served:  # fmt: skip
        yield served


def error(body: bytes) -> str:
    """The one error shape's message."""
    payload = json.loads(body)
    assert list(payload) == ["error"], payload
    return str(payload["error"])


def rpc(faces: ServedFaces, method: str, request: Any) -> grpc.RpcError | Any:
    """A gRPC call's answer, or its error."""
    try:
        return getattr(faces.stub(), method)(request, timeout=10)
    except grpc.RpcError as refused:
        return refused


def serves_on(faces: ServedFaces) -> None:
    status, body = post(faces.http_port, "/v2/models/digits-mlp/infer", json.dumps(V2).encode())
    assert status == 200, body
    assert get(faces.http_port, "/v2/health/ready")[0] == 200


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_a_model_name_reaches_only_a_model_of_the_repository(
    faces: ServedFaces, model_repository: Path, name: str
) -> None:
    """Triton CVE-2023-31036 (the load API's relative path traversal), CVE-2025-23316 (the
    model name of the model control APIs, run by the Python backend) and CVE-2026-24208 (path
    traversal, denial of service): a name is looked up among the repository's own directories
    (``service.repository``), never joined to a path. Load, unload, inference, metadata,
    config and readiness, on both faces: 404 / NOT_FOUND naming only what was asked."""
    before, port = tree(model_repository), faces.http_port
    quoted = quote(name, safe="")
    for path in (f"/v2/repository/models/{quoted}/load", f"/v2/repository/models/{quoted}/unload",
                 f"/v2/models/{quoted}/infer", f"/v1/models/{quoted}:predict"):  # fmt: skip
        status, body = post(port, path, V1 if ":predict" in path else json.dumps(V2).encode())
        assert status == 404, (path, body)
        assert "/tmp" not in error(body) and str(model_repository) not in error(body)
    for path in (f"/v2/models/{quoted}", f"/v2/models/{quoted}/config"):
        assert get(port, path)[0] == 404, path
    request = pb.ModelInferRequest(model_name=name, raw_input_contents=[DIGITS[:1].tobytes()])
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    for method, message in [
        ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=name)),
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=name)),
        ("ModelInfer", request),
        ("ModelMetadata", pb.ModelMetadataRequest(name=name)),
        ("ModelConfig", pb.ModelConfigRequest(name=name)),
    ]:
        answer = rpc(faces, method, message)
        assert isinstance(answer, grpc.RpcError), method
        assert answer.code() == grpc.StatusCode.NOT_FOUND, (method, answer.details())
    assert tree(model_repository) == before
    serves_on(faces)


OVERRIDES = ["config", "file:1/model.onnx", "file:../../../{target}", "FILE:1/model.onnx",
             " config", "Config", "file:/{target}"]  # fmt: skip


@pytest.mark.parametrize("key", OVERRIDES)
def test_a_load_override_writes_nothing(
    faces: ServedFaces, model_repository: Path, tmp_path: Path, key: str
) -> None:
    """Triton CVE-2023-31036: a load's ``file:`` override with ``..`` wrote its contents
    outside the repository. Overrides are refused (``service.control``) in any spelling, over
    REST and gRPC: 400 / INVALID_ARGUMENT, no file written, in the repository or out of it."""
    target = tmp_path / "written"
    key = key.format(target=str(target).lstrip("/"))
    before = tree(model_repository)
    body = {"parameters": {key: "AAAA"}}
    status, answer = post(faces.http_port, "/v2/repository/models/digits-mlp/load",
                          json.dumps(body).encode())  # fmt: skip
    assert status == 400 and "is not supported" in error(answer), answer
    request = pb.RepositoryModelLoadRequest(model_name="digits-mlp")
    request.parameters[key].bytes_param = b"AAAA"
    refused = rpc(faces, "RepositoryModelLoad", request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
    assert tree(model_repository) == before and not target.exists()
    serves_on(faces)


@pytest.mark.parametrize("url", URLS)
def test_a_model_url_is_never_fetched(faces: ServedFaces, url: str) -> None:
    """TorchServe CVE-2023-43654 (ShellTorch's SSRF: a model registered from any URL) and
    CVE-2024-35198 (allowed_urls bypassed with ``..``); KServe's storage initializer (a URL's
    archive extracted, zip slip: TorchServe CVE-2023-48299's class). A model is a directory of
    the repository, loaded by its name: a URL as the name, or as a parameter, is 404 /
    NOT_FOUND, and nothing connects to the listener it names."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        url = url.format(port=listener.getsockname()[1])
        port = faces.http_port
        status, body = post(port, f"/v2/repository/models/{quote(url, safe='')}/load")
        assert status == 404, body
        refused = rpc(faces, "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=url))
        assert refused.code() == grpc.StatusCode.NOT_FOUND, refused
        for parameter in ("url", "model_url", "storage_uri", "storageUri"):
            body = json.dumps({"parameters": {parameter: url}}).encode()
            assert post(port, "/v2/repository/models/digits-mlp/load", body)[0] == 200
        with pytest.raises(TimeoutError):
            listener.accept()
    serves_on(faces)


LOG_FILES = ["{target}", "../../{target}", "/proc/self/fd/1", "/dev/stderr"]


@pytest.mark.parametrize("path", LOG_FILES)
def test_no_client_sets_where_logs_or_traces_are_written(
    faces: ServedFaces, tmp_path: Path, path: str
) -> None:
    """Triton CVE-2024-0087 (the logging API's ``log_file``: logs appended to any file) and
    CVE-2024-0100 (the tracing API's ``trace_file``: system files overwritten). Logs go to
    standard error and traces to OTLP (``service.logs``, ``service.trace_settings``): each
    setting is 400 / INVALID_ARGUMENT on both faces, globally and per model."""
    target = tmp_path / "log"
    value = path.format(target=target)
    port = faces.http_port
    status, body = post(port, "/v2/logging", json.dumps({"log_file": value}).encode())
    assert status == 400 and "log_file" in error(body)
    for route in ("/v2/trace/setting", "/v2/models/digits-mlp/trace/setting"):
        for key in ("trace_file", "log_file"):
            status, body = post(port, route, json.dumps({key: value}).encode())
            assert status == 400 and key in error(body), (route, body)
    logging = pb.LogSettingsRequest()
    logging.settings["log_file"].string_param = value
    assert rpc(faces, "LogSettings", logging).code() == grpc.StatusCode.INVALID_ARGUMENT
    tracing = pb.TraceSettingRequest()
    tracing.settings["trace_file"].value.append(value)
    assert rpc(faces, "TraceSetting", tracing).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not target.exists()
    serves_on(faces)


SHM = "/v2/systemsharedmemory"
SHM_ROUTES = [f"{SHM}/region/r/register", f"{SHM}/status", f"{SHM}/region/r/unregister",
              "/v2/cudasharedmemory/region/r/register",
              f"{SHM}/region/triton_python_backend_shm_region_1/register"]  # fmt: skip
SHM_METHODS = ["SystemSharedMemoryRegister", "SystemSharedMemoryStatus",
               "CudaSharedMemoryRegister", "SystemSharedMemoryUnregister"]  # fmt: skip
SHM_PARAMETERS = [
    {"shared_memory_region": "r", "shared_memory_byte_size": 256},
    {"shared_memory_region": "triton_python_backend_shm_region_1", "shared_memory_offset": 0},
    {"shared_memory_offset": 2**62, "shared_memory_byte_size": 2**62},
]


@pytest.mark.parametrize("parameters", SHM_PARAMETERS)
def test_no_shared_memory_is_offered_or_named(faces: ServedFaces, parameters: dict) -> None:
    """Triton CVE-2024-0088 (shared memory offsets: a write at any address) and
    CVE-2025-23319/23320/23334 (a region named after the Python backend's own, its offsets and
    sizes: out-of-bounds reads and writes). There is no shared memory: its routes are 404, its
    methods UNIMPLEMENTED, and an input or output naming a region is 400 / INVALID_ARGUMENT on
    both faces (``codecs.check_tensor_parameters``), not served from the body."""
    port = faces.http_port
    register = {"key": "/dev/shm/x", "offset": 2**62, "byte_size": 2**62}
    for route in SHM_ROUTES:
        status, body = post(port, route, json.dumps(register).encode())
        assert status == 404 and error(body), route
    channel = grpc.insecure_channel(faces.address)
    for method in SHM_METHODS:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as refused:
            call(b"\x0a\x01r", timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
    channel.close()
    for where in ("inputs", "outputs"):
        payload: dict[str, Any] = json.loads(json.dumps(V2))
        tensor = payload["inputs"][0]
        if where == "outputs":
            payload["outputs"] = [tensor := {"name": "probabilities"}]
        tensor["parameters"] = parameters
        status, answer = post(port, "/v2/models/digits-mlp/infer", json.dumps(payload).encode())
        assert status == 400 and "no shared memory" in error(answer), answer
        request = pb.ModelInferRequest(model_name="digits-mlp")
        request.raw_input_contents.append(DIGITS[:1].tobytes())
        named = request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        if where == "outputs":
            named = request.outputs.add(name="probabilities")
        put_parameters(named.parameters, parameters)
        refused = rpc(faces, "ModelInfer", request)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
    serves_on(faces)


DEEP = 100_000
NESTINGS = {
    "v2-data": ("/v2/models/digits-mlp/infer",
                '{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":%s}]}'),
    "v2-parameters": ("/v2/models/digits-mlp/infer", '{"inputs":[],"parameters":{"a":%s}}'),
    "v2-id": ("/v2/models/digits-mlp/infer", '{"id":%s,"inputs":[]}'),
    "v1": ("/v1/models/digits-mlp:predict", '{"instances":%s}'),
    "activation": ("/v1/activations/gelu", '{"data":%s}'),
    "load": ("/v2/repository/models/digits-mlp/load", '{"parameters":%s}'),
    "logging": ("/v2/logging", '{"log_info":%s}'),
    "trace": ("/v2/trace/setting", '{"trace_rate":%s}'),
}  # fmt: skip


@pytest.mark.parametrize("where", NESTINGS)
def test_deep_nesting_is_400(faces: ServedFaces, where: str) -> None:
    """Triton CVE-2025-23325 (uncontrolled recursion from a crafted input) and
    CVE-2025-23310/23311 (the stack overflowed by specially crafted inputs): JSON
    nested 100,000 deep, arrays and objects, in every body the service parses, is a 400 from
    the parser's depth limit (``service.codecs.loads``), never a recursion error."""
    path, template = NESTINGS[where]
    for nested in ("[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP):
        status, body = post(faces.http_port, path, (template % nested).encode())
        assert status == 400 and "depth" in error(body), (where, body)
    serves_on(faces)


# Numbers a C++ server multiplies, sums or casts: products that wrap int64 (to 0, to a small
# size), negative sizes and those past 2**63 (Triton CVE-2025-23323/23324/23326/23327: integer
# overflow and wraparound from crafted inputs).
WRAPS = [
    [65536, 65536, 65536, 65536],  # 2**64: wraps to 0
    [2**33, 2**31 + 1],  # 2**64 + 2**33: wraps to a small size
    [4294967296, 64],
    [-1, 64],
    [-(2**63), 64],
    [2**63 - 1, 1],
]


@pytest.mark.parametrize("shape", WRAPS, ids=[str(s) for s in WRAPS])
def test_a_shape_that_wraps_is_a_client_mistake(faces: ServedFaces, shape: list[int]) -> None:
    """The declared shape is checked once, with Python's integers (``codecs.check_shape``):
    V2 JSON, V2 binary with a ``binary_data_size`` computed as a C++ server would (wrapped to
    64 bits) and gRPC with raw contents of that size: 400 / INVALID_ARGUMENT."""
    port, wrapped = faces.http_port, (math.prod(shape) * 4) % 2**64  # as uint64 arithmetic
    entry = {"name": "input", "shape": shape, "datatype": "FP32"}
    status, body = post(port, "/v2/models/digits-mlp/infer",
                        json.dumps({"inputs": [{**entry, "data": []}]}).encode())  # fmt: skip
    assert status == 400, body
    error(body)
    size = min(wrapped, 1024)
    header = json.dumps({"inputs": [{**entry, "parameters": {"binary_data_size": size}}]})
    status, body = post(port, "/v2/models/digits-mlp/infer", header.encode() + bytes(size),
                        {"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    assert status == 400, body
    error(body)
    request = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[bytes(size)])
    request.inputs.add(name="input", datatype="FP32", shape=shape)
    assert rpc(faces, "ModelInfer", request).code() == grpc.StatusCode.INVALID_ARGUMENT
    serves_on(faces)


@pytest.mark.parametrize(
    "length", ["-1", "99999999999999999999999", "18446744073709551616", "0x10", "1e3", "0"]
)
def test_a_header_length_past_its_type_is_a_client_mistake(faces: ServedFaces, length: str) -> None:
    """The binary extension's ``Inference-Header-Content-Length`` (Triton CVE-2025-23327's
    class): negative, past 2**64, or not decimal, it is a 400 naming the header, or a 413
    naming the limit it passes."""
    status, body = post(faces.http_port, "/v2/models/digits-mlp/infer", b"{}" + bytes(8),
                        {"Inference-Header-Content-Length": length})  # fmt: skip
    named = {400: "Inference-Header-Content-Length", 413: "GELU_MAX_BODY_BYTES"}
    assert status in named and named[status] in error(body), body
    serves_on(faces)


EMPTY_SHAPES = [[0, 64], [1, 0], [0, 0], [0]]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=[str(s) for s in EMPTY_SHAPES])
def test_empty_tensors_are_answered_never_crash(faces: ServedFaces, shape: list[int]) -> None:
    """Triton CVE-2025-23321 (a divide by zero from an invalid request) and CVE-2025-23331 (an
    allocation of a size the request chose): zero-sized tensors, a classification of 0 classes,
    on V1, V2 and gRPC and the activation route (where ``?shape=0,4`` was a 500): a 400 for a
    model (an empty batch or a wrong shape), an empty answer for an activation."""
    port, dims = faces.http_port, ",".join(map(str, shape))
    entry = {"name": "input", "shape": shape, "datatype": "FP32", "data": []}
    status, body = post(
        port, "/v2/models/digits-mlp/infer", json.dumps({"inputs": [entry]}).encode()
    )
    assert status == 400, body
    error(body)
    request = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[b""])
    request.inputs.add(name="input", datatype="FP32", shape=shape)
    assert rpc(faces, "ModelInfer", request).code() == grpc.StatusCode.INVALID_ARGUMENT
    instances = json.dumps({"instances": [[]] * shape[0] if len(shape) > 1 else []}).encode()
    status, body = post(port, "/v1/models/digits-mlp:predict", instances)
    assert status == 400, body
    status, body = post(port, f"/v1/activations/gelu?shape={dims}", b"",
                        {"Content-Type": "application/octet-stream"})  # fmt: skip
    assert status == 200 and body == b"", body
    classes = {**V2, "outputs": [{"name": "probabilities", "parameters": {"classification": 0}}]}
    status, body = post(port, "/v2/models/digits-mlp/infer", json.dumps(classes).encode())
    assert status == 400 and "classification" in error(body)
    serves_on(faces)


def test_names_from_clients_neither_forge_log_lines_nor_grow_metrics(
    model_repository: Path,
) -> None:
    """Log injection (CWE-117) and label cardinality (CWE-770) with the names a client picks:
    model names, versions, activation names, request ids with CR LF in them, on both faces,
    make no log line of their own and no series in ``/metrics`` (a 404 is no label)."""
    forged = "FORGED-LINE"
    with grpc_server(model_repository, GELU_MODEL_CONTROL_MODE="explicit",
                     GELU_LOAD_MODELS="*") as served:  # fmt: skip
        port = served.http_port
        for i in range(20):
            name = quote(f"m{i}\r\n{forged} {i}", safe="")
            post(port, f"/v2/models/{name}/infer", json.dumps(V2).encode())
            post(port, f"/v2/models/digits-mlp/versions/{900 + i}/infer", json.dumps(V2).encode())
            post(port, f"/v1/activations/{name}", b'{"data": [1.0]}')
            post(port, f"/v2/repository/models/{name}/load")
            body = json.dumps({**V2, "id": f"x\r\n{forged} id {i}"}).encode()
            post(port, "/v2/models/digits-mlp/infer", body, {"X-Request-ID": f"r{i}"})
            request = pb.ModelInferRequest(model_name=f"g{i}\n{forged} grpc {i}")
            request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
            request.raw_input_contents.append(DIGITS[:1].tobytes())
            rpc(served, "ModelInfer", request)
            rpc(served, "ModelMetadata", pb.ModelMetadataRequest(name=f"g{i}\r\n{forged}"))
        exposition = get(port, "/metrics")[1].decode()
        process = served.process
    assert forged not in exposition and 'version="90' not in exposition
    lines = process.output.splitlines()  # type: ignore[attr-defined]
    assert not [line for line in lines if line.startswith(forged)], lines[-20:]


def test_cancelled_streams_leave_nothing_behind(faces: ServedFaces) -> None:
    """Triton CVE-2025-23322 (streams cancelled with requests in flight: a double free):
    ModelStreamInfer calls cancelled after their first answers, 30 in a row, leave no request
    counted in flight or pending, and the server serves on."""
    request = pb.ModelInferRequest(model_name="digits-mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(DIGITS[:1].tobytes())
    release = threading.Event()

    def requests() -> Iterator[pb.ModelInferRequest]:
        yield from [request] * 20
        release.wait(10)

    with grpc.insecure_channel(faces.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(30):
            call = stub.ModelStreamInfer(requests())
            for answered, _response in enumerate(call, 1):
                if answered == 3:
                    break
            call.cancel()
    release.set()

    def settled() -> bool:
        text = get(faces.http_port, "/metrics")[1].decode()
        counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("gelu_inference_pending_requests",
                                      "gelu_inference_in_flight_requests"))]  # fmt: skip
        return bool(counts) and not any(counts)

    wait_until(settled, timeout=10, what="requests of cancelled streams still counted")
    serves_on(faces)


def test_both_faces_listen_on_loopback_by_default(model_repository: Path) -> None:
    """TorchServe CVE-2024-35199 (its gRPC ports bound to every interface by default) and
    ShellTorch (CVE-2023-43654: the management API open to the network by default):
    ``gelu-serve serve`` without ``--host`` binds HTTP and gRPC to 127.0.0.1 alone."""
    http_port, grpc_port = free_port(), free_port()
    env = environment(model_repository, {"GELU_GRPC_PORT": str(grpc_port)})
    process = subprocess.Popen(
        serve_command(http_port), cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        wait_ready(http_port, process)
        listening = {
            (c.laddr.ip, c.laddr.port)
            for c in tcp_connections(psutil.Process(process.pid))
            if c.status == psutil.CONN_LISTEN
        }
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert {port for _, port in listening} >= {http_port, grpc_port}, listening
    # gRPC's socket is dual-stack: 127.0.0.1 shows as ::ffff:127.0.0.1
    addresses = {ipaddress.ip_address(ip) for ip, _ in listening}
    assert {str(getattr(a, "ipv4_mapped", None) or a) for a in addresses} == {"127.0.0.1"}
