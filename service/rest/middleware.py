"""The HTTP face's error handler and pure ASGI middleware: body limit, metrics, start-up
refusals."""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import anyio.to_thread
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service import codecs
from service.auth import Restrictions, http_class
from service.errors import (
    CLIENT_CLOSED_REQUEST,
    BadInputError,
    PayloadTooLargeError,
    ServiceError,
    StartupError,
    UnsupportedMediaError,
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


class BodyLimits:
    """Request bodies within their limits, and compressed ones decoded.

    A binary body (``application/octet-stream``, or a V2 request with
    ``Inference-Header-Content-Length``) may be up to ``max_bytes``; any other body is JSON,
    whose parsing costs many times its size, and may be up to ``max_json_bytes`` (as may a V2
    binary request's JSON header). A body above its limit gets 413: by its Content-Length
    before it is read, or as it streams in. A ``Content-Encoding: gzip`` or ``deflate`` body
    (tritonclient's request compression) is read whole, decompressed within the same limits (a
    decompression bomb stops at the limit, 413) and handed on decoded; another encoding is 415.
    """

    def __init__(self, max_bytes: int, max_json_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_json_bytes = min(max_json_bytes, max_bytes)
        self.json_variable = (
            "GELU_MAX_JSON_BYTES; send large tensors in a binary form"
            if max_json_bytes < max_bytes
            else "GELU_MAX_BODY_BYTES"
        )

    async def admit(self, scope: Scope, receive: Receive) -> Receive:
        """The ``receive`` that gives the request's body within its limits: ``receive`` itself
        when its Content-Length is within them, one that counts (413 as the body streams past
        the limit) when there is none, or one that replays the decoded body of a compressed
        request, whose headers in ``scope`` then describe the decoded body. Raises
        ``ServiceError`` (413, 415, 400) for a body that cannot be admitted."""
        binary, length, encoding = False, None, None
        for key, value in scope["headers"]:
            if key == b"content-type":
                binary = binary or value.startswith(b"application/octet-stream")
            elif key == codecs.HEADER_LENGTH_KEY:
                binary = True
                header = codecs.client_size(value)
                if header is not None and header > self.max_json_bytes:
                    raise self._too_large(header, "JSON header")
            elif key == b"content-length":
                length = codecs.client_size(value)
            elif key == b"content-encoding" and value.lower() != b"identity":
                encoding = value.lower()
        limit = self.max_bytes if binary else self.max_json_bytes
        what = "body" if binary else "JSON body"
        if length is not None and length > limit:
            raise self._too_large(length, what, limit)
        if length is not None and encoding is None:
            # HTTP/1.1 framing: the server hands on at most Content-Length bytes of body.
            return receive
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise self._too_large(received, what, limit)
            return message

        if encoding is None:
            return limited_receive
        decoded = await self._decode(encoding, limited_receive, limit, what)
        describe_decoded(scope, len(decoded))
        return replay(decoded)

    async def _decode(self, encoding: bytes, receive: Receive, limit: int, what: str) -> bytes:
        if encoding not in DECODERS:
            raise UnsupportedMediaError(
                f"Content-Encoding {encoding.decode(errors='replace')!r} is not supported; "
                "send gzip, deflate or identity"
            )
        compressed = await read_body(receive)
        if len(compressed) <= INLINE_DECODE_BYTES:
            return decompress(encoding, compressed, limit, what)
        return await anyio.to_thread.run_sync(decompress, encoding, compressed, limit, what)

    def _too_large(self, size: int, what: str, limit: int | None = None) -> PayloadTooLargeError:
        variable = "GELU_MAX_BODY_BYTES" if what == "body" else self.json_variable
        amount = f"{size} bytes" if size < 1 << 62 else "over 10**18 bytes"
        return PayloadTooLargeError(
            f"{what} of {amount} is above the maximum of {limit or self.max_json_bytes} "
            f"({variable})"
        )


class BodyLimitMiddleware:
    """``BodyLimits`` as pure ASGI middleware; a body they refuse is answered here."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_json_bytes: int) -> None:
        self.app = app
        self.limits = BodyLimits(max_bytes, max_json_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self.limits.admit(scope, receive)
        except ServiceError as exc:
            await send_error(send, exc)
            return
        await self.app(scope, receive, send)


# Compressed bodies up to this size are decompressed on the event loop (well under a
# millisecond); larger ones on a worker thread.
INLINE_DECODE_BYTES = 64 * 1024
# zlib's wbits for each Content-Encoding: gzip's header, or zlib's (deflate as HTTP means it).
GZIP, ZLIB = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS
DECODERS = {b"gzip": GZIP, b"x-gzip": GZIP, b"deflate": ZLIB}


def decompress(encoding: bytes, data: bytes, limit: int, what: str) -> bytes:
    """``data`` decoded, never producing more than ``limit`` bytes (413 beyond)."""
    decoder = zlib.decompressobj(DECODERS[encoding])
    try:
        decoded = decoder.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadInputError(f"body is not valid {encoding.decode()} data: {exc}") from None
    if len(decoded) > limit or decoder.unconsumed_tail:
        raise PayloadTooLargeError(f"{what} decompresses to more than the maximum of {limit} bytes")
    if not decoder.eof:
        raise BadInputError(f"body is truncated {encoding.decode()} data")
    return decoded


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ``receive``."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def describe_decoded(scope: Scope, length: int) -> None:
    """Make ``scope``'s headers describe the decoded body: no Content-Encoding, its
    Content-Length. In place, so that what the app later records in the scope (the served
    version) is seen by the layers around it."""
    headers = [
        (k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")
    ]
    headers.append((b"content-length", str(length).encode()))
    scope["headers"] = headers


def replay(body: bytes) -> Receive:
    """A ``receive`` that gives ``body`` as one message, then waits for the disconnect."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # as a server does: nothing more until the client goes
        raise AssertionError("unreachable")

    return receive


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
