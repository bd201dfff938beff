"""Triton's model repository extension over HTTP: index, load, unload."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.control import CONTROL_FORBIDDEN
from service.rest.app import create_app
from tests.helpers import DIGITS, assert_error
from tests.onnx_models import write_foreign
from tests.servers import wait_until

PREDICT = "/v1/models/{}:predict"


def predict(client: TestClient, model: str) -> int:
    body = {"instances": DIGITS[:1].tolist()}
    return client.post(PREDICT.format(model), json=body).status_code


def test_index_lists_every_version_with_its_state(client) -> None:
    index = client.post("/v2/repository/index").json()
    assert {"name": "digits-mlp", "version": "2", "state": "READY", "reason": ""} in index
    assert {e["name"] for e in index} == {"digits-autoencoder", "digits-mlp", "digits-mlp-tanh"}
    assert client.post("/v2/repository/index", json={"ready": True}).json() == index
    assert "model_repository" in client.get("/v2").json()["extensions"]
    assert_error(client.post("/v2/repository/index", json={"ready": "yes"}), 400, "ready")
    assert_error(client.post("/v2/repository/index", content=b"[1"), 400, "malformed JSON")


def test_load_and_unload_are_forbidden_outside_explicit_mode(client) -> None:
    for action in ("load", "unload"):
        response = client.post(f"/v2/repository/models/digits-mlp/{action}")
        assert_error(response, 503, CONTROL_FORBIDDEN)
    assert predict(client, "digits-mlp") == 200


@pytest.fixture
def explicit(settings_factory):
    settings = settings_factory(model_control_mode="explicit", load_models=["digits-mlp"])
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_explicit_mode_over_http(explicit: TestClient) -> None:
    assert predict(explicit, "digits-mlp-tanh") == 404
    assert explicit.post("/v2/repository/models/digits-mlp-tanh/load").status_code == 200
    assert predict(explicit, "digits-mlp-tanh") == 200
    assert explicit.get("/v2/models/digits-mlp-tanh/ready").status_code == 200
    load, unload = (f"/v2/repository/models/digits-mlp-tanh/{a}" for a in ("load", "unload"))
    # Triton's overrides are refused, not ignored: the model stays as the repository holds it
    for key in ("config", "file:1/model.onnx"):
        response = explicit.post(load, json={"parameters": {key: "e30="}})
        assert_error(response, 400, f"load parameter {key!r} is not supported")
    for body in (b"[1]", b'{"parameters": [1]}', b"{"):
        assert_error(explicit.post(load, content=body), 400, "JSON")
        assert_error(explicit.post(unload, content=body), 400, "JSON")
    assert predict(explicit, "digits-mlp-tanh") == 200
    assert explicit.post(load, json={"parameters": {"custom": 1}}).status_code == 200
    assert explicit.post(load, json={}).status_code == 200
    no_dependents = {"parameters": {"unload_dependents": True}}
    response = explicit.post("/v2/repository/models/digits-mlp/unload", json=no_dependents)
    assert response.status_code == 200
    assert predict(explicit, "digits-mlp") == 404
    assert explicit.get("/v2/models/digits-mlp/ready").status_code == 404
    assert_error(explicit.post("/v2/repository/models/nope/load"), 404, "no model 'nope'")
    assert_error(explicit.post("/v2/repository/models/nope/unload"), 404, "no model 'nope'")
    assert_error(explicit.post("/v2/repository/models/.staging/load"), 404, "no model")
    ready = explicit.post("/v2/repository/index", json={"ready": True}).json()
    assert {e["name"] for e in ready} == {"digits-mlp-tanh"}


def _series(client: TestClient, model: str) -> list[str]:
    """The /metrics lines of ``model``'s series."""
    return [line for line in client.get("/metrics").text.splitlines()
            if f'model="{model}"' in line and not line.startswith("#")]  # fmt: skip


def test_an_unloaded_models_series_leave_metrics(explicit: TestClient) -> None:
    """Once its requests are finished, an unloaded model's series leave /metrics (its provider
    among them: it runs nowhere now), as Triton's do, but for the requests about it by name
    (version ""); another model's stay, and a reload starts them afresh."""
    tanh = "digits-mlp-tanh"
    assert explicit.post(f"/v2/repository/models/{tanh}/load").status_code == 200
    assert predict(explicit, tanh) == 200
    names = {line.split("{")[0] for line in _series(explicit, tanh)}
    assert {"gelu_requests_total", "gelu_request_duration_seconds_bucket",
            "gelu_compute_seconds_count", "gelu_execution_provider"} <= names  # fmt: skip
    kept = _series(explicit, "digits-mlp")
    assert kept
    assert explicit.post(f"/v2/repository/models/{tanh}/unload").status_code == 200

    def gone() -> bool:  # the version drains, then its series go
        return not any('version="1"' in x for x in _series(explicit, tanh))

    wait_until(gone, timeout=10, every=0.05, what="the unloaded version's series to go")
    left = _series(explicit, tanh)
    assert left and all('version=""' in line for line in left), left
    assert not any(line.startswith("gelu_batch_size") for line in left)
    assert _series(explicit, "digits-mlp") == kept
    assert explicit.post(f"/v2/repository/models/{tanh}/load").status_code == 200
    assert predict(explicit, tanh) == 200
    counted = [x for x in _series(explicit, tanh) if x.startswith("gelu_requests_total{")]
    predicted = [x for x in counted if 'version="1"' in x]
    assert len(predicted) == 1 and predicted[0].endswith(" 1.0"), counted


def test_a_clients_model_name_never_becomes_a_metric_label(client) -> None:
    for i in range(5):
        client.post(f"/v2/repository/models/made-up-{i}/load")  # 503 in none mode
        client.get(f"/v2/models/made-up-{i}/ready")  # 404
        client.put(f"/v1/models/made-up-{i}:predict")  # 405
    metrics = client.get("/metrics").text
    assert "made-up" not in metrics
    assert 'endpoint="/v2/repository/models/{name}/load",model=""' in metrics


def test_the_repository_api_can_be_restricted(settings_factory) -> None:
    settings = settings_factory(
        model_control_mode="explicit", load_models=["*"], control_token="s3cret-0123456789"
    )
    with TestClient(create_app(settings)) as restricted:
        for path in ("/v2/repository/index", "/v2/repository/models/digits-mlp/unload"):
            assert_error(restricted.post(path), 401, "GELU_CONTROL_TOKEN")
            wrong = {"Authorization": "Bearer guess"}
            assert_error(restricted.post(path, headers=wrong), 401, "restricted")
        right = {"Authorization": "Bearer s3cret-0123456789"}
        assert restricted.post("/v2/repository/index", headers=right).status_code == 200
        assert predict(restricted, "digits-mlp") == 200  # inference is not restricted
        response = restricted.post("/v2/repository/models/digits-mlp/unload", headers=right)
        assert response.status_code == 200 and predict(restricted, "digits-mlp") == 404


def test_a_foreign_onnx_file_over_http(settings_factory, repo: Path) -> None:
    """No config.pbtxt, no metadata, no batch axis: listed, described and served."""
    write_foreign(repo, "fixed", [2, 3], "Relu")
    with TestClient(create_app(settings_factory(model_repository=repo))) as http:
        assert "fixed" in {m["name"] for m in http.get("/v1/models").json()["models"]}
        config = http.get("/v2/models/fixed/config").json()
        assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [2, 3]
        body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                            "data": [-1, 2, -3, 4, -5, 6]}]}  # fmt: skip
        response = http.post("/v2/models/fixed/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [0, 2, 0, 4, 0, 6]
        body["inputs"][0]["shape"] = [3, 2]
        assert_error(http.post("/v2/models/fixed/infer", json=body), 400, "no batch axis")
