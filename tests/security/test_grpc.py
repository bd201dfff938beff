"""The gRPC face under attack, against a real ``gelu-serve serve`` with GELU_GRPC_PORT: streams
that starve other clients' calls (issue 62 item 10), restricted methods without credentials
(item 6), and method paths that differ from the registered one (gRPC-Go CVE-2026-33186).
Calling the servicer's methods directly, as Ray Serve's gRPC proxy does (item 6), is walked
method by method in tests/service/grpc/test_server.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2_grpc

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from tests.helpers import DIGITS
from tests.servers import free_port, running

pytestmark = pytest.mark.slow  # a real server process

TOKEN = "battery-control-token-0123456789"
STREAMS = 1024  # as many as GELU_MAX_CONNECTIONS' default, the calls grpcio let be in flight
PER_CONNECTION = 16  # GELU_GRPC_MAX_STREAMS_PER_CONNECTION's default
SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def address(model_repository: Path) -> Iterator[str]:
    port = free_port()
    env = {"GELU_GRPC_PORT": str(port), "GELU_CONTROL_TOKEN": TOKEN,
           "GELU_MODEL_CONTROL_MODE": "explicit", "GELU_LOAD_MODELS": "*"}  # fmt: skip
    with running(model_repository, **env):
        yield f"127.0.0.1:{port}"


def _infer_request() -> pb.ModelInferRequest:
    x = np.ascontiguousarray(DIGITS[:1])
    request = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[x.tobytes()])
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    return request


def _own_connection(address: str) -> grpc.aio.Channel:
    """A channel with a connection of its own (not shared with the process's other channels)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


async def _silent(release: asyncio.Event) -> AsyncIterator[Any]:
    """A stream's requests: none, until ``release`` (the stream stays open, as the attacker's)."""
    await release.wait()
    return
    yield


async def _starve(address: str) -> tuple[int, list[grpc.StatusCode], list[Any]]:
    """1,024 reflection streams held open on one connection, then three unary calls on
    another: how many streams are still open, the statuses of the others, the calls' errors
    (None: answered)."""
    async with _own_connection(address) as attacker, _own_connection(address) as other:
        reflection = reflection_pb2_grpc.ServerReflectionStub(attacker)
        release = asyncio.Event()
        # The streams send nothing: a write of the client's own that the server's refusal
        # overtook would end its call INTERNAL ("Internal error from Core") on the client's side.
        streams = [reflection.ServerReflectionInfo(_silent(release)) for _ in range(STREAMS)]
        deadline = time.monotonic() + 20
        while sum(call.done() for call in streams) < STREAMS - PER_CONNECTION:
            if time.monotonic() > deadline:
                break  # every stream still held: the unary calls below tell what that does
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # and no stream more is let go
        stub = pb_grpc.GRPCInferenceServiceStub(other)
        errors: list[Any] = []
        for call in (lambda: stub.ModelReady(pb.ModelReadyRequest(name="digits-mlp"), timeout=10),
                     lambda: stub.ModelInfer(_infer_request(), timeout=10),
                     lambda: stub.ServerLive(pb.ServerLiveRequest(), timeout=10)):  # fmt: skip
            try:
                await call()
                errors.append(None)
            except grpc.aio.AioRpcError as exc:
                errors.append(exc.code())
        held = sum(not call.done() for call in streams)
        refused = [await call.code() for call in streams if call.done()]
        release.set()
        for call in streams:
            call.cancel()
        return held, refused, errors


def test_one_clients_streams_do_not_starve_other_clients_calls(address: str) -> None:
    """Issue 62 item 10, gRPC starvation: one client holding 1,024 reflection streams on one
    connection made every other call RESOURCE_EXHAUSTED (streams counted against
    maximum_concurrent_rpcs with no cap per connection). Now that connection holds 16 streams,
    the rest are refused RESOURCE_EXHAUSTED, and another client's ModelReady, ModelInfer and
    ServerLive are answered."""
    held, refused, errors = asyncio.run(_starve(address))
    assert errors == [None, None, None], errors
    assert held == PER_CONNECTION, held
    assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, set(refused)


RESTRICTED = {
    "RepositoryIndex": pb.RepositoryIndexRequest(),
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest(model_name="digits-mlp"),
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest(model_name="digits-mlp"),
    "TraceSetting": pb.TraceSettingRequest(),
    "LogSettings": pb.LogSettingsRequest(),
}


def _call(channel: grpc.Channel, path: str, request: Any, metadata: Any = ()) -> Any:
    method = channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                 response_deserializer=bytes)  # fmt: skip
    try:
        method(request, metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return None


def _ready(channel: grpc.Channel) -> bool:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    return stub.ModelReady(pb.ModelReadyRequest(name="digits-mlp"), timeout=10).ready


def test_restricted_methods_need_their_credentials(address: str) -> None:
    """Issue 62 item 6 (TorchServe's ShellTorch: a management API open to whoever reaches it):
    load, unload, trace and logging refuse a call without GELU_CONTROL_TOKEN in its metadata
    (UNAUTHENTICATED) or with a wrong one, and the model stays loaded; with it they answer."""
    with grpc.insecure_channel(address) as channel:
        for name, request in RESTRICTED.items():
            path = f"/{SERVICE}/{name}"
            assert _call(channel, path, request) == grpc.StatusCode.UNAUTHENTICATED, name
            wrong = (("authorization", f"Bearer {TOKEN[:-1]}x"),)
            assert _call(channel, path, request, wrong) == grpc.StatusCode.UNAUTHENTICATED, name
        assert _ready(channel)
        right = (("authorization", f"Bearer {TOKEN}"),)
        assert _call(channel, f"/{SERVICE}/RepositoryIndex", RESTRICTED["RepositoryIndex"],
                     right) is None  # fmt: skip


def test_method_path_variants_do_not_bypass_authorisation(address: str) -> None:
    """gRPC-Go CVE-2026-33186: a method path without its leading slash was routed to the method
    while the authorisation, matching "/Service/Method", let it through. Every variant of the
    unload method's path (no leading slash, doubled slashes, extra segments before or after, a
    trailing slash, another case) is refused without credentials, and the model stays
    loaded."""
    unload = f"{SERVICE}/RepositoryModelUnload"
    variants = [unload, f"//{unload}", f"/x/{unload}", f"/{unload}/", f"/{unload}/x",
                f"/{SERVICE}//RepositoryModelUnload", f"/{unload.lower()}",
                f"/{SERVICE}/RepositoryModelUnload%00"]  # fmt: skip
    request = RESTRICTED["RepositoryModelUnload"]
    refused = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}
    with grpc.insecure_channel(address) as channel:
        for path in variants:
            assert _call(channel, path, request) in refused, path
            assert _ready(channel), f"{path} unloaded the model"


def test_an_undecodable_message_is_invalid_argument(model_repository: Path) -> None:
    """A client mistake is a 4xx (the project's rule; gRPC's INVALID_ARGUMENT, as HTTP answers
    an unparseable body 400): a message that is not the method's protobuf ends the call
    INVALID_ARGUMENT, unary or streamed, inference's or health's. grpcio's own answer is
    UNKNOWN ("Unexpected <class 'DecodeError'>", the server's exception type sent to the
    client), with an ERROR line and a traceback logged for every such message: a log that
    anyone reaching a method open to them can flood (CWE-779), and a call counted in neither
    the metrics nor the access log. So at b7997f9 (ReadWithin) and at b057f08 (Dispatch)
    alike: both read the message through grpcio's deserializer, outside the envelope."""
    port = free_port()
    garbage = b"\xff\xff\xff"  # a field tag whose varint never ends: no message decodes it
    paths = [f"/{SERVICE}/ModelInfer", f"/{SERVICE}/ServerLive", "/grpc.health.v1.Health/Check"]
    with (
        running(model_repository, GELU_GRPC_PORT=str(port)),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        codes: dict[str, grpc.StatusCode] = {}
        for path in paths:
            unary = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
            try:
                unary(garbage, timeout=10)
            except grpc.RpcError as exc:
                codes[path] = exc.code()
        stream = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer", request_serializer=bytes, response_deserializer=bytes
        )
        try:
            list(stream(iter([garbage]), timeout=10))
        except grpc.RpcError as exc:
            codes["ModelStreamInfer"] = exc.code()
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        assert codes == {path: invalid for path in [*paths, "ModelStreamInfer"]}, codes
    # Leaving ``running`` checks that the server logged no traceback for them.


def test_silent_streams_on_every_connection_do_not_lock_out_other_clients(
    model_repository: Path,
) -> None:
    """Slowloris (CVE-2007-6750's class) on HTTP/2 streams: a client opens as many connections
    as the server takes (GELU_MAX_CONNECTIONS) and on each one ModelStreamInfer stream that
    sends nothing. A connection with a call in flight is never idle (GOAWAY after
    GELU_KEEP_ALIVE_SECONDS spares it), and a stream is the client's to pace (no
    GELU_BODY_TIMEOUT_SECONDS), so another client is refused a connection for as long as the
    streams stay open. A silent stream must be let go (as a slow body is on HTTP) so that the
    other client is answered within a few seconds."""
    port, connections = free_port(), 4
    env = {
        "GELU_GRPC_PORT": str(port),
        "GELU_MAX_CONNECTIONS": str(connections),
        "GELU_KEEP_ALIVE_SECONDS": "1",
        "GELU_BODY_TIMEOUT_SECONDS": "1",
        "GELU_GRPC_STREAM_IDLE_SECONDS": "1",
    }  # fmt: skip (its 60 s default, shortened)
    release = threading.Event()

    def silent() -> Iterator[bytes]:
        release.wait(60)
        yield from ()

    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own each
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options) for _ in range(connections + 1)]
    try:
        with running(model_repository, **env):
            streams = [
                channel.stream_stream(f"/{SERVICE}/ModelStreamInfer", request_serializer=bytes,
                                      response_deserializer=bytes)(silent(), timeout=60)
                for channel in channels[:connections]
            ]  # fmt: skip
            other = channels[-1].unary_unary(
                f"/{SERVICE}/ServerLive", request_serializer=bytes, response_deserializer=bytes
            )
            answered, deadline = False, time.monotonic() + 10
            while not answered and time.monotonic() < deadline:
                try:
                    other(pb.ServerLiveRequest().SerializeToString(), timeout=2)
                    answered = True
                except grpc.RpcError:
                    time.sleep(0.5)
            held = sum(not stream.done() for stream in streams)
            release.set()
            assert answered, f"another client locked out while {held} silent streams are held"
    finally:
        release.set()
        for channel in channels:
            channel.close()
