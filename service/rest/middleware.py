"""The HTTP face's error handler, the pieces of the request envelope
(``service.rest.routing.Envelope``: request id, metrics, access log) and the lifespan's
start-up refusals."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service import codecs
from service.errors import (
    BadInputError,
    ServiceError,
    StartupError,
)
from service.fields import repeated_error
from service.logs import (
    REQUEST_ID_HEADER,
    access,
    checked_request_id,
    escape,
    new_request_id,
    request_id,
    wants_access,
)
from service.metrics import Metrics

logger = logging.getLogger("gelu_serve")
# Set in a request's scope when its client went away and its task was cancelled for that
# (service.rest.protocol); such a request is counted with nginx's 499, Client Closed Request.
CLIENT_GONE = "gelu.client_gone"
# Set with the status the connection refused a request with mid-way (408 for a body too slow,
# 413, 431) before closing it: counted with that status, not as a client that left.
REFUSED = "gelu.refused"
# Set by a server that holds a request's body to GELU_BODY_TIMEOUT_SECONDS itself
# (service.rest.protocol); where it is absent (Ray Serve's proxy) the app holds the body to it.
BODY_TIMED = "gelu.body_timed"
# Where an endpoint records, in the request's scope, the model version that served it.
SERVED_VERSION = "gelu.served_version"
# A traced request's ``service.tracing.RequestTrace``, for its endpoint's stages.
TRACE = "gelu.trace"
# Whether the client sent an X-Request-ID (a V2 request's own id is adopted when it did not).
REQUEST_ID_GIVEN = "gelu.request_id_given"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
TRANSFER_ENCODING, CHUNKED = b"transfer-encoding", b"chunked"

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
        logger.exception("unhandled error on %s %s", request.method, escape(request.url.path))
        status, message = 500, "internal server error"
    return Response(
        error_body(message), status_code=status, headers=headers, media_type="application/json"
    )


async def send_error(send: Send, error: ServiceError, *extra: tuple[bytes, bytes]) -> None:
    """Answer ``error`` directly on an ASGI ``send``, outside any framework (with ``extra``
    headers)."""
    body = error_body(error.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    headers += extra
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


def open_request(scope: Scope, once: frozenset[bytes]) -> None:
    """Set the request's id, for its log lines and its answer: its X-Request-ID header, else
    a fresh one. Raise, with a fresh id set where the request's own cannot be, for a request
    that is ambiguous before any route reads it: a field of ``once`` (``service.fields``) sent
    more than once, an unsafe X-Request-ID (``BadInputError``), or a Transfer-Encoding other
    than ``chunked`` alone (``transfer_coding_refusal``). One pass over the headers (``once``
    holds X-Request-ID)."""
    given: bytes | None = None
    seen: set[bytes] = set()
    codings: list[bytes] | None = None
    for key, value in scope["headers"]:
        if key in once:
            if key in seen:
                request_id.set(new_request_id())
                raise repeated_error(key)
            seen.add(key)
            if key == _REQUEST_ID_KEY:
                given = value
        elif key == TRANSFER_ENCODING:
            codings = [value] if codings is None else [*codings, value]
    scope[REQUEST_ID_GIVEN] = given is not None
    if given is None:
        request_id.set(new_request_id())
    else:
        try:
            request_id.set(checked_request_id(given.decode("latin-1")))
        except BadInputError:
            request_id.set(new_request_id())
            raise
    if codings:
        refusal = transfer_coding_refusal(codings)
        if refusal is not None:
            raise refusal


def transfer_coding_refusal(lines: list[bytes]) -> ServiceError | None:
    """The refusal of a request whose Transfer-Encoding field lines are ``lines``, or None
    for the one form read without doubt: one line, exactly ``chunked``; any other is 400 and
    closes the connection (a front end that read the framing otherwise would take what follows
    for a request). RFC 9112 6.1 suggests 501 for a coding the server does not implement (h11
    answers so); here every client's mistake is a 4xx, as a proxy counts it.

    httptools reads ``gzip, chunked``, ``Chunked`` and ``identity, chunked`` as a chunked
    body, dropping the other codings, which a proxy may have applied or ignored (gunicorn's
    CVE-2024-1135 and CVE-2024-6827: Transfer-Encoding read unlike the proxy's, requests
    smuggled past its restrictions)."""
    if lines == [CHUNKED]:
        return None
    close = {"Connection": "close"}
    codings = [c.strip(b" \t").lower() for line in lines for c in line.split(b",")]
    other = sorted({c.decode("latin-1") for c in codings if c and c != CHUNKED})
    if other:
        return BadInputError(
            f"Transfer-Encoding {', '.join(map(repr, other))} is not implemented: send "
            "'Transfer-Encoding: chunked' alone, or a Content-Length",
            close,
        )
    return BadInputError(
        "Transfer-Encoding must be one field line reading exactly 'chunked' (lower case, once)",
        close,
    )


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (a field the service reads is never repeated:
    ``open_request`` refused such a request)."""
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
