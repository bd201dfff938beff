"""A few-second smoke run of the benchmark: zero errors and a sane report, never a speed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real servers or training

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_bench_smoke(model_repository: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "bench", "--smoke", "--seconds", "1", "--concurrency", "4",
         "--repository", str(model_repository), "--out", str(tmp_path),
         "--activation-values", "10000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    scenarios = {row["scenario"] for row in report["http"]}
    assert {"http floor", "v1 predict, batching on", "v2-binary predict, batching on",
            "v1 predict, batching off"} <= scenarios  # fmt: skip
    for row in report["http"]:
        assert row["errors"] == 0, row
        assert row["requests"] > 0 and row["rps"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert {a["format"] for a in report["activations"]} == {"binary", "json"}
    assert all(a["errors"] == 0 and a["input_mb_per_s"] > 0 for a in report["activations"])
    assert report["compute"]["batch64_samples_per_s"] > report["compute"]["batch1_calls_per_s"]
    markdown = (tmp_path / "benchmarks.md").read_text()
    assert "| zero errors | 0 errors | yes |" in markdown
    assert "gelu-serve bench" in markdown
    assert (tmp_path / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
