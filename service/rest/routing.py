"""How the HTTP routes are registered, and how they reach the serving core.

Routes take the core from the app's state with ``get_plane(request)``, and the repository
routes the model control they were given with ``get_control(request)``. ``add_model_route``
registers one endpoint on a model's path and on its ``/versions/{version}`` form.

The inference and activation routes are ``DirectRoute``s, served by ``DirectRoutes`` ahead of
FastAPI's middleware and routing: under load, FastAPI's and Starlette's layers (error
middleware, telemetry, body limit, exception middleware, exit stack, router, dependency
resolution) cost more per request than a small model's run (docs/performance.md, "Direct
routes", says where that is measured). This is the one departure from FastAPI's usual way; a
direct route still gets the service's body limit and error handler, goes through the one
envelope of every HTTP request (``service.rest.routing.Envelope``), and is documented in
OpenAPI like any other route. It reads its own query parameters, if it has any, and documents
them.

``Envelope`` is that envelope: every HTTP request is opened and closed there once, whichever
route serves it. ``RouteClasses`` classes a request for its credentials by the route the router
dispatches it to (``service.auth``).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, get_route_path

from service import auth, codecs, fields
from service.auth import UNMATCHED, Restrictions
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import CLIENT_CLOSED_REQUEST, ServiceError
from service.logs import request_id
from service.metrics import Metrics
from service.rest.body import BodyLimits
from service.rest.middleware import (
    CLIENT_GONE,
    REFUSED,
    SERVED_VERSION,
    TRACE,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    handle_error,
    open_request,
    record_request,
    request_headers,
    request_id_header,
    send_error,
)
from service.tracing import RequestTrace

Endpoint = Callable[..., Awaitable[Response]]


def get_plane(request: Request) -> DataPlane:
    """The app's data plane, given to ``create_app``."""
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


def get_control(request: Request) -> ModelControl:
    """The app's model control, given to ``create_app`` by whoever composed the service."""
    control: ModelControl = request.app.state.control
    return control


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
        self.route_class = auth.route_class(path)  # KeyError: a route no class names
        # Its span names by method, as OpenTelemetry's HTTP conventions name them.
        self.span_names = {method: f"{method} {path}" for method in self.methods or ()}


class DirectRoutes:
    """The app's direct routes, matched and answered without FastAPI's per-request layers.

    ``match`` claims a request (setting its route and path parameters in the scope, as
    Starlette's router does); the envelope (``Envelope``: request id, credentials, metrics,
    access log, trace, 499, the same as every other route's) then answers it with what the
    app's middleware gives every other route: the body limits (``limits.admit``) and the app's
    one error handler.
    """

    def __init__(self, routes: list[BaseRoute], plane: DataPlane) -> None:
        self._routes: list[tuple[re.Pattern[str], set[str], DirectRoute]] = [
            (r.path_regex, r.methods or set(), r) for r in routes if isinstance(r, DirectRoute)
        ]
        settings = plane.settings
        self.limits = BodyLimits(
            settings.max_body_bytes, settings.max_json_bytes, settings.body_timeout_seconds
        )
        self._known = plane.knows_model
        self.plane = plane

    def match(self, scope: Scope, path: str) -> DirectRoute | None:
        """The direct route that serves this request, whose route path (``get_route_path``)
        is ``path``; the scope then says which, as the router's would."""
        method = scope["method"]
        for regex, methods, route in self._routes:
            if method in methods and (found := regex.match(path)) is not None:
                scope["route"] = route
                scope["path_params"] = found.groupdict()
                return route
        return None

    def begin_trace(self, scope: Scope) -> RequestTrace | None:
        """The matched request's trace, if Triton's trace settings pick it and the sampler
        keeps it: a span under the caller's ``traceparent``, named by method and route as
        OpenTelemetry's HTTP conventions name it. A request sampled out costs the pick, a
        look for the propagators' headers and the sampler's decision; nothing is built."""
        tracing = self.plane.tracing
        if tracing is None:
            return None
        settings = self.plane.trace_settings
        # Every request picked (the default): the model is looked up only for a sampled one.
        if not settings.every and not settings.pick(self._model(scope)):
            return None
        fields = tracing.header_fields
        parented = False
        for key, _ in scope["headers"]:
            if key in fields:
                parented = True
                break
        route: DirectRoute = scope["route"]
        span_name = route.span_names[scope["method"]]
        trace = tracing.sample(span_name, request_headers(scope) if parented else None)
        if trace is None:
            return None
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"],
                      "http.route": route.path,
                      "triton.model_name": self._model(scope)}  # fmt: skip
        scope[TRACE] = trace.open(time.perf_counter_ns(), attributes)
        return trace

    def _model(self, scope: Scope) -> str:
        """The matched request's model, when the repository holds it, else ""."""
        name = scope["path_params"].get("name", "")
        return name if name and self._known(name) else ""


class Classed(NamedTuple):
    """One route of the app, as ``RouteClasses`` matches it."""

    regex: re.Pattern[str]
    methods: frozenset[str]  # empty: every method (a mount)
    route_class: str
    route: BaseRoute


class RouteClasses:
    """Each HTTP request's credentials class (``service.auth``): that of the route the app's
    router dispatches it to.

    Built from the app's own routes, in the router's order (``iter_route_contexts`` walks
    included routers as FastAPI's router and OpenAPI do), each with the regex the router
    compiled for it; a request's route path is ``get_route_path(scope)``, Starlette's own
    (the path less ``root_path``: Starlette GHSA-86qp-5c8j-p5mr, issue 62 item 6). As the
    router: the first route whose path and method match, else the first whose path matches
    (it answers 405), else none: ``UNMATCHED``, which fails closed. Path variants need no
    rules of their own: a double slash, a case change or ``..`` matches what the router
    matches (nothing, or a model name), ``%2F`` and other escapes are decoded by the server
    before either sees the path, and a trailing slash is only a redirect. Building fails for a
    route that ``service.auth.HTTP_ROUTES`` does not class.

    Cost: one anchored regex per route until one matches (the scan the router makes itself),
    each linear in the path; nothing is allocated but the regex's match object.
    """

    def __init__(self, routes: list[BaseRoute]) -> None:
        self.routes: list[Classed] = []
        for context in iter_route_contexts(routes):
            template = context.path
            regex = getattr(context, "path_regex", None)
            if template is None or regex is None:
                raise ValueError(f"{context.original_route!r}: a route without a path to class")
            try:
                route_class = auth.route_class(template)
            except KeyError:
                raise ValueError(
                    f"the route {template} has no credentials class: name it in "
                    "service.auth.HTTP_ROUTES"
                ) from None
            methods = frozenset(context.methods or ())
            self.routes.append(Classed(regex, methods, route_class, context.original_route))

    def match(self, method: str, path: str) -> Classed | None:
        """The route the router dispatches ``method`` on route path ``path`` to, or None."""
        partial = None
        for classed in self.routes:
            if classed.regex.match(path) is not None:
                if not classed.methods or method in classed.methods:
                    return classed
                if partial is None:
                    partial = classed
        return partial


class Envelope:
    """The one envelope of every HTTP request: request id, credentials, metrics, access log,
    trace and the 499 of a client that left, opened and closed here once per request. Before
    any of them, a request that repeats a field the service reads once, or frames its body
    with a Transfer-Encoding other than ``chunked`` alone, is refused (``open_request``).

    ``ServiceApp`` hands it every HTTP request, a direct route's (``DirectRoutes``, answered
    here) as a FastAPI route's (``app``: FastAPI's middleware and router), wherever the app is
    served: ``gelu-serve serve``, ``uvicorn --root-path``, a Ray Serve replica behind its
    ``route_prefix``, an ASGI mount. Credentials are decided once, before the request reaches
    any route, by the class of the route the router will dispatch it to (``RouteClasses``),
    found on the path the router matches (``get_route_path``: the path less ``root_path``).
    Deciding it on ``scope["path"]`` let the control routes answer without the token under a
    root path (issue 62, item 6; Starlette GHSA-86qp-5c8j-p5mr; Triton's CVE-2024-0087 and
    TorchServe's ShellTorch are what an open control or logging route gives away).
    """

    def __init__(
        self,
        app: ASGIApp,
        direct: DirectRoutes,
        classes: RouteClasses,
        metrics: Metrics,
        known: Callable[[str], bool],
        access_log: bool = False,
        restrictions: Restrictions | None = None,
    ) -> None:
        self.app = app
        self.direct = direct
        self.classes = classes
        self.metrics = metrics
        self.known = known  # only a model the repository holds becomes a label value
        self.access_log = access_log
        self.restrictions = restrictions
        # The fields no request may repeat (``service.fields``), as the scope names them.
        self.once = frozenset(name.encode() for name in fields.read_once(restrictions))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics, status, start = self.metrics, 500, time.perf_counter()
        direct = self.direct
        route = direct.match(scope, get_route_path(scope))
        trace = None
        metrics.request_started()
        try:
            try:
                open_request(scope, self.once)
                # Traced from here: a request refused above has no one parent to trace under.
                if route is not None and direct.plane.tracing is not None:
                    trace = direct.begin_trace(scope)
                if self.restrictions is not None:
                    self._check(scope, route, self.restrictions)
            except ServiceError as exc:
                status = exc.status_code
                await send_error(send, exc, request_id_header())
                return
            if route is not None:  # answered here: a coroutine frame fewer per request
                request = Request(scope, receive)
                try:
                    admitted = await direct.limits.admit(scope, receive)
                    if admitted is not receive:
                        request = Request(scope, admitted)
                    response = await route.direct_endpoint(request, **scope["path_params"])
                except Exception as exc:
                    response = await handle_error(request, exc)
                status = response.status_code
                headers = [*response.raw_headers, request_id_header()]
                await send({"type": START, "status": status, "headers": headers})
                await send({"type": BODY, "body": response.body})
                return

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == START:
                    status = message["status"]
                    message["headers"] = [*message.get("headers", ()), request_id_header()]
                await send(message)

            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            if not scope.get(CLIENT_GONE):
                raise  # a shutdown's cancellation
            # The connection cancelled the request of a client that has gone (see
            # service.rest.protocol): nobody is left to answer; it is counted with nginx's 499,
            # or with the status the connection refused it with before closing (a slow body's
            # 408), as gRPC counts its own.
            if status == 500:
                status = scope.get(REFUSED, CLIENT_CLOSED_REQUEST)
        finally:
            metrics.request_finished()
            trace_id = None if trace is None else trace.trace_id_hex
            record_request(metrics, self.known, scope, status, start, self.access_log, trace_id)
            if trace is not None:
                trace.end(status, finished_attributes(scope, status), time.perf_counter_ns())

    def _check(self, scope: Scope, route: DirectRoute | None, restrictions: Restrictions) -> None:
        """The request's credentials, for the class of the route it is dispatched to."""
        if route is not None:
            restrictions.check(route.route_class, request_headers(scope))
            return
        classed = self.classes.match(scope["method"], get_route_path(scope))
        try:
            route_class = UNMATCHED if classed is None else classed.route_class
            restrictions.check(route_class, request_headers(scope))
        except ServiceError:
            if classed is not None:
                scope["route"] = classed.route  # its refusals are counted under its template
            raise


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
