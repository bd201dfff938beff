"""Triton's statistics extension, and compute time in /metrics."""

from __future__ import annotations

from tests.helpers import DIGITS, assert_error

V1 = "/v1/models/digits-mlp:predict"


def stats_of(client, path: str) -> list[dict]:
    response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"]


def test_statistics_count_requests_runs_and_time(client) -> None:
    before = {
        (s["name"], s["version"]): s for s in stats_of(client, "/v2/models/stats")
    }  # other tests share the app: compare against what was there
    start = before["digits-mlp", "2"]
    for rows in (1, 3):
        body = {"instances": DIGITS[:rows].tolist()}
        assert client.post(V1, json=body).status_code == 200
    assert client.post(V1, json={"instances": [[0.5] * 63]}).status_code == 400
    (now,) = stats_of(client, "/v2/models/digits-mlp/versions/2/stats")
    assert now["name"] == "digits-mlp" and now["version"] == "2"
    assert now["inference_count"] == start["inference_count"] + 4
    assert now["execution_count"] == start["execution_count"] + 2
    stats, was = now["inference_stats"], start["inference_stats"]
    assert stats["success"]["count"] == was["success"]["count"] + 2
    assert stats["fail"]["count"] == was["fail"]["count"] + 1
    assert stats["compute_infer"]["count"] == was["compute_infer"]["count"] + 2
    assert stats["compute_infer"]["ns"] > was["compute_infer"]["ns"]
    assert stats["queue"]["count"] >= was["queue"]["count"] + 2
    assert {b["batch_size"] for b in now["batch_stats"]} >= {1, 3}
    assert now["last_inference"] > 0
    versions = {s["version"] for s in stats_of(client, "/v2/models/digits-mlp/stats")}
    assert versions == {"1", "2"}
    assert_error(client.get("/v2/models/nope/stats"), 404, "unknown model")
    assert_error(client.get("/v2/models/digits-mlp/versions/9/stats"), 404, "unknown version")
    assert "statistics" in client.get("/v2").json()["extensions"]
    metrics = client.get("/metrics").text
    assert 'gelu_compute_seconds_count{model="digits-mlp",version="2"}' in metrics


def test_every_request_counts_in_the_queue_with_batching_on_or_off(settings_factory) -> None:
    """As Triton's: a request's wait for its run is counted whether or not a batcher queued
    it (a lone client's inline requests wait none), so queue count equals success count."""
    from fastapi.testclient import TestClient

    from service.rest.app import create_app

    for batching in (True, False):
        with TestClient(create_app(settings_factory(batching=batching))) as client:
            for rows in (1, 2, 1):
                body = {"instances": DIGITS[:rows].tolist()}
                assert client.post(V1, json=body).status_code == 200
            (stats,) = stats_of(client, "/v2/models/digits-mlp/versions/2/stats")
        inference = stats["inference_stats"]
        assert inference["success"]["count"] == 3, batching
        assert inference["queue"]["count"] == 3, batching
