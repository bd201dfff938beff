"""Credentials that a path can dodge (issue 62, item 6): against real servers, a restricted
route refuses a client without its key however the path is spelled and wherever the app is
mounted, and every route goes through the one request envelope.

The class is Starlette's GHSA-86qp-5c8j-p5mr (a check on one spelling of the path, routing on
another); what an open control route gives away is TorchServe's ShellTorch (the management API
open to anyone who reaches it) and Triton's CVE-2024-0087 (the logging settings over the API).
"""

from __future__ import annotations

import http.client
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.auth import CLASSES
from service.rest.app import create_app
from service.settings import Settings
from tests.servers import probed, wait_until

pytestmark = pytest.mark.slow
TOKEN = "control-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
# The three requests that answered 200 without the token under --root-path /api.
DODGED = [
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/repository/models/digits-mlp/unload"),
]
KEYS = {name: f"{name}-key-0123456789" for name in CLASSES}
ADMIN_KEY = "admin-key-0123456789"
# Spellings of control paths: each must be refused without the admin key.
CONTROL_VARIANTS = [
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/index/"),
    ("POST", "//v2/repository/index"),
    ("POST", "/v2//repository/index"),
    ("POST", "/v2/REPOSITORY/index"),
    ("POST", "/V2/repository/index"),
    ("POST", "/v2/x/../repository/index"),
    ("POST", "/v2/./repository/index"),
    ("POST", "/v2%2Frepository%2Findex"),
    ("POST", "/v2/repository/%69ndex"),
    ("POST", "/v2/repository/index%0A"),
    ("POST", "/v2/repository/index%0D%0A"),
    ("POST", "/v2/repository/index%00"),
    ("POST", "/v2/repository/index;x"),
    ("POST", "/v2/repository/index?x=1"),
    ("GET", "/v2/repository/index"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/logging%0A"),
    ("GET", "/v2/%6Cogging"),
    ("GET", "/v2/logging/"),
    ("HEAD", "/v2/logging"),
    ("POST", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/models/digits-mlp/trace/setting"),
    ("GET", "/v2/models/digits-mlp/trace/setting%0A"),
    ("POST", "/v2/repository/models/digits-mlp/unload"),
    ("POST", "/v2/repository/models/digits-mlp%2Funload"),
    ("POST", "/v2/repository/models/digits-mlp/unload%0A"),
    ("POST", "/v2/repository/models/..%2Fdigits-mlp/load"),
    ("POST", "/v2/repository/models/digits-mlp/load"),
]
OPEN = [("GET", "/v2/health/ready"), ("GET", "/v2/models/digits-mlp"), ("GET", "/metrics")]


def request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    """One request with ``path`` sent as it is (no client normalises it); read whole."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        response.read()
        return response
    finally:
        connection.close()


@pytest.fixture(scope="module")
def root_path_server(model_repository: Path) -> Iterator[int]:
    """``uvicorn --factory service.rest.app:create_app --root-path /api``, GELU_CONTROL_TOKEN
    set, models under explicit control (so that an unload answers 200)."""
    env = {"GELU_CONTROL_TOKEN": TOKEN, "GELU_MODEL_CONTROL_MODE": "explicit",
           "GELU_LOAD_MODELS": "digits-mlp"}  # fmt: skip

    def uvicorn(port: int) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "--factory", "service.rest.app:create_app",
                "--root-path", "/api", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip

    with probed(model_repository, None, env, command=uvicorn) as (port, _):
        yield port


@pytest.fixture(scope="module")
def restricted_server(model_repository: Path) -> Iterator[int]:
    """``gelu-serve serve`` with the control classes behind one key, inference behind
    another (GELU_RESTRICTED_API)."""
    groups = f"model-repository,trace,logging:x-admin-key={ADMIN_KEY};" \
             f"inference:x-api-key={KEYS['inference']}"  # fmt: skip
    with probed(model_repository, None, {"GELU_RESTRICTED_API": groups}) as (port, _):
        yield port


@pytest.fixture(scope="module")
def every_class_server(model_repository: Path) -> Iterator[int]:
    """``gelu-serve serve`` with each class behind its own key."""
    groups = ";".join(f"{name}:x-api-key={key}" for name, key in KEYS.items())

    def ready(port: int) -> int:
        return request(port, "GET", "/v2/health/ready", {"x-api-key": KEYS["health"]}).status

    with probed(model_repository, ready, {"GELU_RESTRICTED_API": groups}) as (port, _):
        yield port


def test_a_root_path_does_not_open_the_control_routes(root_path_server: int) -> None:
    """Issue 62 item 6 (Starlette GHSA-86qp-5c8j-p5mr; TorchServe ShellTorch; Triton
    CVE-2024-0087): under ``--root-path /api`` with GELU_CONTROL_TOKEN set, the index, the
    log settings and an unload answered 200 without the token. Now: 401 without, 200 with."""
    for method, path in DODGED:
        assert request(root_path_server, method, path).status == 401, path
        assert request(root_path_server, method, f"/api{path}").status == 401, path
    for method, path in DODGED:
        assert request(root_path_server, method, path, BEARER).status == 200, path
    assert request(root_path_server, "GET", "/v2/health/ready").status == 200  # open


def test_no_spelling_of_a_control_path_dodges_its_key(restricted_server: int) -> None:
    """Issue 62 item 6 (Starlette GHSA-86qp-5c8j-p5mr; TorchServe ShellTorch): every spelling
    of a control route (slashes, case, dot segments, escapes, CR/LF/NUL, a trailing slash, a
    parameter, another method) is refused without the admin key and never served with only the
    inference key (the ones no route answers fail closed: they need every key); open routes
    stay open."""
    inference = {"x-api-key": KEYS["inference"]}
    for method, path in CONTROL_VARIANTS:
        assert request(restricted_server, method, path).status == 401, (method, path)
        assert request(restricted_server, method, path, inference).status == 401, path
        # Both keys: what no route answers needs every group's key (404 or a redirect then).
        with_keys = request(
            restricted_server, method, path, {"x-admin-key": ADMIN_KEY, **inference}
        )
        assert with_keys.status not in (401, 403, 500), (method, path)
    for method, path in OPEN:
        assert request(restricted_server, method, path).status == 200, path


def requests_counted(port: int) -> float:
    """The server's count of answered requests, but the scrapes (``/metrics`` answered 200)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics", headers={"x-api-key": KEYS["metrics"]})
    text = connection.getresponse().read().decode()
    connection.close()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gelu_requests"
        for sample in family.samples
        if sample.name == "gelu_requests_total"
        and (sample.labels["endpoint"], sample.labels["code"]) != ("/metrics", "200")
    )


def test_every_route_goes_through_the_envelope(
    every_class_server: int, model_repository: Path
) -> None:
    """Issue 62, "One request envelope for every face": each route of the app (FastAPI's and
    the direct ones, walked from the app itself) answers with a request id, is counted in the
    metrics, and is refused without its class's key (401) or with another's (403)."""
    app = create_app(Settings(model_repository=model_repository, grpc_port=0))
    assert app.envelope is not None
    routes = app.envelope.classes.routes
    assert len(routes) > 30
    port = every_class_server
    for classed in routes:
        path = getattr(classed.route, "path", "")
        path = path.replace("{name}", "digits-mlp").replace("{version}", "1")
        path += "/swagger-ui.css" if path == "/docs-assets" else ""
        method = sorted(classed.methods - {"HEAD"} or {"GET"})[0]
        other = KEYS["metadata" if classed.route_class != "metadata" else "health"]
        for key, allowed in ((None, {401}), (other, {403}), (KEYS[classed.route_class], None)):
            before = requests_counted(port)
            answer = request(port, method, path, {"x-api-key": key} if key else {})
            where = (method, path, key)
            if allowed is None:
                assert answer.status not in (401, 403, 500), where
            else:
                assert answer.status in allowed, where
            assert len(answer.headers["x-request-id"] or "") == 16, where
            # Counted once answered (the client may read the answer first); a served scrape
            # is not told apart from this test's own.
            counted = before + (0 if (path, answer.status) == ("/metrics", 200) else 1)

            def is_counted(n: float = counted) -> bool:
                return requests_counted(port) == n

            wait_until(is_counted, timeout=5, what=str(where))
