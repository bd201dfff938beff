"""The metrics: the lean series in one process, and across processes what each writes and
what /metrics sums; no label from a client's string, and an unloaded model's series gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from service.metrics import (
    BATCH_BUCKETS,
    COMPUTE_BUCKETS,
    LATENCY_BUCKETS,
    LeanCounter,
    LeanHistogram,
)
from tests.helpers import predict
from tests.servers import wait_until

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: prometheus_client's choice of value class is process-wide.
FORKED = """
import os
from service.metrics import Metrics

metrics = Metrics(multiprocess=True)
for _ in range(11):
    metrics.observe_request("v1", "m", "1", 200, 0.001)

child = os.fork()
if child == 0:
    metrics.observe_request("v1", "m", "1", 200, 0.001)
    raise SystemExit  # a child's exit flushes its samples (atexit), as the parent's does
os.waitpid(child, 0)
total = next(
    line for line in metrics.exposition().decode().splitlines()
    if line.startswith("gelu_requests_total{")
)
print(os.getpid(), child, total.rsplit(" ", 1)[1])
"""


def test_a_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    """Eleven requests in the parent and one in a forked child are all counted, each process
    in its own file."""
    result = subprocess.run(
        [sys.executable, "-c", FORKED],
        cwd=ROOT,
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    parent, child, total = result.stdout.split()
    assert float(total) == 12.0
    files = {f.name for f in tmp_path.glob("counter_*.db")}
    assert files == {f"counter_{parent}.db", f"counter_{child}.db"}


LATER = """
import time
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from service.metrics import FLUSH_SECONDS, Metrics

def files_say():
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    text = generate_latest(registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("gelu_requests_total{"))
    return line.rsplit(" ", 1)[1]

metrics = Metrics(multiprocess=True)
metrics.observe_request("v1", "m", "1", 200, 0.001)
metrics.observe_request("v1", "m", "1", 200, 0.001)
now = files_say()
time.sleep(3 * FLUSH_SECONDS)
later = files_say()
metrics.observe_request("v1", "m", "1", 200, 0.001)
own = metrics.exposition().decode()
own = next(x for x in own.splitlines() if x.startswith("gelu_requests_total{"))
print(now, later, own.rsplit(" ", 1)[1])
"""


def test_samples_reach_the_files_within_the_flush_interval(tmp_path: Path) -> None:
    """An update changes memory only: the files another worker's scrape reads get it within
    ``FLUSH_SECONDS``, and this process's own scrape writes its samples first."""
    result = subprocess.run(
        [sys.executable, "-c", LATER],
        cwd=ROOT,
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    now, later, own = map(float, result.stdout.split())
    assert (now, later, own) == (0.0, 2.0, 3.0)


def _scraped(counter: type, histogram: type, buckets: tuple[float, ...]) -> list[list[str]]:
    """Both expositions of one counter and one histogram after the same updates, without
    ``_created`` lines and exemplars' timestamps (which the lean histogram does not keep)."""
    registry = CollectorRegistry()
    latency = histogram("h", "a histogram", ["model"], registry=registry, buckets=buckets)
    requests = counter("c", "a counter", ["model", "code"], registry=registry)
    for amount in (0, 1e-5, 5e-5, 0.0005, 0.003, 1, 7, 3000, buckets[3]):
        latency.labels("m").observe(amount)
    latency.labels("n").observe(0.2, exemplar={"trace_id": "0af7651916cd43dd8448eb211c80319c"})
    requests.labels("m", "200").inc()
    requests.labels("m", "200").inc()
    requests.labels("n", "400").inc(3)
    text = generate_latest(registry).decode().splitlines()
    scraped = openmetrics.generate_latest(registry).decode().splitlines()
    return [
        [line for line in text if "_created" not in line],
        [line.rsplit(" ", 1)[0] if " # " in line else line
         for line in scraped if "_created" not in line],
    ]  # fmt: skip


@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS, COMPUTE_BUCKETS, BATCH_BUCKETS])
def test_lean_series_scrape_as_prometheus_clients_do(buckets: tuple[float, ...]) -> None:
    """The series each request updates are kept as plain numbers; scraped, in either format,
    they read exactly as prometheus_client's own would (exemplars included): a value on a
    bucket's bound falls in that bucket."""
    lean = _scraped(LeanCounter, LeanHistogram, buckets)
    assert lean == _scraped(Counter, Histogram, buckets)
    assert any('trace_id="0af7651916cd43dd8448eb211c80319c"' in line for line in lean[1])


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


def test_client_strings_never_become_metric_labels(client) -> None:
    """Distinct unknown names, paths and methods add no label sets once each route and status
    has been seen: /metrics stays the same size, however many of them arrive."""

    def hostile(start: int, count: int) -> int:
        for i in range(start, start + count):
            client.post(f"/v1/models/m{i}:predict", json={"instances": [[0.0]]})
            client.get(f"/v2/models/m{i}/ready")
            client.delete(f"/v2/models/m{i}/infer")
            client.post(f"/v1/activations/a{i}", json={"data": [1.0]})
            client.post(f"/v1/activations/gelu?derivative=x{i}", json={"data": [1.0]})
            client.get(f"/nowhere/{i}")
        return len(client.get("/metrics").text)

    seen = hostile(0, 20)
    # 1,200 more requests with new strings: only counts and sums change (a few digits).
    assert hostile(20, 200) - seen < 2_000
