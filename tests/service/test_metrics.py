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
    os._exit(0)
os.waitpid(child, 0)
total = next(
    line for line in metrics.exposition().decode().splitlines()
    if line.startswith("gelu_requests_total{")
)
print(os.getpid(), child, total.rsplit(" ", 1)[1])
"""


def test_a_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    """The process id is read once (``metrics._remember_pid``) and again after a fork: eleven
    requests in the parent and one in a forked child are all counted, each process in its
    own file."""
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
