"""bench.pool: several runs' passes judged as one run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.command import main
from bench.judge import targets
from bench.pool import pool
from bench.results import Results


def test_runs_pool_their_passes_into_one_judgement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pooled, a target is the median over every pass of every run, its interval over them
    all: batching on misses in the first run (0.99x) and is met in the second (1.03x, every
    pass above 1), and over their six passes reads 1.005x, its interval straddling 1: not
    met. A point one run lacks is left out, and a run written before the probe's readings
    were kept pools beside one with them."""

    def point(scenario: str, rounds: list[float], host: list[float] | None = None) -> dict:
        row = {"scenario": scenario, "concurrency": 1, "rps": sorted(rounds)[1], "p99_ms": 1.0,
               "rounds_rps": rounds, "rounds_p99_ms": [1.0] * 3, "errors": 0}  # fmt: skip
        if host is not None:
            row["rounds_host_ms"] = [{"0": ms} for ms in host]
        return row

    def run(date: str, on: list[float], host: list[float] | None, *extra: dict) -> Results:
        environment = {"date": date, "commit": "abc1234", "command": "make bench",
                       "rounds": 3, "large_model": "large"}  # fmt: skip
        rows = [point("v1 predict, batching on", on, host),
                point("v1 predict, batching off", [100.0] * 3, host), *extra]  # fmt: skip
        return Results(environment, http=rows, instructions={"batching on": 101.0,
                                                            "batching off": 100.0})  # fmt: skip

    first = run("day 1", [100.0, 96.0, 99.0], None, point("naive app", [50.0] * 3))
    second = run("day 2", [104.0, 103.0, 101.0], [0.6, 0.6, 0.6])
    target = "v1 at c=1: batching on >= off"

    def judged(results: Results) -> tuple[str, bool]:
        return {t: (shown, met) for t, shown, met in targets(results, "large")}[target]

    assert judged(first) == (
        "0.990x [95 % 0.960x-1.000x] (99 / 100 req/s; by round 1.000x / 0.960x / 0.990x)",
        False,
    )
    assert judged(second)[1]
    pooled = pool([first, second])
    assert judged(pooled) == (
        "1.005x [95 % 0.975x-1.035x] (100 / 100 req/s; by round 1.000x / 0.960x / 0.990x / "
        "1.040x / 1.030x / 1.010x)",
        False,
    )
    assert [r["scenario"] for r in pooled.http] == ["v1 predict, batching on",
                                                     "v1 predict, batching off"]  # fmt: skip
    assert pooled.http[0]["rounds_host_ms"] == [{}] * 3 + [{"0": 0.6}] * 3  # unread, then read
    assert pooled.instructions == {"batching on": 101.0, "batching off": 100.0}
    # as the command runs it: from the runs' benchmarks.json files
    sources = [tmp_path / "a.json", tmp_path / "b.json"]
    for source, results in zip(sources, (first, second), strict=True):
        source.write_text(json.dumps(results.__dict__))
    main(["--pool", *map(str, sources), "--out", str(tmp_path / "out")])
    assert f"MISS {target}: 1.005x [95 % 0.975x-1.035x]" in capsys.readouterr().out
    written = (tmp_path / "out" / "benchmarks-pooled.md").read_text()
    assert "| `a.json` | day 1 | abc1234 | 3 | `make bench` |" in written
    assert f"| {target} | 1.005x" in written
