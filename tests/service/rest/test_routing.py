"""Routes and their credentials classes: a request is classed by the route the router
dispatches it to, under any root path and for any spelling of its path (issue 62, item 6;
Starlette GHSA-86qp-5c8j-p5mr)."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from typing import Any
from urllib.parse import unquote

import pytest
from fastapi import APIRouter
from starlette.routing import get_route_path

from service.auth import UNMATCHED
from service.rest.app import ServiceApp, create_app
from service.rest.routing import RouteClasses

pytestmark = pytest.mark.anyio
TOKEN = "0123456789abcdef-token"
# Spellings of the control routes' paths (and others) a client may try: the router's own
# decision on each is what the classes must agree with.
VARIANTS = [
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/repository/models/digits-mlp/unload"),
    ("GET", "//v2/logging"),
    ("GET", "/v2//logging"),
    ("GET", "/v2/logging/"),
    ("GET", "/V2/logging"),
    ("GET", "/v2/LOGGING"),
    ("GET", "/v2/x/../logging"),
    ("GET", "/v2/./logging"),
    ("GET", "/v2%2Flogging"),
    ("GET", "/v2/%6Cogging"),
    ("GET", "/%76%32/logging"),
    ("GET", "/v2/logging%0A"),
    ("GET", "/v2/logging%0D%0A"),
    ("GET", "/v2/logging%00"),
    ("GET", "/v2/logging%20"),
    ("GET", "/v2/logging;x=1"),
    ("GET", "/v2/logging?x=1"),
    ("HEAD", "/v2/logging"),
    ("PUT", "/v2/logging"),
    ("POST", "/v2/repository/models/digits-mlp%2Funload"),
    ("POST", "/v2/repository/models/..%2F..%2Flogging/load"),
    ("POST", "/v2/repository/models/digits-mlp/unload/"),
    ("POST", "/v2/repository/index%0A"),
    ("POST", "/v2/repository//index"),
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/models/digits-mlp/trace/setting"),
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/digits-mlp/stats"),
    ("GET", "/v2/models/digits-mlp"),
    ("GET", "/v1/models/digits-mlp:predict"),
    ("GET", "/v2/health/ready"),
    ("GET", "/metrics"),
    ("GET", "/docs-assets/swagger-ui.css"),
    ("GET", "/docs-assets"),
    ("GET", "/nowhere"),
    ("GET", ""),
    ("GET", "/"),
]
ROOTS = ["", "/api", "/a/b"]


def scope_of(method: str, target: str, root_path: str, stripped: bool = False) -> dict[str, Any]:
    """An HTTP scope as uvicorn builds one (the path percent-decoded, ``root_path`` before
    it), or as a server that strips the root path does (``stripped``)."""
    raw, _, query = target.partition("?")
    path = unquote(raw)
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        "root_path": root_path, "path": path if stripped else root_path + path,
        "raw_path": (root_path + raw).encode(), "query_string": query.encode(),
        "headers": [(b"host", b"testserver")],
    }  # fmt: skip


async def call(app: ServiceApp, scope: dict[str, Any]) -> int:
    """Serve ``scope`` (an empty body) on ``app``; the answer's status. The scope is left as
    the app left it: ``scope["route"]`` is the route that served it, if one did."""
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            return {"type": "http.disconnect"}
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


@pytest.fixture()
async def open_app(settings_factory) -> AsyncIterator[ServiceApp]:
    """The app, its lifespan run, every route open."""
    app = create_app(settings_factory())
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture()
async def guarded_app(settings_factory) -> AsyncIterator[ServiceApp]:
    """The app with GELU_CONTROL_TOKEN set, its lifespan run."""
    app = create_app(settings_factory(control_token=TOKEN))
    async with app.router.lifespan_context(app):
        yield app


def served(scope: dict[str, Any]) -> str | None:
    """The template of the route that served ``scope``: the one the router set, or the mount
    whose path it added to the root path (FastAPI's router sets no route for a mount)."""
    route = getattr(scope.get("route"), "path", None)
    if route is None and scope["root_path"].endswith("/docs-assets"):
        return "/docs-assets"
    return route


def classed_template(app: ServiceApp, scope: dict[str, Any]) -> str | None:
    """The template of the route the envelope's classes say ``scope`` goes to."""
    assert app.envelope is not None
    classed = app.envelope.classes.match(scope["method"], get_route_path(scope))
    return None if classed is None else getattr(classed.route, "path", None)


@pytest.mark.parametrize("stripped", [False, True])
@pytest.mark.parametrize("root_path", ROOTS)
async def test_classes_follow_the_router_under_any_root_path(
    open_app: ServiceApp, root_path: str, stripped: bool
) -> None:
    """For every spelling and root path, the route the classes name is the route the router
    (or the direct routes) served: none where it served none (404, a redirect)."""
    for method, target in VARIANTS:
        scope = scope_of(method, target, root_path, stripped)
        expected = classed_template(open_app, scope)
        await call(open_app, scope)
        assert served(scope) == expected, (method, target, root_path)


@pytest.mark.parametrize("root_path", ROOTS)
async def test_no_spelling_reaches_a_control_route_without_the_token(
    guarded_app: ServiceApp, root_path: str
) -> None:
    """With GELU_CONTROL_TOKEN set, a request either is refused (401) or is served by a
    route of an open class; the three that answered 200 under ``--root-path`` before are
    refused (issue 62, item 6; TorchServe ShellTorch, Triton CVE-2024-0087)."""
    assert guarded_app.envelope is not None
    classes = guarded_app.envelope.classes
    control = {"/v2/repository/index", "/v2/repository/models/{name}/load",
               "/v2/repository/models/{name}/unload", "/v2/logging", "/v2/trace/setting",
               "/v2/models/{name}/trace/setting"}  # fmt: skip
    for method, target in VARIANTS:
        scope = scope_of(method, target, root_path)
        classed = classes.match(method, get_route_path(scope))
        status = await call(guarded_app, scope)
        if status != 401:
            assert served(scope) not in control, (method, target, root_path, status)
            assert classed is not None, (method, target)  # unmatched paths fail closed
    for method, target in VARIANTS[:3]:
        assert await call(guarded_app, scope_of(method, target, root_path)) == 401
        scope = scope_of(method, target, root_path)
        scope["headers"].append((b"authorization", f"Bearer {TOKEN}".encode()))
        assert await call(guarded_app, scope) not in (401, 403), target


async def test_an_unmatched_path_fails_closed(guarded_app: ServiceApp) -> None:
    """A path no route answers is refused without credentials, not answered 404."""
    for target in ("/nowhere", "/v2/logging/", "/api/v2/logging", "//v2/logging"):
        scope = scope_of("GET", target, "/api")
        assert classed_template(guarded_app, scope) is None
        assert await call(guarded_app, scope) == 401, target
        scope = scope_of("GET", target, "/api")
        scope["headers"].append((b"authorization", f"Bearer {TOKEN}".encode()))
        assert await call(guarded_app, scope) in (307, 404), target


def test_every_route_has_a_class(settings_factory) -> None:
    """The app's routes and the direct ones each have a class; one without stops the build."""
    app = create_app(settings_factory())
    assert app.envelope is not None
    routes = app.envelope.classes.routes
    templates = {getattr(c.route, "path", None) for c in routes}
    assert {"/v2/logging", "/v2/models/{name}/infer", "/v1/activations/{name}", "/metrics",
            "/docs-assets", "/openapi.json"} <= templates  # fmt: skip
    assert UNMATCHED not in {c.route_class for c in routes}
    router = APIRouter()
    router.add_api_route("/v2/repository/models/{name}/delete", lambda: None, methods=["POST"])
    app.include_router(router)
    with pytest.raises(ValueError, match="no credentials class"):
        RouteClasses(app.router.routes)


def test_the_router_s_order_decides(settings_factory) -> None:
    """``/v2/models/stats`` is also a model named ``stats``: the router takes the route
    registered first, and so do the classes; a wrong method takes the first route whose path
    matches (it answers 405)."""
    app = create_app(settings_factory())
    assert app.envelope is not None
    classes = app.envelope.classes
    stats = classes.match("GET", "/v2/models/stats")
    assert stats is not None and stats.route_class == "statistics"
    logging_put = classes.match("PUT", "/v2/logging")
    assert logging_put is not None and logging_put.route_class == "logging"
    model = classes.match("GET", "/v1/models/m:predict")  # a model named "m:predict"
    assert model is not None and model.route_class == "metadata"
    assert classes.match("GET", "/v2/logging\n") is not None  # as the router's "$" matches
    assert classes.match("GET", "/v2/logging/") is None
