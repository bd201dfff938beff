"""The HTTP face's error handler and pure ASGI middleware: body limit, metrics, start-up
refusals."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service import codecs
from service.errors import PayloadTooLargeError, ServiceError, StartupError
from service.metrics import Metrics

logger = logging.getLogger("gelu_serve")
# Where an endpoint records, in the request's scope, the model version that served it.
SERVED_VERSION = "gelu.served_version"

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
    if isinstance(exc, ServiceError):
        status, message = exc.status_code, exc.message
    elif isinstance(exc, RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        status, message = 400, f"{where}: {first.get('msg', 'invalid')}"
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, ClientDisconnect):  # nobody is left to answer; not our failure
        status, message = 400, "client disconnected before the body was complete"
    else:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        status, message = 500, "internal server error"
    return Response(error_body(message), status_code=status, media_type="application/json")


async def send_error(send: Send, error: ServiceError) -> None:
    body = error_body(error.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """413 for a body above ``max_bytes``: by its Content-Length, or as it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await send_error(send, PayloadTooLargeError(self._message(int(value))))
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise PayloadTooLargeError(self._message(received))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, size: int) -> str:
        return (
            f"body of {size} bytes is above the maximum of {self.max_bytes} (GELU_MAX_BODY_BYTES)"
        )


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

    def __init__(self, app: ASGIApp, metrics: Metrics, known: Callable[[str], bool]) -> None:
        self.app = app
        self.metrics = metrics
        self.known = known  # only a model the repository holds becomes a label value
        # labels() takes a lock and builds a key on each call; keep each label set's children.
        self._children: dict[tuple[str, str, str, int], tuple[Any, Any, Any]] = {}

    def _observe(
        self, endpoint: str, model: str, version: str, status: int, seconds: float
    ) -> None:
        key = (endpoint, model, version, status)
        children = self._children.get(key)
        if children is None:
            metrics, code = self.metrics, str(status)
            children = (
                metrics.requests.labels(endpoint, model, version, code),
                metrics.failures.labels(endpoint, model, version, code) if status >= 400 else None,
                metrics.latency.labels(endpoint, model, version),
            )
            self._children[key] = children
        requests, failures, latency = children
        requests.inc()
        if failures is not None:
            failures.inc()
        latency.observe(seconds)

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
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            # A client's string never becomes a label: only the repository's model names.
            name = scope.get("path_params", {}).get("name", "") if route else ""
            model = name if name and self.known(name) else ""
            # The version that served it, as the endpoint recorded (a repository's version).
            version = scope.get(SERVED_VERSION, "") if model else ""
            self._observe(endpoint, model, version, status, time.perf_counter() - start)
