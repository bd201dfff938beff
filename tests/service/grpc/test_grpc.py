"""The gRPC face against a real `gelu-serve serve`: tritonclient.grpc, kserve's gRPC client,
grpcurl through reflection, gRPC health checking, our own stub with typed contents; the same
answers as HTTP, bit for bit, and batches shared with HTTP."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.proc import pin_tree
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import MAX_DETAILS_CHARS
from tests.helpers import DIGITS
from tests.service.rest.test_limits import get, running
from tests.service.rest.test_server import free_port
from tests.service.rest.test_v2 import binary_request

pytestmark = pytest.mark.slow  # real server processes
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


class Server:
    def __init__(self, http_port: int, grpc_port: int, process: subprocess.Popen[str]) -> None:
        self.http_port, self.grpc_port, self.process = http_port, grpc_port, process
        self.address = f"127.0.0.1:{grpc_port}"

    def stub(self) -> pb_grpc.GRPCInferenceServiceStub:
        return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.address))

    def http_post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        return response.status, response.read()


def grpc_server(repository: Path, **env: str) -> Iterator[Server]:
    grpc_port = free_port()
    settings = {"GELU_GRPC_PORT": str(grpc_port), "GELU_MAX_BODY_BYTES": str(1 << 20), **env}
    with running(repository, **settings) as (port, process):
        yield Server(port, grpc_port, process)


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[Server]:
    # Explicit mode with every model loaded, so the repository methods can be exercised.
    yield from grpc_server(
        model_repository, GELU_MODEL_CONTROL_MODE="explicit", GELU_LOAD_MODELS="*"
    )


def test_tritonclient_every_method(server: Server) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits-mlp") and client.is_model_ready("digits-mlp", "1")
    assert not client.is_model_ready("nope")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "gelu-serve" and "classification" in metadata["extensions"]
    model = client.get_model_metadata("digits-mlp", as_json=True)
    assert model["versions"] == ["1", "2"]
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    config = client.get_model_config("digits-mlp", as_json=True)["config"]
    assert config["max_batch_size"] == 256 and config["input"][0]["data_type"] == "TYPE_FP32"

    x = DIGITS[:4]
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    wanted = [grpcclient.InferRequestedOutput("probabilities"),
              grpcclient.InferRequestedOutput("logits", class_count=3)]  # fmt: skip
    result = client.infer("digits-mlp", [tensor], outputs=wanted, request_id="r1")
    assert result.get_response().id == "r1" and result.get_response().model_version == "2"
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (4, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, rtol=1e-5)
    top = result.as_numpy("logits")
    assert top.shape == (4, 3) and top[0, 0].decode().count(":") == 2

    stats = client.get_inference_statistics("digits-mlp", "2", as_json=True)["model_stats"]
    assert int(stats[0]["inference_count"]) >= 4
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "digits-mlp", "version": "2", "state": "READY"} in index
    client.unload_model("digits-mlp-tanh")
    assert not client.is_model_ready("digits-mlp-tanh")
    client.load_model("digits-mlp-tanh")
    assert client.is_model_ready("digits-mlp-tanh")
    with pytest.raises(InferenceServerException, match="'config' is not supported") as refused:
        client.load_model("digits-mlp-tanh", config='{"max_batch_size": 8}')
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_model_ready("digits-mlp-tanh")
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", [tensor])


def typed_request(x: np.ndarray, model: str = "digits-mlp") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def raw_request(x: np.ndarray, model: str = "digits-mlp") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


def test_typed_and_raw_contents_answer_in_kind_and_agree(server: Server) -> None:
    stub, x = server.stub(), DIGITS[:3]
    typed = stub.ModelInfer(typed_request(x))
    raw = stub.ModelInfer(raw_request(x))
    assert not typed.raw_output_contents and len(raw.raw_output_contents) == 2
    for i, output in enumerate(typed.outputs):
        assert raw.outputs[i].name == output.name and list(output.shape) == [3, 10]
        from_raw = np.frombuffer(raw.raw_output_contents[i], "<f4")
        np.testing.assert_array_equal(np.array(output.contents.fp32_contents, "<f4"), from_raw)


def test_grpc_and_http_answers_are_bit_identical(server: Server) -> None:
    x = DIGITS[5:13]
    raw = server.stub().ModelInfer(raw_request(x))
    content, headers = binary_request(
        x, [{"name": o.name, "parameters": {"binary_data": True}} for o in raw.outputs]
    )
    status, body = server.http_post("/v2/models/digits-mlp/infer", content, headers)
    assert status == 200
    header_end = body.index(b"]}") + 2  # the JSON header, then each output's bytes
    assert body[header_end:] == b"".join(raw.raw_output_contents)
    header = json.loads(body[:header_end])
    assert [o["name"] for o in header["outputs"]] == [o.name for o in raw.outputs]


KSERVE_CLIENT = """
import asyncio, sys
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

async def main(address):
    client = InferenceGRPCClient(address)
    try:
        assert await client.is_server_live() and await client.is_server_ready()
        assert await client.is_model_ready("digits-mlp")
        x = np.asarray(eval(sys.argv[2]), dtype=np.float32)
        tensor = InferInput("input", list(x.shape), "FP32", data=x)
        response = await client.infer(InferRequest("digits-mlp", [tensor], request_id="k1"))
        assert response.id == "k1", response.id
        probabilities = next(o for o in response.outputs if o.name == "probabilities")
        print(probabilities.as_numpy().tolist())
    finally:
        await client.close()

asyncio.run(main(sys.argv[1]))
"""


def test_kserve_grpc_client(server: Server) -> None:
    """kserve's InferenceGRPCClient, unmodified (in its own process: kserve and tritonclient
    both register the protocol's names in protobuf's default pool)."""
    x = DIGITS[:2]
    done = subprocess.run(
        [sys.executable, "-c", KSERVE_CLIENT, server.address, repr(x.tolist())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    probabilities = np.array(json.loads(done.stdout), dtype=np.float32)
    expected = server.stub().ModelInfer(raw_request(x))
    index = [o.name for o in expected.outputs].index("probabilities")
    np.testing.assert_array_equal(
        probabilities.ravel(), np.frombuffer(expected.raw_output_contents[index], "<f4")
    )


def test_grpcurl_through_reflection(server: Server) -> None:
    def grpcurl(*args: str) -> str:
        done = subprocess.run(
            [GRPCURL, "-plaintext", *args], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    services = grpcurl(server.address, "list").split()
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(services)
    assert "rpc ModelInfer" in grpcurl(server.address, "describe", "inference.GRPCInferenceService")
    assert json.loads(grpcurl(server.address, "grpc.health.v1.Health/Check")) == {
        "status": "SERVING"
    }
    body = {
        "model_name": "digits-mlp",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                    "contents": {"fp32_contents": DIGITS[0].tolist()}}],
    }  # fmt: skip
    answer = json.loads(
        grpcurl("-d", json.dumps(body), server.address, "inference.GRPCInferenceService/ModelInfer")
    )
    probabilities = next(o for o in answer["outputs"] if o["name"] == "probabilities")
    contents = probabilities["contents"]  # grpcurl prints proto names or JSON names
    assert len(contents.get("fp32_contents", contents.get("fp32Contents", []))) == 10


BAD = [
    (lambda: pb.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND, "unknown model"),
    (lambda: typed_request(DIGITS[:1, :10]), grpc.StatusCode.INVALID_ARGUMENT, "does not match"),
    (lambda: _with(typed_request(DIGITS[:2]), shape=[3, 64]), grpc.StatusCode.INVALID_ARGUMENT,
     "contents hold 128 values but shape [3, 64] needs 192"),
    (lambda: _with(raw_request(DIGITS[:2]), datatype="FP64"), grpc.StatusCode.INVALID_ARGUMENT,
     "bytes of data"),
    (lambda: _with(typed_request(DIGITS[:1]), datatype="BANANA"),
     grpc.StatusCode.INVALID_ARGUMENT, "datatype 'BANANA'"),
    (lambda: _raw_count(raw_request(DIGITS[:1])), grpc.StatusCode.INVALID_ARGUMENT,
     "raw_input_contents holds 2 entries for 1 inputs"),
    (lambda: _typed_too(raw_request(DIGITS[:1])), grpc.StatusCode.INVALID_ARGUMENT,
     "contents must be empty when raw_input_contents is used"),
    (lambda: _param(typed_request(DIGITS[:1]), "priority", -1), grpc.StatusCode.INVALID_ARGUMENT,
     "'priority' must be an integer"),
    (lambda: _param(typed_request(DIGITS[:1]), "timeout", -1), grpc.StatusCode.INVALID_ARGUMENT,
     "'timeout' must be an integer"),
    (lambda: typed_request(DIGITS[:300]), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "above the maximum of 256"),
    (lambda: raw_request(np.zeros((8192, 64), np.float32)), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "larger than max"),
    (lambda: _with(typed_request(DIGITS[:1]), shape=[1] * 40), grpc.StatusCode.INVALID_ARGUMENT,
     "at most 32"),
]  # fmt: skip


def _with(request: pb.ModelInferRequest, **changes) -> pb.ModelInferRequest:
    tensor = request.inputs[0]
    if "shape" in changes:
        del tensor.shape[:]
        tensor.shape.extend(changes["shape"])
    if "datatype" in changes:
        tensor.datatype = changes["datatype"]
    if "name" in changes:
        tensor.name = changes["name"]
    return request


def _raw_count(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.raw_input_contents.append(b"")
    return request


def _typed_too(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.inputs[0].contents.fp32_contents.extend(DIGITS[0].tolist())
    return request


def _param(request: pb.ModelInferRequest, key: str, value: int) -> pb.ModelInferRequest:
    request.parameters[key].int64_param = value
    return request


@pytest.mark.parametrize(("build", "code", "needle"), BAD)
def test_bad_requests_get_the_right_status_and_the_server_keeps_serving(
    server: Server, build, code, needle: str
) -> None:
    stub = server.stub()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(build())
    assert caught.value.code() == code, caught.value.details()
    assert needle in caught.value.details()
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).raw_output_contents) == 2


@pytest.mark.parametrize("name", ["x" * 100_000, "\U0001f600" * 100_000])
def test_a_long_string_a_client_sent_is_cut_from_the_message_to_fit_its_trailer(
    server: Server, name: str
) -> None:
    """Echoed whole, a 10 KB name made the message's trailer larger than a client accepts:
    RESOURCE_EXHAUSTED "Stream removed" instead of the error. A 4-byte character is the worst
    case: 12 bytes percent-encoded."""
    for request in (
        raw_request(DIGITS[:1], model=name),
        _with(typed_request(DIGITS[:1]), name=name),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            server.stub().ModelInfer(request)
        details = caught.value.details()
        assert caught.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
        assert details.startswith(("unknown model '", "unknown input '")), details[:100]
        assert "characters cut)" in details and len(details) <= MAX_DETAILS_CHARS


def test_readme_quotes_the_cut() -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "endpoints.md").read_text()
    assert f"longer than {MAX_DETAILS_CHARS} characters" in readme


def test_connections_and_calls_beyond_the_limits_are_refused(model_repository: Path) -> None:
    """GELU_MAX_CONNECTIONS bounds gRPC's connections and its calls in flight (twice as many:
    streams have a share of their own), as HTTP's connections: before, a client opening
    connections used up the process's file descriptors and HTTP stopped answering too. A
    silent connection is closed after GELU_HEADER_TIMEOUT_SECONDS, an idle one after
    GELU_KEEP_ALIVE_SECONDS (GOAWAY), and a call whose message does not come ends after
    GELU_BODY_TIMEOUT_SECONDS."""
    env = {
        "GELU_MAX_CONNECTIONS": "2",
        "GELU_MAX_QUEUE_DELAY_US": "1500000",  # a call waits this long for company
        # Wide enough that a busy machine's delays do not let connections or calls go early.
        "GELU_KEEP_ALIVE_SECONDS": "5",
        "GELU_HEADER_TIMEOUT_SECONDS": "1",
        "GELU_BODY_TIMEOUT_SECONDS": "3",
    }
    for server in grpc_server(model_repository, **env):
        # Calls: four in flight on one connection, waiting for company; a fifth is refused.
        assert asyncio.run(_one_call_past(server.address, 4)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED, [2] * 4
        )  # fmt: skip
        # Connections: two held, once the call's is let go; a third refused until they have
        # been idle long enough to be let go too.
        held = [_connected(server.address) for _ in range(2)]
        # Waiting for the second can outlast the first's keep-alive: a call on each now holds
        # both connections fresh (a channel whose connection was let go connects again).
        assert all(_live(channel) is None for channel in held)
        assert _live(_channel(server.address)) == grpc.StatusCode.UNAVAILABLE
        assert get(server.http_port, "/v2/health/live")[0] == 200  # HTTP keeps its own
        channel = _connected(server.address)
        for idle in held:
            idle.close()
        # Four calls whose message never comes hold the calls in flight, until they are ended.
        with _stalled_calls(server.grpc_port, 4) as stalled:
            assert _live(channel) == grpc.StatusCode.RESOURCE_EXHAUSTED
            _connected(server.address, channel)
            assert stalled.recv(65536)  # their ends (the server's SETTINGS came before)
        # A connection that never finishes its handshake is closed.
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as silent:
            while silent.recv(65536):  # the server's SETTINGS, then the end
                pass


@contextmanager
def _stalled_calls(port: int, calls: int) -> Iterator[socket.socket]:
    """A connection with ``calls`` ModelInfer calls whose message is announced, 100 bytes long,
    and never sent: HTTP/2 frames written by hand (HPACK literals, no Huffman)."""

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return (
            len(payload).to_bytes(3, "big")
            + bytes([kind, flags])
            + stream.to_bytes(4, "big")
            + payload
        )

    def literal(name: str, value: str) -> bytes:
        return bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()

    headers = b"".join(
        literal(name, value)
        for name, value in [
            (":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while True:  # until a connection is let in: the server's SETTINGS come
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(4, 1, 0))
        if sock.recv(65536):
            break
        sock.close()
        assert time.monotonic() < deadline, "no connection was let in"
        time.sleep(0.5)
    with sock:
        for stream in range(1, 2 * calls, 2):
            announced = b"\x00" + (100).to_bytes(4, "big") + b"\x0a"  # 1 of 100 bytes
            sock.sendall(frame(1, 4, stream, headers) + frame(0, 0, stream, announced))
        time.sleep(0.3)
        yield sock


async def _one_call_past(address: str, calls: int) -> tuple[grpc.StatusCode, list[int]]:
    """``calls`` calls at once, then one more; its status, and the outputs of the others."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        first = [asyncio.ensure_future(stub.ModelInfer(raw_request(DIGITS[:1])))
                 for _ in range(calls)]  # fmt: skip
        await asyncio.sleep(0.3)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(raw_request(DIGITS[:1]))
        return caught.value.code(), [len((await call).outputs) for call in first]


def _channel(address: str) -> grpc.Channel:
    """A channel with a connection of its own (not shared with the process's other channels)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def _connected(address: str, channel: grpc.Channel | None = None) -> grpc.Channel:
    """``channel``, else a new one of its own each try, once it has answered, within 30 s (grpc
    lets an idle connection go one to two keep-alives after its last call)."""
    deadline = time.monotonic() + 30
    while _live(answered := channel or _channel(address)) is not None:
        assert time.monotonic() < deadline, "no call was let in"
        time.sleep(0.5)
    return answered


def _live(channel: grpc.Channel) -> grpc.StatusCode | None:
    """ServerLive's error code on ``channel``, None when it answers."""
    try:
        assert (
            pb_grpc.GRPCInferenceServiceStub(channel)
            .ServerLive(pb.ServerLiveRequest(), timeout=3)
            .live
        )
    except grpc.RpcError as exc:
        return exc.code()
    return None


def test_unimplemented_methods_say_so(server: Server) -> None:
    channel = grpc.insecure_channel(server.address)
    method = channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryStatus")
    with pytest.raises(grpc.RpcError) as caught:
        method(b"")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_metrics_count_grpc_calls(server: Server) -> None:
    server.stub().ModelInfer(raw_request(DIGITS[:1]))
    with pytest.raises(grpc.RpcError):
        server.stub().ModelInfer(raw_request(DIGITS[:1], model="nope"))
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request("GET", "/metrics")
    metrics = connection.getresponse().read().decode()
    lines = [line for line in metrics.splitlines() if 'endpoint="grpc:ModelInfer"' in line]
    assert any('model="digits-mlp"' in x and 'version="2"' in x and 'code="200"' in x
               for x in lines)  # fmt: skip
    assert any('model=""' in x and 'code="404"' in x for x in lines)  # "nope" is no label


def _runs_of_digits_mlp(server: Server, *calls: tuple[Callable[..., object], tuple]) -> list[int]:
    """Makes the calls at once, each on its own thread; then the latest digits-mlp's inference
    and execution counts, and the size of each batch it has run, from ModelStatistics."""
    threads = [threading.Thread(target=call, args=args) for call, args in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = server.stub().ModelStatistics(pb.ModelStatisticsRequest(name="digits-mlp"))
    (latest,) = [s for s in stats.model_stats if s.version == "2"]
    sizes = sorted(b.batch_size for b in latest.batch_stats)
    return [latest.inference_count, latest.execution_count, *sizes]


def test_grpc_requests_batch_alone_and_with_http(model_repository: Path) -> None:
    """With batches on a worker thread and a 300 ms queue delay, one HTTP and one gRPC request
    sent together run as one batch of two, and then eight gRPC calls sent together as one
    batch of eight."""
    env = {"GELU_INLINE_MAX_US": "0", "GELU_MAX_QUEUE_DELAY_US": "300000"}
    for server in grpc_server(model_repository, **env):
        x, stub = DIGITS[:1], server.stub()
        content, headers = binary_request(x)
        http = (server.http_post, ("/v2/models/digits-mlp/infer", content, headers))
        grpc_call = (stub.ModelInfer, (raw_request(x),))
        assert _runs_of_digits_mlp(server, grpc_call, http) == [2, 1, 2]  # one run for both
        assert _runs_of_digits_mlp(server, *[grpc_call] * 8) == [10, 2, 2, 8]


async def _calls_at_once(address: str, calls: int, times: int) -> None:
    """``calls`` ModelInfer calls at once on one channel, ``times`` times over."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = raw_request(DIGITS[:1])
        for _ in range(times):
            await asyncio.gather(*(stub.ModelInfer(request) for _ in range(calls)))


def test_concurrent_grpc_calls_share_runs_with_the_default_settings(
    model_repository: Path,
) -> None:
    """With the defaults (small batches on the event loop, no queue delay), calls in flight
    together on one channel share runs, though grpcio's server hands them over one at a time:
    64 at once, 20 times, take fewer runs than half the calls (before, each call was a run of
    its own; now 60-80 runs in all). The server has a core of its own, as each of
    `--workers N` on N cores, and the client the others. A busy process on the server's core
    takes the turns grpcio's threads need: then 600-950 runs."""
    cpus = os.sched_getaffinity(0)
    core = min(cpus)
    for server in grpc_server(model_repository):
        pin_tree(server.process.pid, {core})
        os.sched_setaffinity(0, cpus - {core} or cpus)
        try:
            asyncio.run(_calls_at_once(server.address, 64, 20))
        finally:
            os.sched_setaffinity(0, cpus)
        inferences, executions, *_ = _runs_of_digits_mlp(server)
        assert inferences == 1280
        assert executions < inferences / 2


def test_health_turns_not_serving_when_draining(model_repository: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    for server in grpc_server(model_repository, GELU_DRAIN_SECONDS="3"):
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address))
        check = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
        assert health.Check(check).status == health_pb2.HealthCheckResponse.SERVING
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert health.Check(check).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert len(server.stub().ModelInfer(raw_request(DIGITS[:1])).outputs) == 2  # serving
        assert server.process.wait(timeout=30) == 0


def test_readme_grpc_examples_work_as_written(server: Server) -> None:
    """Each ```py block of docs/endpoints.md and each grpcurl line, against the real server."""
    import re

    readme = (Path(__file__).resolve().parents[3] / "docs" / "endpoints.md").read_text()
    local = "localhost:8001"
    blocks = re.findall(r"```py\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 3 and all(local in b for b in blocks)
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block.replace(local, server.address)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        numbers = re.findall(r"\d+\.\d+(?:e[-+]?\d+)?", done.stdout)
        assert np.allclose(np.array(numbers, float).reshape(2, 10).sum(axis=1), 1, atol=1e-4)
    shell = "\n".join(re.findall(r"```shell\n(.*?)```", readme, flags=re.S))
    lines = [line for line in shell.splitlines() if line.startswith("grpcurl ")]
    assert len(lines) == 4
    for line in lines:
        command = line.replace(local, server.address).replace("grpcurl", GRPCURL, 1)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
