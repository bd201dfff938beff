"""bench.run: a smoke run of one pass of the whole benchmark: zero errors and a sane report,
never a speed; and, without servers, what passes do to one another."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from bench import run
from bench.measure import ATTEMPTS, MAX_STEAL
from bench.priority import LOW
from bench.proc import cpu_model, steal_seconds
from bench.results import (
    CACHE_HIT,
    CACHE_MISS,
    FLEET_ALONE,
    FLEET_CROWDED,
    IDLE_ALONE,
    IDLE_CROWDED,
    OVER_TLS,
    TRACED,
    priority_scenario,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # real servers
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_bench_smoke(bench_repository: Path, tmp_path: Path) -> None:
    stolen_before = steal_seconds()
    result = subprocess.run(
        [sys.executable, "-m", "cli", "bench", "--smoke", "--seconds", "1", "--concurrency", "4",
         "--rounds", "1", "--repository", str(bench_repository), "--out", str(tmp_path),
         "--activation-values", "10000", "--idle-seconds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # The machine's steal over the whole run bounds any point's: a point lasts its second (a
    # tenth less at worst), so no point saw more cores stolen than the run's stolen seconds.
    stolen = steal_seconds() - stolen_before
    # the pass drove batching on and off of a protocol one right after the other, on first
    # (the next pass the other way round: drive_order, tests/bench/test_measure.py)
    driven = [line.split(" c=")[0].strip() for line in result.stdout.splitlines()
              if "predict, batching" in line]  # fmt: skip
    at = driven.index("v1 predict, batching on")
    assert driven[at + 1] == "v1 predict, batching off", driven
    # and batching off's twin right beside it
    off = driven.index("v1 predict, batching off")
    assert "v1 predict, batching off, a second server" in driven[off - 1 : off + 2], driven
    report = json.loads((tmp_path / "benchmarks.json").read_text())

    # batching on over TLS, traced at 1 % and 100 %, and with its response cache hit and
    # missed, and the small model with 20 other models loaded and alone: driven beside it,
    # each pass, every answer a success
    beside_on = {OVER_TLS, *TRACED.values(), CACHE_HIT, CACHE_MISS, FLEET_ALONE, FLEET_CROWDED}
    assert beside_on <= {row["scenario"] for row in report["http"]}
    assert all(r["errors"] == 0 for r in report["http"] if r["scenario"] in beside_on)
    # the two many-models servers idled, measured, in each pass
    idle = {row["scenario"]: row for row in report["idle"]}
    assert set(idle) == {IDLE_CROWDED, IDLE_ALONE}
    assert all(len(r["rounds_cores"]) == 1 and min(r["rounds_cores"]) >= 0 for r in idle.values())
    # every server a process of its own (new in each pass: the next test)
    pids = {row["scenario"]: row["rounds_server_pid"][0] for row in report["http"]}
    servers = [
        "v1 predict, batching on",
        "v1 predict, batching off",
        "v1 predict, batching off, a second server",
        "http floor",
        "naive app",
    ]
    assert len({pids[s] for s in servers}) == len(servers), pids

    assert f"cores of {cpu_model()}, " in report["environment"]["machine"]
    scenarios = {row["scenario"] for row in report["http"]}
    assert {"http floor", "http floor, served as the service serves", "naive app",
            "v1 predict, batching on", "v2-binary predict, batching on",
            "v1 predict, batching off", "v2-binary predict, batching off", "grpc floor",
            "grpc predict, batching on", "grpc predict, batching off",
            "grpc-stream predict, batching on", "grpc-stream predict, batching off",
            "v1 predict, batching off, a second server"} <= scenarios  # fmt: skip
    for row in report["http"]:
        if row["scenario"].startswith("grpc"):  # its client measured itself: not saturated
            assert 0 < row["client_cores"] < 1.0, row
        # the service's points say the mean batch they ran in (of 1-sample requests, at c=4)
        if "predict, batching off" in row["scenario"]:
            assert row["mean_batch"] == 1.0, row
        elif row["scenario"] == CACHE_HIT:  # every answer from the cache: nothing ran
            assert row["mean_batch"] == 0.0, row
        elif "predict, batching on" in row["scenario"] or row["scenario"] in beside_on:
            assert 1.0 <= row["mean_batch"] <= 4.0, row
        else:
            assert "mean_batch" not in row, row
    for row in report["http"] + report["activations"]:
        assert row["errors"] == 0, row
        assert row["requests"] > 0 and row["rps"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        # every thread of the one-core servers was pinned and checked; CPU and steal recorded
        assert row["server_threads"] > 1 and 0 < row["server_cores"] <= 1.05, row
        assert 0 <= row["steal_cores"] <= stolen / 0.9, (row, stolen)
        # measured again only while the steal was above the bound, keeping the least stolen
        assert 1 <= row["attempts"] <= ATTEMPTS, row
        assert row["attempts"] == ATTEMPTS or row["steal_cores"] <= MAX_STEAL, row
        # a count of preemptions, per request
        preempted = row["preempted_per_request"] * row["requests"]
        assert preempted >= 0 and abs(preempted - round(preempted)) < 1e-6, row
        # the probe's reading of the host's speed on the server's CPU, beside the point
        assert set(row["host_ms"]) == {"0"}, row
        assert 0 < row["host_ms"]["0"] < 100, row
        # one row per point, from its one round (medians of more: tests/bench/test_results.py)
        assert row["rounds_rps"] == [row["rps"]], row
    points = [(r["scenario"], r["concurrency"]) for r in report["http"] + report["activations"]]
    assert len(points) == len(set(points))
    activations = {(a["scenario"], a["concurrency"]) for a in report["activations"]}
    assert {("echo floor", 1), ("echo floor, served as the service serves", 4),
            ("gelu, float32 binary", 4), ("gelu, JSON", 1)} <= activations  # fmt: skip
    assert report["compute"]["batch64_samples_per_s"] > report["compute"]["batch1_calls_per_s"]
    assert report["breakdown"]["onnxruntime run, batch of 1"] > 0
    # the activation kernels timed in process on the rows' values: both ways of the accurate
    # kernel (compiled, also on copies in turn), the native op and a copy, each a positive
    # time, and the table that shows them
    kernels = report["kernels"]
    assert len(kernels) == 5 and all(ms > 0 for ms in kernels.values()), kernels
    assert next(iter(kernels)).startswith("accurate, compiled for ")
    assert "accurate, compiled, on 8 copies of the array in turn (0.32 MB)" in kernels
    markdown = (tmp_path / "benchmarks.md").read_text()
    zero = "| zero errors (every round of every point but the peers') | 0 errors | yes |"
    assert zero in markdown
    assert "c=4 against the floor served as the service serves" in markdown
    assert "| v1 at c=4: batching off against a second batching-off server" in markdown
    assert "c=4 against the echo served as the service serves" in markdown
    assert "gelu-serve bench" in markdown
    assert "## Where the time goes" in markdown and "| naive app | " in markdown
    assert "| mean batch | preempted | steal | probe ms |" in markdown
    assert "one call on 10,000 values of gelu" in markdown
    assert (tmp_path / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # priority levels under overload: each model's levels, alone and beside the lower level's
    # clients, in one pass; the lower level refused (its queue's cap) only with levels, and
    # the rows judged
    priority = {(r["scenario"], r["concurrency"]): r for r in report["priority"]}
    for model in ("ranked", "plain"):
        assert (priority_scenario(model, "high"), 0) in priority
        assert (priority_scenario(model, "low"), LOW) in priority
    assert priority[priority_scenario("ranked", "low"), LOW]["refused_per_s"] > 0
    assert priority[priority_scenario("plain", "low"), LOW]["refused_per_s"] == 0
    assert all(len(r["rounds_p99_ms"]) == 1 and r["rps"] > 0 for r in priority.values())
    assert f"| priority 1 beside {LOW} clients at priority 2: its p99 with two levels" in markdown


def test_every_pass_starts_its_servers_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pass's servers, the service's and the others', are started for it and stopped
    before the next pass starts theirs."""
    events: list[str] = []

    @contextmanager
    def started(name: str) -> Iterator[str]:
        events.append(f"start {name}")
        yield name
        events.append(f"stop {name}")

    def others(stack: ExitStack) -> tuple[list[Any], Any, Any]:
        floor = stack.enter_context(started(f"floor {len(events)}"))
        return [], floor, floor

    def service_pass(round_index: int, alone: list[Any], floor: str, served: str,
                     stack: ExitStack) -> None:  # fmt: skip
        stack.enter_context(started(f"service {round_index}"))
        events.append(f"pass {round_index} beside {floor}")

    bench = run.Run.__new__(run.Run)  # no models, certificates or probes: passes only
    bench.args = argparse.Namespace(rounds=2)
    bench.sink_port, bench.client_cpus = 0, "0"
    monkeypatch.setattr(run, "otlp_sink", lambda port, cpus: nullcontext())
    monkeypatch.setattr(bench, "others", others)
    monkeypatch.setattr(bench, "service_pass", service_pass)
    bench.one_core_passes()
    assert events == [
        "start floor 0", "start service 0", "pass 0 beside floor 0",
        "stop service 0", "stop floor 0",
        "start floor 5", "start service 1", "pass 1 beside floor 5",
        "stop service 1", "stop floor 5",
    ]  # fmt: skip
