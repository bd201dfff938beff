"""How the HTTP routes are registered, and how they reach the serving core.

Routes take the core from the app's state with ``get_plane(request)``. ``add_model_route``
registers one endpoint on a model's path and on its ``/versions/{version}`` form.

The inference and activation routes are ``DirectRoute``s, served by ``DirectRoutes`` ahead of
FastAPI's middleware and routing: under load, FastAPI's and Starlette's layers (error
middleware, telemetry, body limit, exception middleware, exit stack, router, dependency
resolution) cost more per request than a small model's run (py-spy under wrk; see
docs/benchmarks.md). This is the one departure from FastAPI's usual way; a direct route still
gets the service's body limit, metrics and error handler, and is documented in OpenAPI like any
other route. It reads its own query parameters, if it has any, and documents them.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, get_route_path

from service import codecs
from service.dataplane import DataPlane
from service.errors import CLIENT_CLOSED_REQUEST
from service.logs import request_id
from service.rest.body import BodyLimits
from service.rest.middleware import (
    CLIENT_GONE,
    SERVED_VERSION,
    TRACE,
    Receive,
    Scope,
    Send,
    handle_error,
    record_request,
    request_headers,
    request_id_header,
    start_request_id,
)
from service.tracing import RequestTrace

Endpoint = Callable[..., Awaitable[Response]]


def get_plane(request: Request) -> DataPlane:
    """The app's data plane, set by the lifespan."""
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


async def read_body(request: Request) -> bytes:
    """The request's body, as ``await request.body()`` reads it (``ClientDisconnect`` if the
    client leaves first), without Starlette's stream generator: a small body arrives in one
    message, and that generator costs more than the rest of reading it (about 5 µs of 8)."""
    chunks: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            return b"".join([*chunks, body]) if chunks else body
        chunks.append(body)


class Answer(Response):
    """A response of bytes whose headers are already in ASGI's form (``codecs.Headers``), as
    the inference and activation routes answer: Starlette's ``Response`` encodes, lower-cases
    and searches its headers again on every request (about 2 µs for V2's binary answer; this
    takes under 1)."""

    def __init__(self, body: bytes | memoryview, headers: codecs.Headers) -> None:
        self.status_code = 200
        self.body = body
        self.background = None
        self.raw_headers = [(b"content-length", b"%d" % len(body)), *headers]


def header(request: Request, name: bytes) -> str | None:
    """One request header's value (``name`` in lower case), read from the scope as it came,
    without building Starlette's ``Headers``."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class DirectRoute(APIRoute):
    """A route served by ``DirectRoutes``: its endpoint is called with the request and its
    path parameters (as strings) and returns a Response itself. FastAPI sees it only for
    OpenAPI and to answer 405 to other methods."""

    def __init__(self, path: str, endpoint: Endpoint, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        # What is called: the endpoint itself, not the signature-only wrapper of an
        # unversioned path (that is for OpenAPI).
        self.direct_endpoint: Endpoint = getattr(endpoint, "__wrapped__", endpoint)


class DirectRoutes:
    """The app's direct routes, matched and called without FastAPI's per-request layers.

    ``match(scope)`` claims a request (setting its route and path parameters in the scope, as
    Starlette's router does); calling the instance serves it with what the app's middleware
    gives every other route, in one layer: the body limits (``BodyLimits.admit``),
    the request metrics (``record_request``) and the app's one error handler. The
    endpoint's ``Response`` is sent as its status, headers and body, without a ``send``
    wrapper to learn the status.
    """

    def __init__(self, routes: list[BaseRoute], plane: DataPlane) -> None:
        self._routes: list[tuple[re.Pattern[str], set[str], DirectRoute]] = [
            (r.path_regex, r.methods or set(), r) for r in routes if isinstance(r, DirectRoute)
        ]
        settings = plane.settings
        self._limits = BodyLimits(settings.max_body_bytes, settings.max_json_bytes)
        self._metrics, self._known = plane.metrics, plane.knows_model
        self._access_log = settings.access_log
        self._plane = plane
        self._restrictions = plane.restrictions

    def match(self, scope: Scope) -> bool:
        """Whether a direct route serves this request; if so, the scope now says which."""
        if scope["type"] != "http":
            return False
        method, path = scope["method"], get_route_path(scope)
        for regex, methods, route in self._routes:
            if method in methods and (found := regex.match(path)) is not None:
                scope["route"] = route
                scope["path_params"] = found.groupdict()
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics, status, start = self._metrics, 500, time.perf_counter()
        trace = None if self._plane.tracing is None else self._begin_trace(scope)
        metrics.request_started()
        try:
            request = Request(scope, receive)
            try:
                start_request_id(scope)
                if self._restrictions is not None:
                    self._restrictions.check("inference", request_headers(scope))
                admitted = await self._limits.admit(scope, receive)
                if admitted is not receive:
                    request = Request(scope, admitted)
                response = await scope["route"].direct_endpoint(request, **scope["path_params"])
            except Exception as exc:
                response = await handle_error(request, exc)
            status = response.status_code
            headers = [*response.raw_headers, request_id_header()]
            await send({"type": START, "status": status, "headers": headers})
            await send({"type": BODY, "body": response.body})
        except asyncio.CancelledError:
            if scope.get(CLIENT_GONE) and status == 500:
                status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            metrics.request_finished()
            trace_id = None if trace is None else trace.trace_id
            record_request(metrics, self._known, scope, status, start, self._access_log, trace_id)
            if trace is not None:
                trace.end(status, finished_attributes(scope, status), time.perf_counter_ns())

    def _begin_trace(self, scope: Scope) -> RequestTrace | None:
        """The request's trace, if Triton's trace settings pick it: a span under the
        caller's ``traceparent``, named by method and route as OpenTelemetry's HTTP
        conventions name it."""
        name = scope["path_params"].get("name", "")
        model = name if name and self._known(name) else ""
        tracing = self._plane.tracing
        if tracing is None or not self._plane.trace_settings.pick(model):
            return None
        carrier = request_headers(scope)
        route = scope["route"].path
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"],
                      "http.route": route, "triton.model_name": model}  # fmt: skip
        trace = tracing.begin(f"{scope['method']} {route}", carrier, time.perf_counter_ns(),
                              attributes)  # fmt: skip
        if trace is not None:
            scope[TRACE] = trace
        return trace


def finished_attributes(scope: Scope, status: int) -> dict[str, Any]:
    """A traced HTTP request's attributes once answered."""
    return {"http.response.status_code": status, "gelu.request_id": request_id.get() or "",
            "triton.model_version": scope.get(SERVED_VERSION, "")}  # fmt: skip


START, BODY = "http.response.start", "http.response.body"


def _without_version(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with its ``version`` parameter left at its default, so that FastAPI
    documents no ``version`` parameter on the unversioned path."""

    async def unversioned(**kwargs: Any) -> Response:
        return await endpoint(**kwargs)

    signature = inspect.signature(endpoint, eval_str=True)
    parameters = [p for p in signature.parameters.values() if p.name != "version"]
    unversioned.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    unversioned.__name__ = endpoint.__name__
    unversioned.__doc__ = endpoint.__doc__
    unversioned.__wrapped__ = endpoint  # type: ignore[attr-defined]
    return unversioned


def add_model_route(
    router: APIRouter,
    path: str,
    endpoint: Endpoint,
    method: str = "GET",
    direct: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``endpoint`` (which takes ``version: str | None = None``) on ``path`` and on
    ``path`` with ``/versions/{version}`` after ``{name}``; ``direct`` uses DirectRoute."""
    route_class = DirectRoute if direct else APIRoute
    for route_path, function in (
        (path, _without_version(endpoint)),
        (path.replace("{name}", "{name}/versions/{version}"), endpoint),
    ):
        router.add_api_route(
            route_path, function, methods=[method], route_class_override=route_class, **kwargs
        )
