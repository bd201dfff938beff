"""The HTTP face's app: its lifespan refuses to start over a repository that is not there,
and its /metrics route exposes the requests, their latency and the batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import StartupError
from tests.helpers import DIGITS, start_app


def test_missing_repository_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="does not exist; build the defaults with `make models`"):
        start_app(tmp_path / "nowhere")


def test_metrics_count_requests_latency_and_batches(client) -> None:
    client.post("/v1/models/digits-mlp:predict", json={"instances": DIGITS[:3].tolist()})
    client.post("/v1/models/digits-mlp:predict", json={"instances": []})
    text = client.get("/metrics").text
    ok = (
        'gelu_requests_total{code="200",endpoint="/v1/models/{name}:predict",model="digits-mlp",'
        'version="2"}'
    )  # the version that served it
    assert ok in text
    assert 'gelu_request_failures_total{code="400",endpoint="/v1/models/{name}:predict"' in text
    assert 'gelu_request_duration_seconds_bucket{endpoint="/v1/models/{name}:predict"' in text
    assert "gelu_requests_in_flight 1.0" in text  # this very request
    assert 'gelu_batch_size_bucket{le="4.0",model="digits-mlp"}' in text
