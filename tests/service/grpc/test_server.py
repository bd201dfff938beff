"""The gRPC face (``GrpcServer``). In process, its envelope: every method of every service it
serves (the protocol's, health's, reflection's, enumerated from their descriptors) checks
credentials and the message bound when called directly, as Ray Serve's gRPC proxy calls them
(issue 62 item 6); streams are held to their share per connection and in all (item 10); a
stream's window. Against a real `gelu-serve serve` (slow): tritonclient.grpc, kserve's gRPC
client, grpcurl through reflection, gRPC health checking, our own stub with typed contents;
the same answers as HTTP, bit for bit, and batches shared with HTTP; Triton's ModelStreamInfer,
many requests on one call answered in the order sent, failures in band (or ending the call,
when asked), a client that stops reading holding no more than the stream's window."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from bench.proc import pin_tree
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import CLIENT_CLOSED_REQUEST, DeadlineExceededError
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import (
    HEALTH_DESCRIPTOR,
    MAX_DETAILS_CHARS,
    REFLECTION_DESCRIPTOR,
    ROUTE_CLASSES,
    SERVICE,
    SERVICE_DESCRIPTOR,
    STREAM_WINDOW,
    Dispatch,
    GrpcServer,
    InferenceServicer,
    Quiet,
    Streams,
    TooManyStreamsError,
    Window,
)
from tests.helpers import DIGITS, binary_request, until
from tests.servers import ServedFaces, get, grpc_server, wait_until
from tests.service.grpc.messages import BAD, changed, raw_request, runs_of_digits_mlp, typed_request

SERVICES = (SERVICE_DESCRIPTOR, HEALTH_DESCRIPTOR, REFLECTION_DESCRIPTOR)
METHODS = [(service, method) for service in SERVICES for method in service.methods]
# Every class behind its own key, all in one header: another class's key is PERMISSION_DENIED.
KEYS = {name: f"the-key-of-class-{name}" for name in set(ROUTE_CLASSES.values())}
RESTRICTED = ";".join(f"{name}:x-api-key={key}" for name, key in KEYS.items())
MAX_BYTES = 4096


class Aborted(grpc.aio.AbortError):
    """What the fake context's ``abort`` raises, as grpcio's raises AbortError."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Context:
    """What a servicer's method needs of a gRPC context (grpcio's, or Ray's proxy's)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = (), peer: str = "ipv4:1:1") -> None:
        self.metadata, self._peer = metadata, peer
        self.trailing: Any = ()
        self.written: list[Any] = []
        self.ended: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.ended = code
        raise Aborted(code, details)

    async def write(self, message: Any) -> None:
        self.written.append(message)

    def peer(self) -> str:
        return self._peer

    def code(self) -> grpc.StatusCode | None:
        return self.ended


@pytest.fixture
def settings(settings_factory) -> Any:
    """Every route class restricted, and small messages."""
    return settings_factory(restricted_api=RESTRICTED, max_body_bytes=MAX_BYTES)


def _server(settings: Any) -> GrpcServer:
    """A gRPC face (bound, not started; built in the test's event loop, as grpcio's asyncio
    server must be) over a core (not started: nothing a refused call needs)."""
    core = DataPlane(settings)
    return GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")


def _message(method: MethodDescriptor, size: int = 0) -> Any:
    """A request of ``method``'s type, padded past ``size`` bytes with an unknown field (which
    every message type keeps and counts)."""
    message = GetMessageClass(method.input_type)()
    if size:
        field = bytes([0xC2, 0x3E])  # field 1000, length-delimited: in none of the protocols
        length, pad = bytearray(), size
        while pad >= 0x80:
            length.append(pad & 0x7F | 0x80)
            pad >>= 7
        message.MergeFromString(field + bytes([*length, pad]) + b"x" * size)
        assert message.ByteSize() > size
    return message


async def _stream_of(message: Any) -> AsyncIterator[Any]:
    yield message


async def _served(server: GrpcServer, service: ServiceDescriptor, method: Any, request: Any,
                  context: Context) -> Any:  # fmt: skip
    """Call the method registered for ``service``'s ``method`` directly, as Ray's proxy does."""
    behavior = getattr(server.servicers[service.full_name], method.name)
    if method.client_streaming:
        return await behavior(_stream_of(request), context)
    return await behavior(request, context)


async def _refused(call: Any) -> Aborted:
    """How ``call`` was refused (a call served instead fails the test, within 10 s: a stream
    let in would wait for its client)."""
    with pytest.raises(Aborted) as refused:
        await asyncio.wait_for(call, 10)
    return refused.value


@pytest.mark.anyio
@pytest.mark.parametrize(("service", "method"), METHODS, ids=[m.full_name for _, m in METHODS])
async def test_every_method_checks_credentials_and_the_bound_when_called_directly(
    settings: Any, service: ServiceDescriptor, method: MethodDescriptor
) -> None:
    """No credentials: UNAUTHENTICATED; another class's key: PERMISSION_DENIED; its own key
    with a message above GELU_MAX_BODY_BYTES: RESOURCE_EXHAUSTED, as grpcio's server answers.
    Before issue 62, credentials lived in an interceptor alone, and Ray's proxy, calling the
    methods, served load, unload, trace, logging and inference to anyone."""
    server = _server(settings)
    route_class = ROUTE_CLASSES[method.name]
    other = next(key for name, key in KEYS.items() if name != route_class)
    request = _message(method)
    wrong = (("x-api-key", other),)
    for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                           (wrong, grpc.StatusCode.PERMISSION_DENIED)):  # fmt: skip
        refused = await _refused(_served(server, service, method, request, Context(metadata)))
        assert refused.code == code, refused
        assert f"{route_class} routes are restricted" in refused.details
    own = (("x-api-key", KEYS[route_class]),)
    large = _message(method, MAX_BYTES)
    refused = await _refused(_served(server, service, method, large, Context(own)))
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    assert "larger than max" in refused.details


@pytest.mark.anyio
async def test_a_call_with_its_key_is_served_directly(settings: Any) -> None:
    """The other side of the test above: the envelope lets a right call through."""
    server = _server(settings)
    servicer = server.servicers[SERVICE_DESCRIPTOR.full_name]
    context = Context((("x-api-key", KEYS["health"]), ("x-request-id", "abc")))
    reply = await servicer.ServerLive(_message(SERVICE_DESCRIPTOR.methods[0]), context)
    assert reply.live and context.trailing == (("x-request-id", "abc"),)
    health = server.servicers[HEALTH_DESCRIPTOR.full_name]
    request = GetMessageClass(HEALTH_DESCRIPTOR.methods_by_name["Check"].input_type)()
    request.service = "no-such-service"
    refused = await _refused(health.Check(request, Context((("x-api-key", KEYS["health"]),))))
    assert refused.code == grpc.StatusCode.NOT_FOUND  # health's own answer, through it


@pytest.mark.anyio
async def test_ray_reaches_the_stream_through_the_envelope(settings: Any) -> None:
    """Ray's replica iterates ``stream_answers`` itself (deploy/ray/serve_app.py)."""
    server = _server(settings)
    servicer = server.servicers[SERVICE_DESCRIPTOR.full_name]
    assert isinstance(servicer, InferenceServicer)
    method = SERVICE_DESCRIPTOR.methods_by_name["ModelStreamInfer"]

    async def answers() -> list[Any]:
        stream = servicer.stream_answers(_stream_of(_message(method)), Context())
        return [answer async for answer in stream]

    assert (await _refused(answers())).code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.anyio
async def test_the_dispatch_classifies_by_the_exact_registered_path(settings: Any) -> None:
    """gRPC-Go CVE-2026-33186: a path without its leading slash, or with extra segments, was
    routed while the authorisation matched another string. Here only an exact method path
    is classed (anything else has no handler: UNIMPLEMENTED), and the envelope, where the method
    runs, classes by the method a handler was built for."""
    dispatch = _server(settings).dispatch
    assert isinstance(dispatch, Dispatch)
    load = "/inference.GRPCInferenceService/RepositoryModelLoad"
    assert dispatch.methods[load] == ("inference.GRPCInferenceService", "RepositoryModelLoad")
    for variant in (load[1:], "/x" + load, load + "/", "/" + load, load.lower()):
        assert variant not in dispatch.methods
        details = SimpleNamespace(method=variant, invocation_metadata=())
        assert dispatch.service(details) is None
    assert len(dispatch.methods) == len(dispatch.handlers) == len(METHODS)


def test_streams_are_held_per_connection_and_in_all() -> None:
    streams = Streams(per_connection=2, total=3)
    streams.take("a")
    streams.take("a")
    with pytest.raises(TooManyStreamsError, match="GELU_GRPC_MAX_STREAMS_PER_CONNECTION"):
        streams.take("a")
    streams.take("b")
    with pytest.raises(TooManyStreamsError, match="GELU_MAX_CONNECTIONS"):
        streams.take("c")
    streams.give("a")
    streams.take(None)  # a caller without a peer counts in the total only
    assert (streams.held, streams.of("a"), streams.of("b")) == (3, 1, 1)
    for peer in ("a", "b", None):
        streams.give(peer)
    assert streams.held == 0 and streams.of("a") == 0


def test_streams_that_read_nothing_more_hold_half_the_total() -> None:
    """Health's Watch may stay silent as long as its client likes: such streams on every
    connection would hold every connection the server takes."""
    streams = Streams(per_connection=16, total=4)
    streams.take("a", unread=True)
    streams.take("b", unread=True)
    with pytest.raises(TooManyStreamsError, match="half as many"):
        streams.take("c", unread=True)
    streams.take("c")  # a stream of requests: let go once idle instead
    streams.give("a", unread=True)
    streams.take("c", unread=True)
    assert (streams.held, streams.unread) == (3, 2)


@pytest.mark.anyio
async def test_a_connection_past_its_streams_is_refused_and_its_streams_let_go(
    settings_factory,
) -> None:
    """Streams held open on one connection: one more is RESOURCE_EXHAUSTED before anything is
    read; another connection still opens one; an ended stream frees its place."""
    settings = settings_factory(grpc_max_streams_per_connection=2)
    core = DataPlane(settings)
    servicer = InferenceServicer(core, ModelControl.over(core))
    method = SERVICE_DESCRIPTOR.methods_by_name["ModelStreamInfer"]

    release = asyncio.Event()

    async def held() -> AsyncIterator[Any]:
        await release.wait()
        return
        yield  # an async generator that sends nothing until released

    calls = [asyncio.create_task(servicer.ModelStreamInfer(held(), Context(peer="p")))
             for _ in range(2)]  # fmt: skip
    await asyncio.sleep(0.05)
    assert servicer.envelope.streams.of("p") == 2
    with pytest.raises(Aborted) as refused:
        await servicer.ModelStreamInfer(_stream_of(_message(method)), Context(peer="p"))
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "GELU_GRPC_MAX_STREAMS_PER_CONNECTION" in refused.value.details
    other = asyncio.create_task(servicer.ModelStreamInfer(held(), Context(peer="q")))
    await asyncio.sleep(0.05)
    assert servicer.envelope.streams.of("q") == 1
    release.set()
    await asyncio.gather(*calls, other)
    assert servicer.envelope.streams.held == 0


@pytest.mark.anyio
async def test_calls_whose_message_never_comes_are_counted(settings_factory) -> None:
    """A ModelInfer whose message does not arrive (a real server on loopback, a client that
    announces the call and sends nothing) is counted as HTTP counts a body that never came,
    under ``grpc:ModelInfer`` with no model label: 408 past GELU_BODY_TIMEOUT_SECONDS, 499
    when the client's deadline passes first, 400 for a call that ends with no message.
    Before, none was counted: the envelope opened the call only once its message was read."""
    release = asyncio.Event()

    async def nothing() -> AsyncIterator[bytes]:
        await release.wait()
        return
        yield b""  # an async generator that sends nothing until released

    async def none() -> AsyncIterator[bytes]:
        return
        yield b""

    def counted(code: int) -> float:
        labels = {"endpoint": "grpc:ModelInfer", "model": "", "version": "", "code": str(code)}
        registry = core.metrics.registry
        requests = registry.get_sample_value("gelu_requests_total", labels) or 0.0
        failures = registry.get_sample_value("gelu_request_failures_total", labels) or 0.0
        assert requests == failures, (code, requests, failures)  # every one is a failure
        return requests

    async def infer(channel: Any, messages: AsyncIterator[bytes], **options: Any) -> Any:
        call = channel.stream_unary(f"/{SERVICE}/ModelInfer")(messages, **options)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call
        return ended.value

    core = DataPlane(settings_factory(body_timeout_seconds=0.5))
    server = GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            ended = await infer(channel, nothing())
            assert ended.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "GELU_BODY_TIMEOUT_SECONDS" in (ended.details() or "")
            assert counted(408) == 1
            ended = await infer(channel, none())
            assert ended.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert counted(400) == 1
        core.settings.body_timeout_seconds = 60.0  # read_within was taken at construction
        slow = GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")
        await slow.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{slow.port}") as channel:
                ended = await infer(channel, nothing(), timeout=0.3)
                assert ended.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                # The server's handler is cancelled at its own copy of the deadline.
                await until(lambda: counted(CLIENT_CLOSED_REQUEST) == 1, "no 499 counted")
        finally:
            await slow.stop(0)
    finally:
        release.set()
        await server.stop(0)
    assert counted(408) == 1 and counted(400) == 1


def test_the_docs_quote_the_cut() -> None:
    """docs/endpoints.md states how long a message's detail may be before it is cut (the cut
    itself, against a real server: below)."""
    endpoints = (Path(__file__).resolve().parents[3] / "docs" / "endpoints.md").read_text()
    assert f"longer than {MAX_DETAILS_CHARS} characters" in endpoints


# ---- against a real server ----------------------------------------------------------------

GRPCURL = str(Path(sys.executable).parent / "grpcurl")


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[ServedFaces]:
    # Explicit mode with every model loaded, so the repository methods can be exercised.
    env = {"GELU_MODEL_CONTROL_MODE": "explicit", "GELU_LOAD_MODELS": "*"}
    with grpc_server(model_repository, **env) as server:
        yield server


@pytest.mark.slow
def test_tritonclient_every_method(server: ServedFaces) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits-mlp") and client.is_model_ready("digits-mlp", "1")
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.is_model_ready("nope")  # not in the repository: NOT_FOUND, not ready=false
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


@pytest.mark.slow
def test_typed_and_raw_contents_answer_in_kind_and_agree(server: ServedFaces) -> None:
    stub, x = server.stub(), DIGITS[:3]
    typed = stub.ModelInfer(typed_request(x))
    raw = stub.ModelInfer(raw_request(x))
    assert not typed.raw_output_contents and len(raw.raw_output_contents) == 2
    for i, output in enumerate(typed.outputs):
        assert raw.outputs[i].name == output.name and list(output.shape) == [3, 10]
        from_raw = np.frombuffer(raw.raw_output_contents[i], "<f4")
        np.testing.assert_array_equal(np.array(output.contents.fp32_contents, "<f4"), from_raw)


@pytest.mark.slow
def test_grpc_and_http_answers_are_bit_identical(server: ServedFaces) -> None:
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


@pytest.mark.slow
def test_kserve_grpc_client(server: ServedFaces) -> None:
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


@pytest.mark.slow
def test_grpcurl_through_reflection(server: ServedFaces) -> None:
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


@pytest.mark.slow
@pytest.mark.parametrize(("build", "code", "needle"), BAD)
def test_bad_requests_get_the_right_status_and_the_server_keeps_serving(
    server: ServedFaces, build, code, needle: str
) -> None:
    stub = server.stub()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(build())
    assert caught.value.code() == code, caught.value.details()
    assert needle in caught.value.details()
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).raw_output_contents) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x" * 100_000, "\U0001f600" * 100_000])
def test_a_long_string_a_client_sent_is_cut_from_the_message_to_fit_its_trailer(
    server: ServedFaces, name: str
) -> None:
    """Echoed whole, a 10 KB name made the message's trailer larger than a client accepts:
    RESOURCE_EXHAUSTED "Stream removed" instead of the error. A 4-byte character is the worst
    case: 12 bytes percent-encoded."""
    for request in (
        raw_request(DIGITS[:1], model=name),
        changed(typed_request(DIGITS[:1]), name=name),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            server.stub().ModelInfer(request)
        details = caught.value.details()
        assert caught.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
        assert details.startswith(("unknown model '", "unknown input '")), details[:100]
        assert "characters cut)" in details and len(details) <= MAX_DETAILS_CHARS


@pytest.mark.slow
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
    with grpc_server(model_repository, **env) as server:
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

    def let_in() -> socket.socket | None:
        """A connection, once the server's SETTINGS come on it."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(4, 1, 0))
        if sock.recv(65536):
            return sock
        sock.close()
        return None

    with wait_until(let_in, timeout=15, every=0.5, what="no connection was let in") as sock:
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

    def answered() -> grpc.Channel | None:
        tried = channel or _channel(address)
        return tried if _live(tried) is None else None

    return wait_until(answered, timeout=30, every=0.5, what="no call was let in")


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


@pytest.mark.slow
def test_unimplemented_methods_say_so(server: ServedFaces) -> None:
    channel = grpc.insecure_channel(server.address)
    method = channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryStatus")
    with pytest.raises(grpc.RpcError) as caught:
        method(b"")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.slow
def test_metrics_count_grpc_calls(server: ServedFaces) -> None:
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


@pytest.mark.slow
def test_an_undecodable_message_is_counted_as_a_client_mistake(server: ServedFaces) -> None:
    """A message that is no protobuf of its method is decoded inside the envelope (grpcio's
    server hands it over as bytes): INVALID_ARGUMENT, naming the message it is not, and counted
    as a 400 under its method, unary or streamed."""
    channel = grpc.insecure_channel(server.address)
    garbage = b"\xff\xff\xff"
    live = channel.unary_unary(f"/{SERVICE}/ServerLive")
    with pytest.raises(grpc.RpcError) as caught:
        live(garbage, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an encoded inference.ServerLiveRequest" in (caught.value.details() or "")
    stream = channel.stream_stream(f"/{SERVICE}/ModelStreamInfer")
    with pytest.raises(grpc.RpcError) as caught:
        list(stream(iter([garbage]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    metrics = get(server.http_port, "/metrics")[1].decode()
    for method in ("ServerLive", "ModelStreamInfer"):
        assert any(f'endpoint="grpc:{method}"' in x and 'code="400"' in x
                   for x in metrics.splitlines()), method  # fmt: skip


@pytest.mark.slow
def test_grpc_requests_batch_alone_and_with_http(model_repository: Path) -> None:
    """With batches on a worker thread and a 300 ms queue delay, one HTTP and one gRPC request
    sent together run as one batch of two, and then eight gRPC calls sent together as one
    batch of eight."""
    env = {"GELU_INLINE_MAX_US": "0", "GELU_MAX_QUEUE_DELAY_US": "300000"}
    with grpc_server(model_repository, **env) as server:
        x, stub = DIGITS[:1], server.stub()
        content, headers = binary_request(x)
        http = (server.http_post, ("/v2/models/digits-mlp/infer", content, headers))
        grpc_call = (stub.ModelInfer, (raw_request(x),))
        assert runs_of_digits_mlp(server, grpc_call, http) == [2, 1, 2]  # one run for both
        assert runs_of_digits_mlp(server, *[grpc_call] * 8) == [10, 2, 2, 8]


async def _calls_at_once(address: str, calls: int, times: int) -> None:
    """``calls`` ModelInfer calls at once on one channel, ``times`` times over."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = raw_request(DIGITS[:1])
        for _ in range(times):
            await asyncio.gather(*(stub.ModelInfer(request) for _ in range(calls)))


@pytest.mark.slow
def test_concurrent_grpc_calls_share_runs_with_the_default_settings(
    model_repository: Path,
) -> None:
    """With the defaults (small batches on the event loop, no queue delay), calls in flight
    together on one channel share runs, though grpcio's server hands them over one at a time:
    64 at once, 20 times, take far fewer runs than calls (before, each call was a run of its
    own; now 60-80 runs in all). The server has a core of its own, as each of `--workers N` on
    N cores, and the client the others. A busy process on the server's core takes the turns
    grpcio's threads need: then 600-950 runs, hence the bound of 4/5 of the calls."""
    cpus = os.sched_getaffinity(0)
    core = min(cpus)
    with grpc_server(model_repository) as server:
        pin_tree(server.process.pid, {core})
        os.sched_setaffinity(0, cpus - {core} or cpus)
        try:
            asyncio.run(_calls_at_once(server.address, 64, 20))
        finally:
            os.sched_setaffinity(0, cpus)
        inferences, executions, *_ = runs_of_digits_mlp(server)
        assert inferences == 1280
        assert executions < inferences * 4 / 5


@pytest.mark.slow
def test_health_turns_not_serving_when_draining(model_repository: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc_server(model_repository, GELU_DRAIN_SECONDS="3") as server:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address))
        check = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
        assert health.Check(check).status == health_pb2.HealthCheckResponse.SERVING
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert health.Check(check).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert len(server.stub().ModelInfer(raw_request(DIGITS[:1])).outputs) == 2  # serving
        assert server.process.wait(timeout=30) == 0


@pytest.mark.slow
def test_readme_grpc_examples_work_as_written(server: ServedFaces) -> None:
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


# ---- ModelStreamInfer -----------------------------------------------------------------------

# grpcio refuses a message above the limit itself, ending the call (test below); the core's
# refusals are the stream's to answer in band.
IN_BAND = [bad for bad in BAD if bad[2] != "larger than max"]
(TOO_LARGE,) = [build for build, _, needle in BAD if needle == "larger than max"]


@pytest.fixture(scope="module")
def stream_server(model_repository: Path) -> Iterator[ServedFaces]:
    """A server of the streams' own: the first test below counts every stream request it has
    seen, and a client that stops reading is let go on it."""
    with grpc_server(model_repository) as server:
        yield server


def _identified(request: pb.ModelInferRequest, request_id: str) -> pb.ModelInferRequest:
    request.id = request_id
    return request


@pytest.mark.slow
def test_each_request_is_answered_in_the_order_sent_as_model_infer_answers_it(
    stream_server: ServedFaces,
) -> None:
    """Good requests between every kind of bad one: the good ones' outputs are ModelInfer's,
    byte for byte; a bad one gets ModelInfer's message in band, with its id, and the stream
    goes on; the metrics count each request."""
    stub = stream_server.stub()
    requests, expected = [], []
    for i, (build, _code, needle) in enumerate(IN_BAND):
        for j, request in enumerate((raw_request(DIGITS[i : i + 2]), build())):
            request_id = f"{i}.{j}"
            if j == 0:
                unary = stub.ModelInfer(raw_request(DIGITS[i : i + 2]))
                expected.append((request_id, "", list(unary.raw_output_contents)))
            else:
                with pytest.raises(grpc.RpcError) as unary_error:
                    stub.ModelInfer(build())
                assert needle in unary_error.value.details()
                expected.append((request_id, unary_error.value.details(), []))
            requests.append(_identified(request, request_id))
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=60))
    got = [
        (a.infer_response.id, a.error_message, list(a.infer_response.raw_output_contents))
        for a in answers
    ]
    assert got == expected
    metrics = get(stream_server.http_port, "/metrics")[1].decode()
    line = 'gelu_requests_total{code="200",endpoint="grpc:ModelStreamInfer",model="digits-mlp"'
    assert f'{line},version="2"}} {float(len(IN_BAND))}' in metrics
    assert 'endpoint="grpc:ModelStreamInfer",model="nope"' not in metrics  # no client's label


@pytest.mark.slow
def test_typed_contents_are_answered_in_kind(stream_server: ServedFaces) -> None:
    (answer,) = stream_server.stub().ModelStreamInfer(iter([typed_request(DIGITS[:3])]), timeout=30)
    assert not answer.error_message and not answer.infer_response.raw_output_contents
    assert [list(o.shape) for o in answer.infer_response.outputs] == [[3, 10], [3, 10]]


@pytest.mark.slow
def test_the_first_failure_ends_the_call_when_the_client_asks(stream_server: ServedFaces) -> None:
    """Triton's `triton_grpc_error` header: the answers before the failure, then its status."""
    requests = [raw_request(DIGITS[:1]), pb.ModelInferRequest(model_name="nope")]
    call = stream_server.stub().ModelStreamInfer(
        iter(requests * 2), metadata=(("triton_grpc_error", "true"),), timeout=30
    )
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        answers.extend(call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown model 'nope'" in caught.value.details()
    assert len(answers) == 1 and not answers[0].error_message


@pytest.mark.slow
def test_a_message_above_the_limit_ends_the_call(stream_server: ServedFaces) -> None:
    """As a ModelInfer call's: grpcio refuses it before the service sees it."""
    call = stream_server.stub().ModelStreamInfer(iter([raw_request(DIGITS[:1]), TOO_LARGE()]))
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        answers.extend(call)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in caught.value.details()
    assert len(answers) <= 1
    assert len(stream_server.stub().ModelInfer(raw_request(DIGITS[:1])).outputs) == 2


@pytest.mark.slow
def test_tritonclient_streams(stream_server: ServedFaces) -> None:
    """tritonclient's start_stream / async_stream_infer, unmodified."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(stream_server.address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    x = grpcclient.InferInput("input", [1, 64], "FP32")
    x.set_data_from_numpy(DIGITS[:1])
    for i in range(20):
        client.async_stream_infer("digits-mlp" if i != 7 else "nope", [x], request_id=str(i))
    got = [answers.get(timeout=30) for _ in range(20)]
    client.stop_stream()
    assert [r.get_response().id for r, _ in got if r is not None] == [
        str(i) for i in range(20) if i != 7
    ]
    assert got[7][0] is None and "unknown model 'nope'" in str(got[7][1])


@pytest.mark.slow
def test_requests_of_one_stream_share_a_run(model_repository: Path) -> None:
    """With batches on a worker thread and a 300 ms queue delay, eight requests sent at once on
    one stream run as one batch of eight, as eight calls at once do."""
    env = {"GELU_INLINE_MAX_US": "0", "GELU_MAX_QUEUE_DELAY_US": "300000"}
    with grpc_server(model_repository, **env) as server:
        requests = [raw_request(DIGITS[:1])] * 8
        stream = (list, (server.stub().ModelStreamInfer(iter(requests), timeout=30),))
        assert runs_of_digits_mlp(server, stream) == [8, 1, 8]


@pytest.mark.slow
def test_a_client_that_stops_reading_holds_only_the_window(stream_server: ServedFaces) -> None:
    """A client sending without end and reading nothing: the server stops reading once its
    answers fill the transport's windows and the stream's own (STREAM_WINDOW), instead of
    running every request and holding its answer; meanwhile it serves others, and once the
    client cancels, the stream's requests are let go."""
    stub, pulled = stream_server.stub(), itertools.count()
    big = raw_request(DIGITS[:1].repeat(256, axis=0))  # 64 KiB each way and back 20 KiB

    def without_end() -> Iterator[pb.ModelInferRequest]:
        while True:
            next(pulled)
            yield big

    call = stub.ModelStreamInfer(without_end(), timeout=120)
    next(call)
    counts: list[int] = []

    def settled() -> bool:  # two seconds without a request run: five readings alike
        counts.append(_inferences(stream_server))
        return len(counts) >= 5 and len(set(counts[-5:])) == 1

    wait_until(settled, timeout=60, every=0.5, what="the server kept reading")
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).outputs) == 2  # serving others
    sent = next(pulled)
    time.sleep(1)
    assert next(pulled) == sent + 1  # the client's sends are held too
    call.cancel()
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).outputs) == 2


def _inferences(server: ServedFaces) -> int:
    stats = server.stub().ModelStatistics(pb.ModelStatisticsRequest(name="digits-mlp"))
    return sum(s.inference_count for s in stats.model_stats)


def test_the_window_holds_requests_up_to_its_count_and_bytes() -> None:
    async def main() -> None:
        window = Window(2, 100)
        await window.take(10)
        await window.take(10)
        third = asyncio.ensure_future(window.take(10))
        await asyncio.sleep(0.01)
        assert not third.done()  # two requests held: the count is full
        window.give(10)
        await asyncio.wait_for(third, 1)
        window.give(10)
        window.give(10)
        await window.take(60)
        larger = asyncio.ensure_future(window.take(50))
        await asyncio.sleep(0.01)
        assert not larger.done()  # 110 bytes would be held
        window.give(60)
        await asyncio.wait_for(larger, 1)
        window.give(50)
        await asyncio.wait_for(window.take(500), 1)  # alone, any request fits

    asyncio.run(main())


def test_a_quiet_stream_is_ended_only_with_no_request_in_progress() -> None:
    async def main() -> None:
        silent = asyncio.Event()

        async def requests() -> AsyncIterator[int]:
            yield 1
            await silent.wait()
            yield 2

        quiet, iterator = Quiet(0.05), requests()
        assert await quiet.next(iterator) == 1
        quiet.hold()  # a request in progress: its client waits for the answer, not idle
        read = asyncio.ensure_future(quiet.next(iterator))
        await asyncio.sleep(0.2)
        assert not read.done()
        quiet.release()  # answered: idle from now
        with pytest.raises(DeadlineExceededError, match="GELU_GRPC_STREAM_IDLE_SECONDS"):
            await asyncio.wait_for(read, 1)

    asyncio.run(main())


def test_readme_quotes_the_window() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    readme = (docs / "endpoints.md").read_text() + (docs / "serving.md").read_text()
    assert f"answers it has written than {STREAM_WINDOW} requests" in readme
    assert f"no further ahead of its answers than {STREAM_WINDOW} requests" in readme
