"""The HTTP face's app factory: ``uvicorn --factory service.rest.app:create_app``.

Nothing is built at import time. The app wraps one serving core (``DataPlane``) and the model
control over it (``ModelControl``), both given by whoever composes the service or built here
when the app is built alone. Its lifespan, the one place outside the host that starts and stops
the core, starts the core before the app accepts requests and stops it after the last one; it
runs where the app is hosted by others (``TestClient``, ``uvicorn --factory``, Ray Serve). Under
``gelu-serve serve`` the host (``service.host``) starts the core and both faces itself, and
uvicorn runs the app without its lifespan.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from service import __version__
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import ServiceError
from service.metrics import OPENMETRICS
from service.rest import activations, v1, v2
from service.rest.body import BodyLimitMiddleware
from service.rest.middleware import (
    Receive,
    Scope,
    Send,
    handle_error,
    quiet_startup_refusal,
)
from service.rest.openapi import add_openapi
from service.rest.routing import DirectRoutes, Envelope, RouteClasses
from service.settings import Settings, load_settings

logger = logging.getLogger("gelu_serve")


class ServiceApp(FastAPI):
    """FastAPI, with every HTTP request in one envelope (``service.rest.routing.Envelope``)
    and the direct routes (inference and activations) served there, ahead of FastAPI's
    middleware stack; see ``service.rest.routing``. Middleware added with ``add_middleware``
    does not see them."""

    envelope: Envelope | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        envelope = self.envelope
        if envelope is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.root_path:  # as FastAPI sets it, before the envelope reads the route path
            scope["root_path"] = self.root_path
        scope["app"] = self
        await envelope(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own middleware stack and router, inside the envelope."""
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    core: DataPlane | None = None,
    control: ModelControl | None = None,
) -> ServiceApp:
    """Build the HTTP face over ``core`` (default: a new one from ``settings``, else from the
    environment) and ``control`` (default: model control over that core). Its lifespan starts
    and stops the core, for hosts that run it (``TestClient``, ``uvicorn --factory``, Ray
    Serve); ``service.host`` serves it without."""
    settings = core.settings if core is not None else settings or load_settings()
    plane = core if core is not None else DataPlane(settings)
    plane.logs.configure(settings.log_level, settings.log_format).install()

    @asynccontextmanager
    async def core_running(app: FastAPI) -> AsyncIterator[None]:
        async with plane.running():
            yield

    app = ServiceApp(
        title="gelu-serve",
        version=__version__,
        description="GELU networks served by onnxruntime: KServe V1 predictions, the Open "
        "Inference Protocol (V2) and raw activation evaluation.",
        lifespan=core_running,
        docs_url=None,
        redoc_url=None,
    )
    app.state.dataplane = plane
    app.state.control = control if control is not None else ModelControl.over(plane)
    add_openapi(app)
    app.include_router(v1.router)
    app.include_router(v2.router)
    app.include_router(activations.router)

    @app.get(
        "/metrics",
        tags=["Operations"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus text format: requests, failures, latency, in-flight, providers, batches;
        OpenMetrics, with traced requests' trace ids as exemplars, to a scraper that asks."""
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            return Response(plane.metrics.exposition(openmetrics=True), media_type=OPENMETRICS)
        return Response(plane.metrics.exposition(), media_type="text/plain; version=0.0.4")

    for exc_class in (
        ServiceError,
        RequestValidationError,
        HTTPException,
        ClientDisconnect,
        Exception,
    ):
        app.add_exception_handler(exc_class, handle_error)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        max_json_bytes=settings.max_json_bytes,
        body_seconds=settings.body_timeout_seconds,
    )
    # The routers are included without a prefix: their routes' paths are the app's.
    direct = [*v1.router.routes, *v2.router.routes, *activations.router.routes]
    # Built last: the classes are those of every route above (an unclassed one stops here).
    app.envelope = Envelope(
        app.routed,
        DirectRoutes(direct, plane),
        RouteClasses(app.router.routes),
        plane.metrics,
        plane.knows_model,
        access_log=settings.access_log,
        restrictions=plane.restrictions,
    )
    # The router handles the lifespan scope; an instance attribute replaces its method there.
    app.router.lifespan = quiet_startup_refusal(app.router.lifespan)  # type: ignore[method-assign,assignment]
    return app
