"""The gRPC face's envelope, in process: every method of every service it serves (the protocol's,
health's, reflection's, enumerated from their descriptors) checks credentials and the message
bound when called directly, as Ray Serve's gRPC proxy calls them (issue 62 item 6); streams are
held to their share per connection and in all (item 10)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from service.control import ModelControl
from service.dataplane import DataPlane
from service.grpc.server import (
    HEALTH_DESCRIPTOR,
    MAX_DETAILS_CHARS,
    REFLECTION_DESCRIPTOR,
    ROUTE_CLASSES,
    SERVICE_DESCRIPTOR,
    AdmitFirst,
    GrpcServer,
    InferenceServicer,
    Streams,
    TooManyStreamsError,
)

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
async def test_the_interceptor_classifies_by_the_exact_registered_path(settings: Any) -> None:
    """gRPC-Go CVE-2026-33186: a path without its leading slash, or with extra segments, was
    routed while the authorisation matched another string. Here only an exact registered path
    is classed (anything else has no handler: UNIMPLEMENTED), and the envelope, where the method
    runs, classes by the method a handler was built for."""
    admit = _server(settings).interceptors[0]
    assert isinstance(admit, AdmitFirst)
    load = "/inference.GRPCInferenceService/RepositoryModelLoad"
    assert admit.methods[load] == ("inference.GRPCInferenceService", "RepositoryModelLoad")
    for variant in (load[1:], "/x" + load, load + "/", "/" + load, load.lower()):
        assert variant not in admit.methods
    assert len(admit.methods) == len(METHODS)


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


def test_the_docs_quote_the_cut() -> None:
    """docs/endpoints.md states how long a message's detail may be before it is cut (the cut
    itself, against a real server: test_grpc.py)."""
    endpoints = (Path(__file__).resolve().parents[3] / "docs" / "endpoints.md").read_text()
    assert f"longer than {MAX_DETAILS_CHARS} characters" in endpoints
