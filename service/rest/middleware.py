"""The HTTP face's error handler and pure ASGI middleware: body limit, metrics, start-up
refusals."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service import codecs
from service.auth import Restrictions, http_class
from service.errors import (
    CLIENT_CLOSED_REQUEST,
    BadInputError,
    ServiceError,
    StartupError,
)
from service.logs import (
    REQUEST_ID_HEADER,
    access,
    checked_request_id,
    new_request_id,
    request_id,
    wants_access,
)
from service.metrics import Metrics

logger = logging.getLogger("gelu_serve")
# Set in a request's scope when its client went away and its task was cancelled for that
# (service.rest.protocol); such a request is counted with nginx's 499, Client Closed Request.
CLIENT_GONE = "gelu.client_gone"
# Where an endpoint records, in the request's scope, the model version that served it.
SERVED_VERSION = "gelu.served_version"
# A traced request's ``service.tracing.RequestTrace``, for its endpoint's stages.
TRACE = "gelu.trace"
# Whether the client sent an X-Request-ID (a V2 request's own id is adopted when it did not).
REQUEST_ID_GIVEN = "gelu.request_id_given"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(message: str) -> bytes:
    """The one error body: ``{"error": "..."}``."""
    return codecs.dumps({"error": message})


async def handle_error(request: Request, exc: Exception) -> Response:
    """The one error handler: every error body is ``{"error": "..."}``."""
    headers: Mapping[str, str] | None = None
    if isinstance(exc, ServiceError):
        status, message, headers = exc.status_code, exc.message, exc.headers
    elif isinstance(exc, RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        status, message = 400, f"{where}: {first.get('msg', 'invalid')}"
    elif isinstance(exc, HTTPException):  # Starlette's own: 404, 405 (with Allow)
        status, message, headers = exc.status_code, str(exc.detail), exc.headers
    elif isinstance(exc, ClientDisconnect):  # nobody is left to answer; not our failure
        status, message = 400, "client disconnected before the body was complete"
    else:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        status, message = 500, "internal server error"
    return Response(
        error_body(message), status_code=status, headers=headers, media_type="application/json"
    )


async def send_error(send: Send, error: ServiceError) -> None:
    """Answer ``error`` directly on an ASGI ``send``, outside any framework."""
    body = error_body(error.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def quiet_startup_refusal(app: ASGIApp) -> ASGIApp:
    """Wrap a router's lifespan handler so a start-up refusal is one log line, not a traceback.

    Starlette answers a failed lifespan with the exception's full traceback, which uvicorn logs.
    The lifespan has already logged a ``StartupError`` as one line naming what is at fault, so
    uvicorn is told only that start-up failed; any other exception keeps its traceback. Only the
    lifespan is wrapped: requests do not pass through here.
    """

    async def lifespan(scope: Scope, receive: Receive, send: Send) -> None:
        failed: Message | None = None

        async def hold_failure(message: Message) -> None:
            nonlocal failed
            if message["type"] == "lifespan.startup.failed":
                failed = message  # sent below, once we know which exception it was
                return
            await send(message)

        try:
            await app(scope, receive, hold_failure)
        except StartupError:
            await send({"type": "lifespan.startup.failed", "message": ""})
            raise
        except BaseException:
            if failed is not None:
                await send(failed)
            raise

    return lifespan


class MetricsMiddleware:
    """Counts, times and tracks in-flight requests by route template and model (pure ASGI)."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        known: Callable[[str], bool],
        access_log: bool = False,
        restrictions: Restrictions | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.known = known  # only a model the repository holds becomes a label value
        self.access_log = access_log
        self.restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), request_id_header()]
            await send(message)

        self.metrics.request_started()
        try:
            try:
                start_request_id(scope)
                if self.restrictions is not None:
                    route_class = http_class(scope["method"], scope["path"])
                    self.restrictions.check(route_class, request_headers(scope))
            except ServiceError as exc:
                await send_error(send_status, exc)
                return
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            if scope.get(CLIENT_GONE) and status == 500:
                status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            self.metrics.request_finished()
            record_request(self.metrics, self.known, scope, status, start, self.access_log)


def start_request_id(scope: Scope) -> None:
    """Set the request's id, for its log lines and its answer: its X-Request-ID header, else
    a fresh one; ``BadInputError`` (with a fresh one set) for a header that is unsafe."""
    for key, value in scope["headers"]:
        if key == _REQUEST_ID_KEY:
            scope[REQUEST_ID_GIVEN] = True
            try:
                request_id.set(checked_request_id(value.decode("latin-1")))
            except BadInputError:
                request_id.set(new_request_id())
                raise
            return
    scope[REQUEST_ID_GIVEN] = False
    request_id.set(new_request_id())


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of a repeated one)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def request_id_header() -> tuple[bytes, bytes]:
    """The answer's X-Request-ID header: the id of the request being served."""
    return _REQUEST_ID_KEY, (request_id.get() or new_request_id()).encode()


def record_request(
    metrics: Metrics,
    known: Callable[[str], bool],
    scope: Scope,
    status: int,
    start: float,
    access_log: bool = False,
    trace_id: str | None = None,
) -> None:
    """Count and time one answered request (``start``: its ``time.perf_counter()``) by its
    route template, model and served version; only a name ``known`` to the repository becomes
    a model label (a client's string never does)."""
    route = scope.get("route")
    endpoint = getattr(route, "path", "unmatched")
    name = scope.get("path_params", {}).get("name", "") if route else ""
    model = name if name and known(name) else ""
    # The version that served it, as the endpoint recorded (a repository's version).
    version = scope.get(SERVED_VERSION, "") if model else ""
    seconds = time.perf_counter() - start
    metrics.observe_request(endpoint, model, version, status, seconds, trace_id)
    if wants_access(access_log):
        access("http", scope["method"], scope["path"], status, seconds, access_log,
               model=model or None, version=version or None)  # fmt: skip
