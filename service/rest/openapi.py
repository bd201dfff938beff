"""The OpenAPI document, and its UIs ``/docs`` (Swagger UI) and ``/redoc`` with no network.

The document tells the truth: FastAPI documents a 422 on every operation with parameters, but
this service answers every client mistake with 400 (or 404/413) and ``{"error": "..."}``, so
the 422s and their schemas are taken out; each route declares its own error statuses and
binary forms (``service.rest.schemas.responses``).

FastAPI's UIs load from a CDN: a blank page on an air-gapped host. The assets come from the
``fastapi-offline`` package instead (installed with the service) and are served here, and the
pages are told not to reach out (no validator badge, no web fonts).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

ASSETS_URL = "/docs-assets"
ASSETS = files("fastapi_offline") / "static"


def add_openapi(app: FastAPI) -> None:
    """The truthful OpenAPI document at ``/openapi.json``; ``/docs``, ``/redoc`` and their
    assets from this process."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            for path in schema["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    app.mount(ASSETS_URL, WholeFiles(StaticFiles(directory=str(ASSETS))), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            # Swagger UI's validator badge is an image from validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )


RANGE_HEADERS = (b"range", b"if-range")


class WholeFiles:
    """Static files answered whole: a request's ``Range`` is not read (RFC 9110 lets a server
    ignore it) and no ``Accept-Ranges`` is offered. The assets are a few MiB; parsing a client's
    ranges is what Starlette CVE-2025-62727 made cost quadratic time, and its 400 and 416
    answers are plain text or empty, outside the one error shape."""

    def __init__(self, app: StaticFiles) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in RANGE_HEADERS]

        async def whole(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message["headers"] if k.lower() != b"accept-ranges"]
                message = {**message, "headers": kept}
            await send(message)

        await self.app({**scope, "headers": headers}, receive, whole)
