"""bench.ab: two checkouts measured by one harness."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import compare

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # real servers
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_two_checkouts_by_one_harness(bench_repository: Path, tmp_path: Path) -> None:
    """bench.ab serves two checkouts (here this one twice) side by side, new servers each pass,
    the two checkouts' points back to back in turn, and writes a run for each that
    bench.compare reads."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.ab", str(ROOT), str(ROOT), "--out", str(tmp_path),
         "--rounds", "2", "--seconds", "1", "--kinds", "v1",
         "--repository", str(bench_repository)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    v1 = [line.split()[0] for line in result.stdout.splitlines() if "v1 predict" in line]
    assert (v1[0], v1[6]) == ("old", "new"), v1  # six v1 points a pass, in turn first
    assert "v2-" not in result.stdout
    for tree in ("old", "new"):
        rows = json.loads((tmp_path / f"{tree}-1.json").read_text())["http"]
        assert {(r["scenario"], r["concurrency"]) for r in rows} == {
            ("http floor", 64),
            ("v1 predict, batching on", 64),
            ("v1 predict, batching on", 1),
            ("v1 predict, batching off", 1),
        }  # fmt: skip
        assert all(r["errors"] == 0 and len(set(r["rounds_server_pid"])) == 2 for r in rows)

    lines = compare.table(tmp_path).splitlines()
    assert len(lines) == 2 + 2 and all(" [" in line for line in lines[2:]), lines
