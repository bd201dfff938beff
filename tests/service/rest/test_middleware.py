"""The one envelope of every HTTP request (issue 62, "One request envelope for every face"):
every route of the app, FastAPI's and the direct ones, on every host (the app alone, under a
root path, a Ray replica's host behind its ``route_prefix``), answers with a request id, is
counted in the metrics, and is refused without the credentials of its class. A refusal to
start is one line naming what is at fault, with no traceback but at the debug level."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.auth import CLASSES
from service.host import Host
from service.rest.app import ServiceApp, create_app
from service.rest.routing import Classed
from tests.helpers import v2_body
from tests.servers import refusal_alone

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
KEYS = {name: f"{name}-key-0123456789" for name in CLASSES}
EVERY_CLASS = ";".join(f"{name}:x-api-key={key}" for name, key in KEYS.items())
PARAMETERS = {"{name}": "digits-mlp", "{version}": "1"}


def requests_counted(app: ServiceApp) -> float:
    """Every request the app's metrics have counted."""
    text = app.state.dataplane.metrics.exposition().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gelu_requests"
        for sample in family.samples
        if sample.name == "gelu_requests_total"
    )


def request_of(classed: Classed) -> tuple[str, str]:
    """A method and a path that the route ``classed`` serves."""
    path = getattr(classed.route, "path", "")
    for parameter, value in PARAMETERS.items():
        path = path.replace(parameter, value)
    if path == "/docs-assets":  # a mount: a file under it
        path += "/swagger-ui.css"
    methods = sorted(classed.methods - {"HEAD"}) or ["GET"]
    return methods[0], path


@pytest.fixture(scope="module", params=["app", "root-path", "ray"])
def client(request: pytest.FixtureRequest, settings_factory) -> Iterator[TestClient]:
    """Every class behind its own key, on each host: the app alone; the app under
    ``--root-path /api``; the host a Ray replica serves, behind a ``route_prefix`` (Ray's proxy
    hands the replica the whole path with the prefix as ``root_path``). As uvicorn and Ray, the
    client's paths carry the root path (``TestClient`` puts it only in ``root_path``)."""
    settings = settings_factory(restricted_api=EVERY_CLASS)
    if request.param == "ray":
        app, root_path = Host(settings).app, "/gelu"
    else:
        app, root_path = create_app(settings), "/api" if request.param == "root-path" else ""
    with TestClient(
        app, root_path=root_path, base_url=f"http://testserver{root_path}"
    ) as test_client:
        yield test_client


def test_every_route_goes_through_the_envelope(client: TestClient) -> None:
    """Each route (the app's and the direct ones): without a key 401, with another class's
    403, with its own served; every answer has a request id and is counted once."""
    app = client.app
    assert isinstance(app, ServiceApp) and app.envelope is not None
    routes = app.envelope.classes.routes
    assert len(routes) > 30 and any(type(c.route).__name__ == "DirectRoute" for c in routes)
    for classed in routes:
        method, path = request_of(classed)
        other = KEYS["metadata" if classed.route_class != "metadata" else "health"]
        for key, allowed in ((None, {401}), (other, {403}), (KEYS[classed.route_class], None)):
            before = requests_counted(app)
            headers = {"x-api-key": key} if key else {}
            response = client.request(method, path, headers=headers)
            where = (method, path, key)
            if allowed is None:
                assert response.status_code not in (401, 403), (where, response.text)
            else:
                assert response.status_code in allowed, (where, response.text)
            assert len(response.headers["x-request-id"]) == 16, where
            assert requests_counted(app) == before + 1, where


def test_an_unmatched_path_needs_every_key(client: TestClient) -> None:
    """A path no route answers is refused unless every class's key is there (one header
    holds one key, so here it is always refused): fail closed."""
    for key in (None, KEYS["metadata"]):
        response = client.get("/v2/nowhere", headers={"x-api-key": key} if key else {})
        assert response.status_code in (401, 403)
        assert "matches no route" in response.json()["error"]


def test_an_ambiguous_request_is_refused_on_every_host(client: TestClient) -> None:
    """Where no guarded HTTP protocol parses the request (``TestClient``, Ray Serve's proxy,
    another ASGI server), the envelope itself refuses a field the service reads once sent twice
    (400: Envoy CVE-2026-26308's class, tests/security/test_ambiguous_requests.py) and a
    Transfer-Encoding other than ``chunked`` alone (400, closing the connection:
    gunicorn CVE-2024-1135's class), before credentials; each counted, with a request id."""
    app = client.app
    assert isinstance(app, ServiceApp)
    key = ("x-api-key", KEYS["inference"])
    cases = [
        ([("x-api-key", "wrong"), key], 400, "'x-api-key'"),
        ([key, key], 400, "'x-api-key'"),
        ([key, ("x-request-id", "a"), ("x-request-id", "b")], 400, "'x-request-id'"),
        ([key, ("traceparent", "x"), ("traceparent", "y")], 400, "'traceparent'"),
        ([key, ("transfer-encoding", "gzip, chunked")], 400, "'gzip'"),
        ([key, ("transfer-encoding", "Chunked")], 400, "exactly 'chunked'"),
    ]
    for headers, status, needle in cases:
        before = requests_counted(app)
        response = client.post("/v2/models/digits-mlp/infer", json=v2_body(), headers=headers)
        assert response.status_code == status, (headers, response.text)
        assert needle in response.json()["error"], response.text
        assert len(response.headers["x-request-id"]) == 16
        closes = response.headers.get("connection") == "close"
        assert closes == ("transfer-encoding" in dict(headers)), response.headers
        assert requests_counted(app) == before + 1
    assert client.get("/v2/health/ready", headers=[("x-api-key", KEYS["health"])]).is_success


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], needle: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if needle in line]
    assert len(errors) == 1, output


@pytest.mark.slow
def test_missing_repository_is_one_line(tmp_path: Path) -> None:
    result = refusal_alone(GELU_MODEL_REPOSITORY=str(tmp_path / "nowhere"))
    assert_one_line_refusal(result, "GELU_MODEL_REPOSITORY")
    assert "does not exist" in result.stderr


@pytest.mark.slow
def test_strict_provider_refusal_is_one_line(model_repository: Path) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: nothing to refuse")
    result = refusal_alone(
        GELU_MODEL_REPOSITORY=str(model_repository),
        GELU_PROVIDERS="cuda,cpu",
        GELU_STRICT_PROVIDERS="true",
    )
    assert_one_line_refusal(result, "GELU_STRICT_PROVIDERS=true")


@pytest.mark.slow
def test_traceback_only_at_debug_level(tmp_path: Path) -> None:
    result = refusal_alone(GELU_MODEL_REPOSITORY=str(tmp_path / "nowhere"), GELU_LOG_LEVEL="debug")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "StartupError" in result.stderr
