"""The gRPC face: the Open Inference Protocol's ``inference.GRPCInferenceService`` over the
serving core, with gRPC health checking and server reflection.

One ``GrpcServer`` runs beside the HTTP face in the same process and event loop (grpcio's
asyncio server), on ``GELU_GRPC_PORT``: the host (``service.host``) starts it as the HTTP
face's peer once the core is started, and stops it beside the HTTP face before the core. Every
method translates to the same ``DataPlane`` call the HTTP routes make (model control's to the
``ModelControl`` the host hands it), so both protocols get the same checks, limits, batches
(requests of both form shared batches),
statistics and metrics (Triton's ModelStreamInfer takes many requests on one call, each
answered as ModelInfer would answer it); a ``ServiceError`` becomes one gRPC status
(``STATUS_CODES``) with its message. The HTTP face's connection limits hold here too, in
grpcio's terms (``GrpcServer``, ``Envelope.method``).

Every method of every service is served inside one ``Envelope``: request id, the credentials
of the method's route class, the message decoded (grpcio hands it over as bytes), the
message-size bound, the share of streams and a stream's idle clock, metrics, the access log
and the trace's end. The envelope is in the methods themselves (``Envelope.method``;
``InferenceServicer``'s are built through it; health's and reflection's are wrapped by
``enveloped``), not in an interceptor: Ray Serve's gRPC proxy calls the servicer's methods
directly (``deploy/ray/serve_app.py``) and gets the same envelope as grpcio's server, to which
``Dispatch`` hands the same methods (checking credentials before a message is read).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple, NoReturn

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from service import fields
from service.auth import GRPC as GRPC_CLASSES
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import (
    CLIENT_CLOSED_REQUEST,
    REQUEST_TIMEOUT,
    BadInputError,
    DeadlineExceededError,
    NotReadyError,
    PayloadTooLargeError,
    ServiceError,
    StartupError,
)
from service.grpc import codec
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.logs import (
    REQUEST_ID_HEADER,
    access,
    adopt_request_id,
    checked_request_id,
    new_request_id,
    request_id,
    wants_access,
)
from service.tls import TlsFiles
from service.tracing import RequestTrace

logger = logging.getLogger("gelu_serve")
SERVICE_DESCRIPTOR = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SERVICE = SERVICE_DESCRIPTOR.full_name
HEALTH_DESCRIPTOR = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION_DESCRIPTOR = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
# Each method's route class (``service.auth``), by the name of the method a handler was built
# for, never by a path a client sent: a method named nowhere cannot be built (fail closed).
# Reflection describes the services, as HTTP's API documentation does: metadata.
ROUTE_CLASSES = {**GRPC_CLASSES, "ServerReflectionInfo": "metadata"}
# The one mapping from the core's errors (their HTTP status) to gRPC status codes.
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    # A message that did not arrive in time, as HTTP's 408; last, so DEADLINE_EXCEEDED's
    # HTTP equivalent stays 504.
    REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}
HTTP_STATUSES = {code: status for status, code in reversed(STATUS_CODES.items())}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status of an answer counted with HTTP ``status``."""
    if status == 200:
        return grpc.StatusCode.OK
    if status == CLIENT_CLOSED_REQUEST:
        return grpc.StatusCode.CANCELLED
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


# A status's message travels in a trailer, percent-encoded (up to 3 bytes for each byte of UTF-8,
# up to 4 for a character), and clients drop trailers above 8 KiB (grpc.max_metadata_size) for
# "Stream removed": a message naming a long string a client sent is cut in its middle to fit.
MAX_DETAILS_CHARS = 512
# Requests of one ModelStreamInfer call started and not yet answered, at most: as many as fill a
# batch for the small models' batchers on the loop, few enough that a stream holds about what a
# connection does (and no more than GELU_MAX_BODY_BYTES of requests, ``Window``).
STREAM_WINDOW = 64
Started = asyncio.Queue[tuple[asyncio.Task[Any], int, str] | None]  # a stream's, in order


class TooManyStreamsError(ServiceError):
    """A streaming call beyond its connection's or the server's share of streams."""

    status_code = 429  # Too Many Requests; gRPC's RESOURCE_EXHAUSTED


class Failure(NamedTuple):
    """A call's failure: its gRPC status code and message."""

    code: grpc.StatusCode
    message: str


class Quiet:
    """A client stream's idle clock: a read with no request of the stream in progress (read
    and not yet answered) ends the call after ``seconds`` (GELU_GRPC_STREAM_IDLE_SECONDS), as a
    proxy's read timeout does; the clock stops while a request is in progress. Without it a
    silent stream on each connection held every connection grpcio takes (Slowloris)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.busy = 0
        self._timer: asyncio.Timeout | None = None

    def hold(self) -> None:
        """A request read is in progress."""
        self.busy += 1
        self._reschedule()

    def release(self) -> None:
        """A request in progress was answered."""
        self.busy -= 1
        self._reschedule()

    def _when(self) -> float | None:
        return None if self.busy else asyncio.get_running_loop().time() + self.seconds

    def _reschedule(self) -> None:
        if self._timer is not None and not self._timer.expired():
            self._timer.reschedule(self._when())

    async def next(self, requests: AsyncIterator[Any]) -> Any:
        """The stream's next message (``StopAsyncIteration`` at its end), or a 504 once idle."""
        try:
            async with asyncio.timeout_at(self._when()) as self._timer:
                return await anext(requests)
        except TimeoutError:
            raise DeadlineExceededError(
                f"no request on this stream for {self.seconds:g} s "
                "(GELU_GRPC_STREAM_IDLE_SECONDS); open another when there is one to send"
            ) from None
        finally:
            self._timer = None


@dataclass(slots=True)
class Call:
    """One call inside the envelope: its service and method, the gRPC context (grpcio's, or
    Ray's), its metadata (text values, lower-case names), its trace, once begun, and, for a
    stream of requests, its idle clock."""

    service: str
    method: str
    context: Any
    metadata: dict[str, str]
    trace: RequestTrace | None = None
    quiet: Quiet | None = None


Behavior = Callable[[Any, Call], Any]  # a method's own work: (request(s), call) -> its answer


class Streams:
    """Streaming calls in flight (ModelStreamInfer, reflection, health's Watch): at most
    ``per_connection`` on one connection (its peer address) and ``total`` in all. grpcio's
    ``maximum_concurrent_rpcs`` counts unary calls and streams alike; with streams held to their
    own share, a client holding streams cannot use up the calls that others' unary ones need.

    Streams that read nothing after their one request (health's Watch) may stay open as long as
    their client likes, silent; they are held to half the total, so that such streams on every
    connection cannot hold every connection grpcio takes. A stream of requests is let go once
    idle instead (``Quiet``)."""

    def __init__(self, per_connection: int, total: int) -> None:
        self.per_connection, self.total = per_connection, total
        self.unread_total = max(total // 2, 1)
        self.held = self.unread = 0
        self._by_peer: dict[str, int] = {}

    def take(self, peer: str | None, unread: bool = False) -> None:
        """Hold a stream of ``peer`` (None: a caller without one, counted in the total only),
        one that reads nothing more if ``unread``, or raise ``TooManyStreamsError``."""
        if unread and self.unread >= self.unread_total:
            raise TooManyStreamsError(
                f"{self.unread} streams that read no more requests (health's Watch) are open "
                "on this server, half as many as it takes (GELU_MAX_CONNECTIONS); try again "
                "when one ends"
            )
        if self.held >= self.total:
            raise TooManyStreamsError(
                f"{self.total} streams are open on this server, as many as it takes "
                "(GELU_MAX_CONNECTIONS); try again when one ends"
            )
        if peer is not None:
            held = self._by_peer.get(peer, 0)
            if held >= self.per_connection:
                raise TooManyStreamsError(
                    f"{held} streams are open on this connection, as many as one may have "
                    "(GELU_GRPC_MAX_STREAMS_PER_CONNECTION); try again when one ends"
                )
            self._by_peer[peer] = held + 1
        self.held += 1
        self.unread += unread

    def give(self, peer: str | None, unread: bool = False) -> None:
        """A stream of ``peer`` (``unread`` as it was taken) ended."""
        self.held -= 1
        self.unread -= unread
        if peer is not None:
            left = self._by_peer.pop(peer) - 1
            if left:
                self._by_peer[peer] = left

    def of(self, peer: str) -> int:
        """Streams ``peer`` holds now."""
        return self._by_peer.get(peer, 0)


def _peer(context: Any) -> str | None:
    """The connection a call came on (grpcio's ``peer()``: address and port); None where the
    caller's context has none."""
    peer = getattr(context, "peer", None)
    return str(peer()) if callable(peer) else None


def client_deadline(context: Any) -> int | None:
    """When the call's client stops waiting (``time.perf_counter_ns``): its gRPC deadline, from
    grpcio's ``time_remaining()``; None without one, or where the caller's context cannot say
    (Ray's proxy)."""
    remaining = getattr(context, "time_remaining", None)
    seconds = remaining() if callable(remaining) else None
    if seconds is None:
        return None
    return time.perf_counter_ns() + max(int(seconds * 1e9), 0)


def _model_of(request: Any) -> str:
    """The model a request names (``model_name`` or ``name``), or ''."""
    for field in ("model_name", "name"):
        value = getattr(request, field, None)
        if isinstance(value, str):
            return value
    return ""


class Envelope:
    """What every gRPC method is served inside, whoever calls it (grpcio's server, or Ray
    Serve's gRPC proxy calling the servicer's methods): no key it reads once repeated
    (``text_metadata``; INVALID_ARGUMENT), the request id (``x-request-id``, else a fresh one,
    returned in the trailing metadata), the credentials of the method's route class
    (``service.auth``; UNAUTHENTICATED, PERMISSION_DENIED), each message within
    GELU_MAX_BODY_BYTES (RESOURCE_EXHAUSTED, as grpcio's own bound answers), streams within
    their share (``Streams``), then metrics, the access log and the trace's end, once a call."""

    def __init__(self, plane: DataPlane) -> None:
        settings = plane.settings
        self.plane = plane
        self.restrictions = plane.restrictions
        self.max_message_bytes = settings.max_body_bytes
        self.access_log = settings.access_log
        self.streams = Streams(settings.grpc_max_streams_per_connection, settings.max_connections)
        self.stream_idle_seconds = settings.grpc_stream_idle_seconds
        self.once = fields.read_once(self.restrictions)  # keys no call may repeat
        # Each method's request message, to decode what grpcio's server hands over undecoded
        # (``Dispatch``): here, a message that is no such protobuf is the client's mistake.
        self.messages = {
            (service.full_name, method.name): GetMessageClass(method.input_type)
            for service in (SERVICE_DESCRIPTOR, HEALTH_DESCRIPTOR, REFLECTION_DESCRIPTOR)
            for method in service.methods
        }

    def decode(self, call: Call, message: Any) -> Any:
        """``message`` as its method's request: bytes (grpcio's server, ``Dispatch``) are
        decoded, or a 400; a message decoded already (Ray's proxy, a test) is itself."""
        if not isinstance(message, bytes):
            return message
        kind = self.messages[(call.service, call.method)]
        try:
            return kind.FromString(message)
        except DecodeError:
            raise BadInputError(
                f"the message is not an encoded {kind.DESCRIPTOR.full_name} (protobuf could "
                f"not decode its {len(message)} bytes)"
            ) from None

    def admit(self, method: str, metadata: dict[str, str]) -> None:
        """Pass, or raise 401 / 403 for a call of ``method`` with ``metadata``."""
        if self.restrictions is not None:
            self.restrictions.check(ROUTE_CLASSES[method], metadata)

    def fit(self, message: Any) -> None:
        """Pass, or raise 413 for a message above GELU_MAX_BODY_BYTES (grpcio's server refuses
        one first; a caller that decoded it itself, as Ray's proxy, is held here)."""
        size = message.ByteSize()
        if size > self.max_message_bytes:
            raise PayloadTooLargeError(
                f"Received message larger than max ({size} vs. {self.max_message_bytes}; "
                "GELU_MAX_BODY_BYTES)"
            )

    def _open(self, service: str, method: str, context: Any) -> Call | Failure:
        """A call of ``method`` under its request id, or the failure of a malformed one
        (INVALID_ARGUMENT, under a fresh id): an unsafe ``x-request-id``, or a key the service
        reads once sent more than once (``service.fields``)."""
        failure = None
        try:
            metadata = text_metadata(context.invocation_metadata(), self.once)
            request_id.set(checked_request_id(metadata.get(REQUEST_ID_HEADER)))
        except ServiceError as exc:
            request_id.set(new_request_id())
            metadata, failure = {}, exc
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id.get()),))
        call = Call(service, method, context, metadata)
        if failure is None:
            return call
        # Refused before anything is read: counted and logged as any client mistake.
        self.observe(call, "", "", failure.status_code, 0.0)
        return Failure(grpc_code(failure.status_code), failure.message)

    async def open(self, service: str, method: str, context: Any) -> Call:
        """A call of ``method`` under its request id; a malformed one ends it (INVALID_ARGUMENT)."""
        call = self._open(service, method, context)
        if isinstance(call, Failure):
            await _abort(context, call.code, call.message)
        return call

    def method(
        self, service: str, name: str, behavior: Behavior, read_within: float | None = None
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """The unary method ``name``: ``behavior(request, call)``'s answer inside the envelope,
        a failure ending the call with its status code. With ``read_within`` it is served as
        its client-streaming twin (grpcio's server; the wire is the same) and reads its one
        message itself, within that many seconds or DEADLINE_EXCEEDED: grpcio would wait for
        it as long as the connection lives, one of the calls in flight
        (``maximum_concurrent_rpcs``) held all the while, as HTTP's slow bodies would hold
        connections without GELU_BODY_TIMEOUT_SECONDS. One frame from grpcio's handler to the
        behavior's: each is resumed whenever the batcher wakes the request."""

        async def served(request: Any, context: Any) -> Any:
            call = self._open(service, name, context)
            if isinstance(call, Failure):
                await _abort(context, call.code, call.message)
            if read_within is not None:
                request = await self._read(call, read_within)
            answer = await self.answer(call, behavior, request, None, admit=True)
            if isinstance(answer, Failure):
                await _abort(context, answer.code, answer.message)
            return answer

        served.__name__ = served.__qualname__ = name
        return served

    async def _read(self, call: Call, within: float) -> Any:
        """A unary call's one message, read within ``within`` seconds. A call whose message
        never comes is counted as HTTP counts a body that never came (model unknown, so no
        model label): 408 past GELU_BODY_TIMEOUT_SECONDS (answered DEADLINE_EXCEEDED), 400 for
        a call ended with none, 499 where that answer found the client gone. A call reset
        while its message is awaited is not counted: counting each made a rapid-reset flood
        (CVE-2023-44487) starve other clients' calls (tests/security/test_protocols.py)."""
        began = time.perf_counter()
        try:
            async with asyncio.timeout(within):
                request = await call.context.read()
        except TimeoutError:
            status = REQUEST_TIMEOUT
            message = f"no request message within {within:g} s (GELU_BODY_TIMEOUT_SECONDS)"
        else:
            if request is not grpc.aio.EOF:
                return request
            status, message = 400, "no request message"
        # grpcio's read also gives EOF for a call the client cancelled (or whose deadline
        # passed): only an answer that could be sent says the client was still there.
        try:
            await _abort(call.context, grpc_code(status), message)
        except grpc.aio.AbortError:
            raise
        except BaseException:  # the core ended the call first, or cancelled while sending
            status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            self.observe(call, "", "", status, time.perf_counter() - began)
        raise AssertionError("unreachable: abort raises")

    async def answer(
        self, call: Call, behavior: Behavior, request: Any, model: str | None, admit: bool
    ) -> Any | Failure:
        """``behavior(request, call)``'s answer, after the call's credentials, the message
        decoded (``decode``; its model, when ``model`` is None) and its bound when ``admit`` (a
        stream's message had all three checked as it was read); counted and
        timed as the HTTP face does (endpoint ``grpc:Method``, the status as its HTTP
        equivalent), ``call``'s trace ended; a ``ServiceError`` (or a bug) becomes a
        ``Failure`` with its status code and message."""
        status, began, version = 500, time.perf_counter(), ""
        try:
            if admit:
                self.admit(call.method, call.metadata)
                request = self.decode(call, request)
                self.fit(request)
            if model is None:
                model = _model_of(request)
            reply = await behavior(request, call)
        except ServiceError as exc:
            status = exc.status_code
            return Failure(grpc_code(status), exc.message)
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST  # the client cancelled, or went away
            raise
        except grpc.aio.AbortError:  # the method ended the call itself (health's NOT_FOUND)
            status = _status_of(call.context)
            raise
        except Exception:
            logger.exception("unhandled error in gRPC %s", call.method)
            return Failure(grpc.StatusCode.INTERNAL, "internal server error")
        else:
            status = 200
            version = getattr(reply, "model_version", "")  # the version that served it
            return reply
        finally:
            self.observe(call, model or "", version, status, time.perf_counter() - began)

    def observe(self, call: Call, model: str, version: str, status: int, seconds: float) -> None:
        """The call's metrics, trace end and access-log line."""
        # A client's string never becomes a label: only the repository's model names.
        label = model if model and self.plane.knows_model(model) else ""
        version = version if label else ""
        trace = call.trace
        trace_id = None if trace is None else trace.trace_id_hex
        self.plane.metrics.observe_request(
            f"grpc:{call.method}", label, version, status, seconds, trace_id
        )
        if trace is not None:
            attributes = {"rpc.grpc.status_code": grpc_code(status).value[0],
                          "triton.model_version": version,
                          "gelu.request_id": request_id.get() or ""}  # fmt: skip
            trace.end(status, attributes, time.perf_counter_ns())
        if wants_access(self.access_log):
            access("grpc", call.method, f"/{call.service}/{call.method}", status, seconds,
                   self.access_log, model=label or None, version=version or None)  # fmt: skip

    async def stream(
        self,
        service: str,
        method: str,
        behavior: Behavior,
        requests: Any,
        context: Any,
        counts_messages: bool = False,
    ) -> AsyncGenerator[Any, None]:
        """The answers of a streaming call (``requests``: one message, or the client's stream
        of them) inside the envelope: its credentials and its share of streams before anything
        is read, each message decoded and within its bound as it is read, a stream of them let
        go once idle (``Quiet``). The call is counted once as it ends, unless the method counts
        each message itself (``counts_messages``; then a failure that is no message's answer,
        an undecodable or idle one, is counted alone)."""
        call = await self.open(service, method, context)
        peer, began = _peer(context), time.perf_counter()
        single = not hasattr(requests, "__aiter__")
        try:
            self.admit(method, call.metadata)
            if single:
                requests = self.decode(call, requests)
                self.fit(requests)
            self.streams.take(peer, unread=single)
        except ServiceError as exc:
            self.observe(call, "", "", exc.status_code, time.perf_counter() - began)
            await _abort(context, grpc_code(exc.status_code), exc.message)
        status = 500
        if not single:
            call.quiet = Quiet(self.stream_idle_seconds)
            requests = self._bounded(requests, call)
        try:
            replies = behavior(requests, call)
            if inspect.isasyncgen(replies):
                async for reply in replies:
                    yield reply
            else:
                await replies  # a method that writes its answers itself (health's Watch)
            status = 200
        except ServiceError as exc:  # a message undecodable, above the bound, or idle; or refused
            status = exc.status_code
            if counts_messages:
                self.observe(call, "", "", status, time.perf_counter() - began)
            await _abort(context, grpc_code(status), exc.message)
        except (asyncio.CancelledError, GeneratorExit):
            status = CLIENT_CLOSED_REQUEST
            raise
        except grpc.aio.AbortError:
            status = _status_of(context)
            raise
        finally:
            self.streams.give(peer, unread=single)
            if not counts_messages:
                self.observe(call, "", "", status, time.perf_counter() - began)

    async def _bounded(self, requests: AsyncIterator[Any], call: Call) -> AsyncGenerator[Any, None]:
        iterator, quiet = aiter(requests), call.quiet
        assert quiet is not None
        while True:
            try:
                request = await quiet.next(iterator)
            except StopAsyncIteration:
                return
            request = self.decode(call, request)
            self.fit(request)
            yield request


def text_metadata(pairs: Iterable[tuple[str, Any]] | None, once: frozenset[str]) -> dict[str, str]:
    """A call's text metadata by key (``-bin`` values are bytes, and carry no credentials);
    ``BadInputError`` for a key of ``once`` that comes more than once (``service.fields``)."""
    pairs = tuple(pairs or ())
    twice = fields.repeated((key for key, _ in pairs), once)
    if twice is not None:
        raise fields.repeated_error(twice)
    return {key: value for key, value in pairs if isinstance(value, str)}


def _status_of(context: Any) -> int:
    """The HTTP equivalent of the status a method ended its call with."""
    code = context.code() if callable(getattr(context, "code", None)) else None
    return 200 if code in (None, grpc.StatusCode.OK) else HTTP_STATUSES.get(code, 500)


async def write_all(context: Any, answers: AsyncGenerator[Any, None]) -> None:
    """Write each of ``answers`` as it comes (grpcio's server); its work still running is let
    go when the call ends."""
    try:
        async for message in answers:
            try:
                await context.write(message)
            except grpc.aio.InternalError:
                # The client went away while it was written; grpcio logs the failed write
                # as an error unless it has seen the client go first, as it does a cancel.
                raise asyncio.CancelledError from None
    finally:
        await answers.aclose()


def enveloped(servicer: Any, service: ServiceDescriptor, envelope: Envelope) -> Any:
    """``servicer`` (a library's: health, reflection) with each method of ``service`` served
    inside ``envelope``, as a caller of its methods (Ray's proxy, a test) gets it."""
    methods: dict[str, Callable[..., Any]] = {}
    for method in service.methods:
        own = getattr(servicer, method.name)
        if method.client_streaming or method.server_streaming:
            methods[method.name] = _streaming(envelope, service.full_name, method.name, own)
        else:
            methods[method.name] = envelope.method(service.full_name, method.name, _given(own))
    return SimpleNamespace(**methods)


def behaviors(servicer: Any, service: ServiceDescriptor) -> dict[str, Behavior]:
    """Each unary method's own work: an ``InferenceServicer``'s core calls (``_Name``), a
    library servicer's methods (health's, reflection's) given the call's context."""
    return {
        method.name: getattr(servicer, f"_{method.name}")
        if isinstance(servicer, InferenceServicer)
        else _given(getattr(servicer, method.name))
        for method in service.methods
        if not (method.client_streaming or method.server_streaming)
    }


def _given(own: Callable[[Any, Any], Awaitable[Any]]) -> Behavior:
    """A library's method (request, context) as a behavior (request, call)."""
    return lambda request, call: own(request, call.context)


def _streaming(
    envelope: Envelope, service: str, name: str, own: Callable[[Any, Any], Any]
) -> Callable[[Any, Any], Awaitable[None]]:
    async def serve(requests: Any, context: Any) -> None:
        answers = envelope.stream(service, name, lambda r, call: own(r, call.context), requests,
                                  context)  # fmt: skip
        await write_all(context, answers)

    return serve


class Window:
    """What a stream has read and not yet answered: at most ``requests`` requests of at most
    ``size`` bytes in all (one request alone always fits: grpcio refuses larger messages)."""

    def __init__(self, requests: int, size: int) -> None:
        self.requests, self.size = requests, size
        self._held = self._bytes = 0
        self._room = asyncio.Event()

    async def take(self, size: int) -> None:
        """Hold a request of ``size`` bytes, once it fits."""
        while self._held and (self._held >= self.requests or self._bytes + size > self.size):
            self._room.clear()
            await self._room.wait()
        self._held += 1
        self._bytes += size

    def give(self, size: int) -> None:
        """A request of ``size`` bytes answered."""
        self._held -= 1
        self._bytes -= size
        self._room.set()


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Each method of the protocol as a call on the core, inside the envelope: the protocol's
    unary methods (``ServerLive``, ...) are built from its descriptor around their core calls
    (``_ServerLive``, ...) below; ``ModelStreamInfer`` and ``stream_answers`` go through it too."""

    def __init__(self, plane: DataPlane, control: ModelControl) -> None:
        self.plane = plane
        self.control = control  # the repository extension, as the composer built it
        self.envelope = envelope = Envelope(plane)
        # Each unary method inside the envelope, as a caller of the methods gets it.
        own = behaviors(self, SERVICE_DESCRIPTOR)
        self.unary = {name: envelope.method(SERVICE, name, own[name]) for name in own}

    # ---- health and metadata ---------------------------------------------------------------------

    async def _ServerLive(self, request: Any, call: Call) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def _ServerReady(self, request: Any, call: Call) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    async def _ModelReady(self, request: Any, call: Call) -> pb.ModelReadyResponse:
        # A model the repository holds but is not ready is ready=false; one it does not hold
        # is NOT_FOUND (Triton answers ready=false to both: an evicted model looked deleted).
        try:
            await self.plane.check_model_ready(request.name, request.version or None)
        except NotReadyError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def _ServerMetadata(self, request: Any, call: Call) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def _ModelMetadata(self, request: Any, call: Call) -> pb.ModelMetadataResponse:
        metadata = self.plane.model_metadata(request.name, request.version or None)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    # ---- inference -------------------------------------------------------------------------------

    async def _ModelInfer(self, request: Any, call: Call) -> pb.ModelInferResponse:
        """One inference request (a ModelInfer call's, or one of a stream's), traced if picked;
        its client's gRPC deadline is the core's timeout when it comes sooner."""
        plane, size = self.plane, request.ByteSize()  # large ones decode off the loop
        trace = None
        if plane.tracing is not None:
            trace = call.trace = self._begin_trace(request, call.metadata, call.method)
        began = time.perf_counter_ns() if trace else 0
        decoded, raw = await plane.codec(size, codec.decode_infer, request)
        decoded.client_deadline_ns = client_deadline(call.context)
        if trace is not None:
            trace.since("decode", began)
            decoded.trace = trace
        result = await plane.infer(request.model_name, request.model_version or None, decoded)
        began = time.perf_counter_ns() if trace else 0
        response: pb.ModelInferResponse = await plane.codec(size, codec.encode_infer, result, raw)
        if trace is not None:
            trace.since("encode", began)
        return response

    def _begin_trace(
        self, request: Any, carrier: dict[str, str], method: str
    ) -> RequestTrace | None:
        """An inference request's trace, if Triton's trace settings pick it and the sampler
        keeps it: a span under the caller's ``traceparent`` metadata, named as
        OpenTelemetry's RPC conventions name it; nothing is built for one sampled out."""
        tracing = self.plane.tracing
        if tracing is None:
            return None
        settings = self.plane.trace_settings
        # Every request picked (the default): the model is looked up only for a sampled one.
        if not settings.every and not settings.pick(self._model(request)):
            return None
        parented = not tracing.fields.isdisjoint(carrier)
        trace = tracing.sample(f"{SERVICE}/{method}", carrier if parented else None)
        if trace is None:
            return None
        model = self._model(request)
        attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
                      "triton.model_name": model}  # fmt: skip
        return trace.open(time.perf_counter_ns(), attributes)

    def _model(self, request: Any) -> str:
        """The request's model, when the repository holds it, else ""."""
        name = request.model_name
        return name if name and self.plane.knows_model(name) else ""

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Triton's streaming inference: ``stream_answers``, each written as it comes."""
        await write_all(context, self.stream_answers(requests, context))

    def stream_answers(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """The answers of a ModelStreamInfer call, inside the envelope (here, and on a Ray
        Serve replica, whose proxy writes them): each request read is started on the core at
        once (so a stream's requests join batches as concurrent calls' do) and answered in the
        order read, a failed one in band (``error_message``, the request's id) unless the client
        asked, as Triton's clients may, for the first failure to end the call
        (``triton_grpc_error``). Each request is counted as a ModelInfer call is.

        Reading pauses while the requests started and not yet answered number
        ``STREAM_WINDOW`` or would hold more than ``GELU_MAX_BODY_BYTES``: HTTP/2's flow
        control then holds the client, and a stream holds no more than a connection does."""
        return self.envelope.stream(SERVICE, "ModelStreamInfer", self._stream_answers, requests,
                                    context, counts_messages=True)  # fmt: skip

    async def _stream_answers(
        self, requests: AsyncIterator[Any], call: Call
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        metadata = call.metadata
        end_on_failure = metadata.get("triton_grpc_error", "").lower() == "true"
        window = Window(STREAM_WINDOW, self.plane.settings.max_body_bytes)
        started: Started = asyncio.Queue()
        reader = asyncio.create_task(self._read_stream(requests, window, started, call))
        try:
            while (item := await started.get()) is not None:
                task, size, request_id = item
                answer = await task
                if not isinstance(answer, Failure):
                    message = pb.ModelStreamInferResponse(infer_response=answer)
                elif end_on_failure:
                    await _abort(call.context, answer.code, answer.message)
                else:
                    message = pb.ModelStreamInferResponse(error_message=answer.message)
                    message.infer_response.id = request_id  # which request it was, as Triton's
                yield message
                window.give(size)  # written: its bytes are no longer held
                if call.quiet is not None:
                    call.quiet.release()
            await reader  # a failed read ends the call with its error
        finally:
            reader.cancel()
            while not started.empty():
                if (item := started.get_nowait()) is not None:
                    item[0].cancel()

    async def _read_stream(
        self,
        requests: AsyncIterator[Any],
        window: Window,
        started: Started,
        call: Call,
    ) -> None:
        """Start each request read on the core, within the window; None once the client is done."""
        try:
            async for request in requests:
                if call.quiet is not None:
                    call.quiet.hold()  # until answered: a client waiting for it is not idle
                size = request.ByteSize()
                await window.take(size)
                answer = self._answer_streamed(request, call)
                started.put_nowait((asyncio.create_task(answer), size, request.id))
        finally:
            started.put_nowait(None)

    async def _answer_streamed(self, request: Any, stream: Call) -> Any:
        """One streamed request's answer, under its own request id (its V2 ``id`` where it
        has a safe one) and, if picked, its own trace under the call's ``traceparent``."""
        request_id.set(new_request_id())
        if request.id:
            adopt_request_id(request.id)
        call = Call(stream.service, stream.method, stream.context, stream.metadata)
        return await self.envelope.answer(call, self._ModelInfer, request, request.model_name,
                                          admit=False)  # fmt: skip

    # ---- Triton's extensions ---------------------------------------------------------------------

    async def _ModelConfig(self, request: Any, call: Call) -> pb.ModelConfigResponse:
        as_json = self.plane.model_config(request.name, request.version or None)
        return pb.ModelConfigResponse(config=json_format.ParseDict(as_json, pb.ModelConfig()))

    async def _ModelStatistics(self, request: Any, call: Call) -> pb.ModelStatisticsResponse:
        stats = self.plane.statistics(request.name or None, request.version or None)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def _TraceSetting(self, request: Any, call: Call) -> pb.TraceSettingResponse:
        model = request.model_name or None
        if model is not None:
            self.plane.model_info(model)  # 404 for a model the repository does not serve
        changes: dict[str, Any] = {}
        for name, value in request.settings.items():
            values = list(value.value)  # none: clear a model's own
            changes[name] = (values if name == "trace_level" else values[0]) if values else None
        settings = self.plane.trace_settings
        now = settings.update(changes, model) if changes else settings.reply(model)
        reply = pb.TraceSettingResponse()
        for name, value in now.items():
            reply.settings[name].value.extend(value if isinstance(value, list) else [value])
        return reply

    async def _LogSettings(self, request: Any, call: Call) -> pb.LogSettingsResponse:
        changes = {
            name: getattr(value, value.WhichOneof("parameter_choice"))
            for name, value in request.settings.items()
            if value.WhichOneof("parameter_choice")
        }
        now = self.plane.logs.update(changes) if changes else self.plane.logs.settings()
        reply = pb.LogSettingsResponse()
        for name, value in now.items():
            kind = "bool_param" if isinstance(value, bool) else (
                "uint32_param" if isinstance(value, int) else "string_param")  # fmt: skip
            setattr(reply.settings[name], kind, value)
        return reply

    async def _RepositoryIndex(self, request: Any, call: Call) -> pb.RepositoryIndexResponse:
        models = await self.control.index(request.ready)
        return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse())

    async def _RepositoryModelLoad(
        self, request: Any, call: Call
    ) -> pb.RepositoryModelLoadResponse:
        await self.control.load(request.model_name, request.parameters)
        return pb.RepositoryModelLoadResponse()

    async def _RepositoryModelUnload(
        self, request: Any, call: Call
    ) -> pb.RepositoryModelUnloadResponse:
        await self.control.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _served(name: str) -> Callable[[InferenceServicer, Any, Any], Awaitable[Any]]:
    """The protocol's unary method ``name``: its core call (``_name``) inside the envelope."""

    async def method(self: InferenceServicer, request: Any, context: Any) -> Any:
        return await self.unary[name](request, context)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{SERVICE}/{name}: ``_{name}`` inside the envelope."
    return method


def _serve_every_method() -> None:
    """Build every unary method of the protocol through the envelope: one without a core call
    here, or without a route class (``ROUTE_CLASSES``), stops the import rather than be served
    outside it."""
    for method in SERVICE_DESCRIPTOR.methods:
        if method.name not in ROUTE_CLASSES:
            raise RuntimeError(f"{SERVICE}/{method.name} has no route class (service.auth.GRPC)")
        if not (method.client_streaming or method.server_streaming):
            getattr(InferenceServicer, f"_{method.name}")  # AttributeError: no core call
            setattr(InferenceServicer, method.name, _served(method.name))


_serve_every_method()


async def _abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str
) -> NoReturn:
    """End the call with ``code`` (grpcio's ``abort`` raises); a call that grpcio's core has
    ended already is cancelled instead."""
    try:
        await context.abort(code, fit_details(message))
    except grpc.aio.InternalError:
        # The core answered first (a message it could not decompress, a client gone) and
        # grpcio saw it too late: it logged an ERROR traceback per such call, a client's
        # way to flood the log. Cancelled is what grpcio says of an ended call.
        raise asyncio.CancelledError from None
    raise AssertionError("unreachable: abort raises")


def fit_details(message: str) -> str:
    """``message``, cut in its middle to at most ``MAX_DETAILS_CHARS`` when longer."""
    if len(message) <= MAX_DETAILS_CHARS:
        return message
    half = MAX_DETAILS_CHARS // 2 - 20  # room for the mark of the cut
    return f"{message[:half]}…({len(message) - 2 * half} characters cut)…{message[-half:]}"


def reflection_pool() -> Any:
    """What reflection describes: the protocol (in its own descriptor pool, see
    ``service/grpc/generate.py``), with health's and reflection's own files added to it."""
    for module in (health_pb2, reflection_pb2):
        try:
            pb.POOL.FindFileByName(module.DESCRIPTOR.name)
        except KeyError:
            pb.POOL.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pb.POOL


class Dispatch(grpc.GenericRpcHandler):
    """Every method of the server's services, by its exact path, each inside the envelope:
    grpcio asks it for each call's handler. A method with one request message is served as its
    client-streaming twin, reading the message within ``read_within`` seconds
    (``Envelope.method``); a stream of requests is the client's to pace.

    Each call's credentials are checked here, before its message is read: a refused client
    costs no memory for what it sends. The class is that of the method the path names exactly,
    never one parsed from the path a client sent (a path that is not exactly a method's has no
    handler: UNIMPLEMENTED); the envelope checks again where the method runs (all that a caller
    skipping grpcio's server gets). The methods are not registered with grpcio one by one: its
    server then waits on one future per registered method for every call it takes."""

    def __init__(
        self,
        envelope: Envelope,
        served: tuple[tuple[ServiceDescriptor, Any, dict[str, Behavior]], ...],
        read_within: float,
    ) -> None:
        self.envelope = envelope
        self.methods: dict[str, tuple[str, str]] = {}
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        for service, servicer, unary in served:
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                self.methods[path] = (service.full_name, method.name)
                streaming = (method.client_streaming, method.server_streaming)
                if method.name in unary:
                    behavior = envelope.method(
                        service.full_name, method.name, unary[method.name], read_within
                    )
                    streaming = (True, False)
                else:
                    behavior = getattr(servicer, method.name)
                # No deserializer: grpcio hands each message over as bytes, and the envelope
                # decodes it (``Envelope.decode``), so that one that is no protobuf is counted,
                # logged and answered INVALID_ARGUMENT as any client mistake; grpcio's own
                # answer was UNKNOWN, naming its exception, with a traceback logged per message.
                self.handlers[path] = HANDLER_KINDS[streaming](
                    behavior,
                    response_serializer=GetMessageClass(method.output_type).SerializeToString,
                )

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler of the method ``details`` names exactly (None: UNIMPLEMENTED), or one
        that refuses the call for its credentials."""
        handler = self.handlers.get(details.method)
        if handler is None:
            return None
        envelope = self.envelope
        if envelope.restrictions is None:  # every class open: nothing to check
            return handler
        service, method = self.methods[details.method]
        try:
            envelope.admit(method, text_metadata(details.invocation_metadata, envelope.once))
        except ServiceError as exc:
            return _refusal(handler, envelope, service, method, exc)
        return handler


HANDLER_KINDS = {  # (request streaming, response streaming): grpcio's handler of that kind
    (False, False): grpc.unary_unary_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _refusal(
    handler: grpc.RpcMethodHandler,
    envelope: Envelope,
    service: str,
    method: str,
    refused: ServiceError,
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that ends the call with ``refused``'s status, reading
    nothing, counted and logged by the envelope."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = await envelope.open(service, method, context)
        envelope.observe(call, "", "", refused.status_code, 0.0)
        await _abort(context, grpc_code(refused.status_code), refused.message)

    make = HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class GrpcServer:
    """grpcio's asyncio server with the inference service, health and reflection, each method
    inside one envelope."""

    def __init__(
        self, plane: DataPlane, control: ModelControl, address: str, share_port: bool = False
    ) -> None:
        self.plane = plane
        self.address = address
        limits = plane.settings
        options = [
            ("grpc.max_receive_message_length", limits.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            # The HTTP face's connection limits, in grpcio's terms: a connection beyond
            # GELU_MAX_CONNECTIONS is closed before its handshake (the client sees UNAVAILABLE),
            # one whose HTTP/2 handshake takes longer than a request's headers may is closed, and
            # one with no call in flight for GELU_KEEP_ALIVE_SECONDS is sent GOAWAY (a client's
            # channel reconnects on its next call). Without them, a client opening connections
            # used up the process's file descriptors, and HTTP stopped answering too.
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            ("grpc.server_handshake_timeout_ms", round(limits.header_timeout_seconds * 1000)),
            ("grpc.max_connection_idle_ms", round(limits.keep_alive_seconds * 1000)),
            # HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: one more call on a connection than the
            # server admits in all (``maximum_concurrent_rpcs``), so that the call past that
            # is refused by the server (RESOURCE_EXHAUSTED), not held by the client. No fewer:
            # it counts unary calls and streams alike, and a client that opens more before it
            # has read the server's SETTINGS has the rest reset (REFUSED_STREAM: UNAVAILABLE;
            # at 100, 620 of 1,024 streams opened at once). Streams are held per connection by
            # the envelope (``Streams``). Unbounded, it left grpcio's rapid-reset defence off
            # (CVE-2023-44487: a reset stream counts until the server has handled it): 20,000
            # streams opened and reset on one connection had other clients' calls CANCELLED.
            ("grpc.max_concurrent_streams", 2 * limits.max_connections + 1),
            # Each worker of `serve --workers N` binds the same port; a lone process must not
            # share its port with another server by accident.
            ("grpc.so_reuseport", 1 if share_port else 0),
        ]
        servicer = InferenceServicer(plane, control)
        envelope = servicer.envelope
        self._health = health.aio.HealthServicer()
        names = (SERVICE, HEALTH_DESCRIPTOR.full_name, reflection.SERVICE_NAME)
        reflecting = reflection.aio.ReflectionServicer(names, pool=reflection_pool())
        # What each service's methods are served by, each inside the envelope, as a caller of
        # the methods (Ray's proxy, a test) gets them.
        self.servicers: dict[str, Any] = {
            SERVICE: servicer,
            HEALTH_DESCRIPTOR.full_name: enveloped(self._health, HEALTH_DESCRIPTOR, envelope),
            REFLECTION_DESCRIPTOR.full_name: enveloped(reflecting, REFLECTION_DESCRIPTOR, envelope),
        }
        own = {SERVICE: servicer, HEALTH_DESCRIPTOR.full_name: self._health,
               REFLECTION_DESCRIPTOR.full_name: reflecting}  # fmt: skip
        self.dispatch = Dispatch(
            envelope,
            tuple(
                (
                    service,
                    self.servicers[service.full_name],
                    behaviors(own[service.full_name], service),
                )
                for service in (SERVICE_DESCRIPTOR, HEALTH_DESCRIPTOR, REFLECTION_DESCRIPTOR)
            ),
            limits.body_timeout_seconds,
        )
        # One HTTP/2 connection carries many calls: as many unary ones in flight as HTTP's
        # connections can carry requests, and as many streams again (``Streams``, which refuses
        # one past its share at once); one more gets RESOURCE_EXHAUSTED before it is read.
        self._server = grpc.aio.server(
            options=options,
            handlers=(self.dispatch,),
            maximum_concurrent_rpcs=2 * limits.max_connections,
        )
        tls = TlsFiles.from_settings(limits)
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError as exc:
            raise StartupError(f"gRPC: cannot bind {address} (GELU_GRPC_PORT): {exc}") from None

    async def start(self) -> None:
        """Serve, reporting the core's readiness to health checks for the server and the
        inference service: SERVING while ready, NOT_SERVING otherwise (from the moment the
        core drains, say)."""
        await self._server.start()
        await self.set_serving(self.plane.ready)
        loop = asyncio.get_running_loop()
        self.plane.on_readiness(
            lambda ready: loop.call_soon_threadsafe(loop.create_task, self.set_serving(ready))
        )
        logger.info("gRPC: %s on %s", SERVICE, self.address)

    async def set_serving(self, serving: bool) -> None:
        """What gRPC health checks report (NOT_SERVING while not ready)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        for name in ("", SERVICE):
            await self._health.set(name, status)

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls, let those in flight finish within ``grace_seconds``."""
        await self.set_serving(False)
        await self._server.stop(grace_seconds)
