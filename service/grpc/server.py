"""The gRPC face: the Open Inference Protocol's ``inference.GRPCInferenceService`` over the
serving core, with gRPC health checking and server reflection.

One ``GrpcServer`` runs beside the HTTP face in the same process and event loop (grpcio's
asyncio server), on ``GELU_GRPC_PORT``, started and stopped with the core by the app's
lifespan. Every method translates to the same ``DataPlane`` call the HTTP routes make, so both
protocols get the same checks, limits, batches (requests of both form shared batches),
statistics and metrics (Triton's ModelStreamInfer takes many requests on one call, each
answered as ModelInfer would answer it); a ``ServiceError`` becomes one gRPC status
(``STATUS_CODES``) with its message. The HTTP face's connection limits hold here too, in
grpcio's terms (``GrpcServer``, ``ReadWithin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, NoReturn, TypeVar

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.auth import GRPC as GRPC_CLASSES
from service.auth import Restrictions
from service.dataplane import DataPlane
from service.errors import (
    CLIENT_CLOSED_REQUEST,
    NotFoundError,
    NotReadyError,
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
SERVICE = "inference.GRPCInferenceService"
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
# The one mapping from the core's errors (their HTTP status) to gRPC status codes.
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}


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
Reply = TypeVar("Reply")
Started = asyncio.Queue[tuple[asyncio.Task[Any], int, str] | None]  # a stream's, in order


class Failure(NamedTuple):
    """A call's failure: its gRPC status code and message."""

    code: grpc.StatusCode
    message: str


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
    """Each method of the protocol as a call on the core."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.access_log = plane.settings.access_log

    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        handler: Awaitable[Reply],
        model: str = "",
        trace: RequestTrace | None = None,
    ) -> Reply:
        """Await ``handler`` (``_answer``) under the call's request id (its ``x-request-id``
        metadata, else a fresh one, returned in the trailing metadata); a failure ends the
        call with its status code."""
        given = None
        for key, value in context.invocation_metadata() or ():
            if key == REQUEST_ID_HEADER:
                given = value
        try:
            request_id.set(checked_request_id(given))
        except ServiceError as exc:
            handler.close()  # type: ignore[attr-defined]  # a coroutine never awaited
            request_id.set(new_request_id())
            context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id.get()),))
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id.get()),))
        answer = await self._answer(method, handler, model, trace)
        if isinstance(answer, Failure):
            await _abort(context, answer.code, answer.message)
        return answer

    async def _answer(
        self,
        method: str,
        handler: Awaitable[Reply],
        model: str,
        trace: RequestTrace | None = None,
    ) -> Reply | Failure:
        """Await ``handler``; count and time it as the HTTP face does (endpoint ``grpc:Method``,
        the status as its HTTP equivalent); a ``ServiceError`` (or a bug) becomes a ``Failure``
        with its status code and message."""
        status, began, version = 500, time.perf_counter(), ""
        try:
            reply = await handler
        except ServiceError as exc:
            status = exc.status_code
            return Failure(STATUS_CODES.get(status, grpc.StatusCode.INTERNAL), exc.message)
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST  # the client cancelled, or went away
            raise
        except Exception:
            logger.exception("unhandled error in gRPC %s", method)
            return Failure(grpc.StatusCode.INTERNAL, "internal server error")
        else:
            status = 200
            version = getattr(reply, "model_version", "")  # the version that served it
            return reply
        finally:
            # A client's string never becomes a label: only the repository's model names.
            label = model if model and self.plane.knows_model(model) else ""
            version = version if label else ""
            seconds = time.perf_counter() - began
            trace_id = None if trace is None else trace.trace_id
            self.plane.metrics.observe_request(
                f"grpc:{method}", label, version, status, seconds, trace_id
            )
            if trace is not None:
                attributes = {"rpc.grpc.status_code": grpc_code(status).value[0],
                              "triton.model_version": version,
                              "gelu.request_id": request_id.get() or ""}  # fmt: skip
                trace.end(status, attributes, time.perf_counter_ns())
            if wants_access(self.access_log):
                access("grpc", method, f"/inference.GRPCInferenceService/{method}", status,
                       seconds, self.access_log, model=label or None,
                       version=version or None)  # fmt: skip

    # The protocol's methods (grpcio's names); each is the core call below it, through _call.

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return await self._call("ServerLive", context, self._live())

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return await self._call("ServerReady", context, self._ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return await self._call("ModelReady", context, self._model_ready(request), request.name)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return await self._call("ServerMetadata", context, self._server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        metadata = self._model_metadata(request)
        return await self._call("ModelMetadata", context, metadata, request.name)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        trace = None
        if self.plane.tracing is not None:
            trace = self._begin_trace(request, dict(context.invocation_metadata() or ()))
        infer = self._infer(request, trace)
        return await self._call("ModelInfer", context, infer, request.model_name, trace)

    # ModelStreamInfer, a stream of calls rather than one, is with inference below.

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._call("ModelConfig", context, self._config(request), request.name)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        statistics = self._statistics(request)
        return await self._call("ModelStatistics", context, statistics, request.name)

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        setting = self._trace_setting(request, context)
        return await self._call("TraceSetting", context, setting, request.model_name)

    async def LogSettings(self, request: Any, context: Any) -> Any:
        return await self._call("LogSettings", context, self._log_settings(request, context))

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return await self._call("RepositoryIndex", context, self._index(request, context))

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        load = self._load(request, context)
        return await self._call("RepositoryModelLoad", context, load, request.model_name)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        unload = self._unload(request, context)
        return await self._call("RepositoryModelUnload", context, unload, request.model_name)

    # ---- health and metadata ---------------------------------------------------------------------

    async def _live(self) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def _ready(self) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    async def _model_ready(self, request: Any) -> pb.ModelReadyResponse:
        # As Triton's gRPC face: an unknown or unready model is ready=false, not an error.
        try:
            self.plane.model(request.name, request.version or None)
        except (NotFoundError, NotReadyError):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def _server_metadata(self) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def _model_metadata(self, request: Any) -> pb.ModelMetadataResponse:
        metadata = self.plane.model_metadata(request.name, request.version or None)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    # ---- inference -------------------------------------------------------------------------------

    async def _infer(
        self, request: Any, trace: RequestTrace | None = None
    ) -> pb.ModelInferResponse:
        plane, size = self.plane, request.ByteSize()  # large ones decode off the loop
        began = time.perf_counter_ns() if trace else 0
        decoded, raw = await plane.codec(size, codec.decode_infer, request)
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
        self, request: Any, carrier: dict[str, str], method: str = "ModelInfer"
    ) -> RequestTrace | None:
        """An inference request's trace, if Triton's trace settings pick it: a span under the
        caller's ``traceparent`` metadata, named as OpenTelemetry's RPC conventions name it."""
        name = request.model_name
        model = name if name and self.plane.knows_model(name) else ""
        tracing = self.plane.tracing
        if tracing is None or not self.plane.trace_settings.pick(model):
            return None
        attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
                      "triton.model_name": model}  # fmt: skip
        return tracing.begin(f"{SERVICE}/{method}", carrier, time.perf_counter_ns(), attributes)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Triton's streaming inference: ``stream_answers``, each written as it comes."""
        answers = self.stream_answers(requests, context)
        try:
            async for message in answers:
                try:
                    await context.write(message)
                except grpc.aio.InternalError:
                    # The client went away while it was written; grpcio logs the failed write
                    # as an error unless it has seen the client go first, as it does a cancel.
                    raise asyncio.CancelledError from None
        finally:
            await answers.aclose()  # its requests still running are let go now

    async def stream_answers(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """The answers of a ModelStreamInfer call (here, and on a Ray Serve replica, whose
        proxy writes them): each request read is started on the core at once (so a
        stream's requests join batches as concurrent calls' do) and answered in the order read,
        a failed one in band (``error_message``, the request's id) unless the client asked, as
        Triton's clients may, for the first failure to end the call (``triton_grpc_error``).
        Reading stops while the requests started and not yet answered number
        ``STREAM_WINDOW`` or would hold more than ``GELU_MAX_BODY_BYTES``: HTTP/2's flow
        control then holds the client, and a stream holds no more than a connection does."""
        metadata = dict(context.invocation_metadata() or ())
        end_on_failure = metadata.get("triton_grpc_error", "").lower() == "true"
        window = Window(STREAM_WINDOW, self.plane.settings.max_body_bytes)
        started: Started = asyncio.Queue()
        reader = asyncio.create_task(self._read_stream(requests, window, started, metadata))
        try:
            while (item := await started.get()) is not None:
                task, size, request_id = item
                answer = await task
                if not isinstance(answer, Failure):
                    message = pb.ModelStreamInferResponse(infer_response=answer)
                elif end_on_failure:
                    await _abort(context, answer.code, answer.message)
                else:
                    message = pb.ModelStreamInferResponse(error_message=answer.message)
                    message.infer_response.id = request_id  # which request it was, as Triton's
                yield message
                window.give(size)  # written: its bytes are no longer held
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
        metadata: dict[str, str],
    ) -> None:
        """Start each request read on the core, within the window; None once the client is done."""
        try:
            async for request in requests:
                size = request.ByteSize()
                await window.take(size)
                answer = self._answer_streamed(request, metadata)
                started.put_nowait((asyncio.create_task(answer), size, request.id))
        finally:
            started.put_nowait(None)

    async def _answer_streamed(self, request: Any, metadata: dict[str, str]) -> Any:
        """One streamed request's answer, under its own request id (its V2 ``id`` where it
        has a safe one) and, if picked, its own trace under the call's ``traceparent``."""
        request_id.set(new_request_id())
        if request.id:
            adopt_request_id(request.id)
        trace = None
        if self.plane.tracing is not None:
            trace = self._begin_trace(request, metadata, "ModelStreamInfer")
        infer = self._infer(request, trace)
        return await self._answer("ModelStreamInfer", infer, request.model_name, trace)

    # ---- Triton's extensions ---------------------------------------------------------------------

    async def _config(self, request: Any) -> pb.ModelConfigResponse:
        as_json = self.plane.model_config(request.name, request.version or None)
        return pb.ModelConfigResponse(config=json_format.ParseDict(as_json, pb.ModelConfig()))

    async def _statistics(self, request: Any) -> pb.ModelStatisticsResponse:
        stats = self.plane.statistics(request.name or None, request.version or None)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def _trace_setting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
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

    async def _log_settings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
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

    async def _index(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        models = self.plane.control.index(request.ready)
        return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse())

    async def _load(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:
        await self.plane.control.load(request.model_name, request.parameters)
        return pb.RepositoryModelLoadResponse()

    async def _unload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:
        await self.plane.control.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


async def _abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str
) -> NoReturn:
    """End the call with ``code`` (grpcio's ``abort`` raises)."""
    await context.abort(code, fit_details(message))
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
    from grpc_reflection.v1alpha import reflection_pb2

    for module in (health_pb2, reflection_pb2):
        try:
            pb.POOL.FindFileByName(module.DESCRIPTOR.name)
        except KeyError:
            pb.POOL.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pb.POOL


class ReadWithin(grpc.aio.ServerInterceptor):
    """A call with one request message gets it within ``seconds`` of its start, or ends with
    DEADLINE_EXCEEDED: grpcio would wait for it as long as the connection lives, one of the calls
    in flight (``maximum_concurrent_rpcs``) held all the while, as HTTP's slow bodies would hold
    connections without GELU_BODY_TIMEOUT_SECONDS. Each such method is served as its
    client-streaming twin, which reads the message itself (the wire is the same); a stream of
    requests is the client's to pace."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # One per method of the server's services, built on its first call.
        self._twins: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        twin = self._twins.get(details.method)
        if twin is not None:
            return twin
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            # Unknown (UNIMPLEMENTED), or a stream: ModelStreamInfer, health's Watch, reflection.
            return handler
        twin = self._twins[details.method] = grpc.stream_unary_rpc_method_handler(
            self._reading(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        return twin

    def _reading(self, behavior: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        seconds = self.seconds

        async def read_then_answer(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async with asyncio.timeout(seconds):
                    request = await context.read()
            except TimeoutError:
                message = f"no request message within {seconds:g} s (GELU_BODY_TIMEOUT_SECONDS)"
                await _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, message)
            if request is grpc.aio.EOF:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "no request message")
            return await behavior(request, context)

        return read_then_answer


class Restrict(grpc.aio.ServerInterceptor):
    """Each call checked against GELU_RESTRICTED_API's classes (``service.auth``), from its
    metadata, before its method runs: UNAUTHENTICATED or PERMISSION_DENIED otherwise."""

    def __init__(self, restrictions: Restrictions) -> None:
        self.restrictions = restrictions

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        route_class = GRPC_CLASSES.get(details.method.rsplit("/", 1)[-1], "metadata")
        if handler is None or not self.restrictions.restricts(route_class):
            return handler
        metadata = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        try:
            self.restrictions.check(route_class, metadata)
        except ServiceError as exc:
            return _refusal(handler, STATUS_CODES[exc.status_code], exc.message)
        return handler


def _refusal(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that ends the call with ``code``, reading nothing."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, code, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class GrpcServer:
    """grpcio's asyncio server with the inference service, health and reflection."""

    def __init__(self, plane: DataPlane, address: str, share_port: bool = False) -> None:
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
            # Each worker of `serve --workers N` binds the same port; a lone process must not
            # share its port with another server by accident.
            ("grpc.so_reuseport", 1 if share_port else 0),
        ]
        # One HTTP/2 connection carries many calls: as many in flight as HTTP's connections
        # can carry requests; one more gets RESOURCE_EXHAUSTED before its message is read.
        interceptors: list[grpc.aio.ServerInterceptor] = [ReadWithin(limits.body_timeout_seconds)]
        if plane.restrictions is not None:
            interceptors.insert(0, Restrict(plane.restrictions))
        self._server = grpc.aio.server(
            options=options,
            interceptors=interceptors,
            maximum_concurrent_rpcs=limits.max_connections,
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        names = (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection(
            (*names, reflection.SERVICE_NAME), self._server, pool=reflection_pool()
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
        """Serve, reporting SERVING for the server and the inference service (NOT_SERVING
        from the moment the core drains)."""
        await self._server.start()
        await self.set_serving(True)
        loop = asyncio.get_running_loop()
        self.plane.on_drain(
            lambda: loop.call_soon_threadsafe(loop.create_task, self.set_serving(False))
        )
        logger.info("gRPC: %s on %s", SERVICE, self.address)

    async def set_serving(self, serving: bool) -> None:
        """What gRPC health checks report (NOT_SERVING while draining)."""
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
