"""The metrics across processes: what each process writes, and what /metrics sums."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
