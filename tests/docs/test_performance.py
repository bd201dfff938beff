"""docs/performance.md holds what the committed runs and the bench's own constants give."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.arguments import ROUNDS, SECONDS
from bench.judge import HOST_MATCH, beside
from bench.measure import MAX_STEAL
from bench.pool import pool, report
from bench.report import README_BLOCK, readme_block
from bench.results import CACHE_HIT, CACHE_MISS, OVER_TLS, TRACED, load_results
from bench.speed import PERIOD
from contract.readme import block

ROOT = Path(__file__).resolve().parents[2]


def test_readme_targets_are_the_committed_run() -> None:
    """The README's targets block is what docs/benchmarks.json gives, byte for byte."""
    expected = readme_block(load_results(ROOT / "docs" / "benchmarks.json"))
    assert block((ROOT / "docs" / "performance.md").read_text(), README_BLOCK) == expected


def test_the_pooled_report_is_the_committed_runs(tmp_path: Path) -> None:
    """docs/benchmarks-pooled.md is what `make bench-pool` makes of the runs in runs/."""
    runs = sorted((ROOT / "runs").glob("*.json"))
    assert len(runs) >= 2, "runs/ keeps the runs the pooled report is made of"
    report(runs, tmp_path)
    expected = (tmp_path / "benchmarks-pooled.md").read_text()
    assert (ROOT / "docs" / "benchmarks-pooled.md").read_text() == expected


def test_the_costs_quoted_are_the_pooled_runs() -> None:
    """performance.md's TLS, tracing and cache ratios, with their intervals, are what
    bench.judge.beside makes of the pooled runs in runs/."""
    runs = pool([load_results(p) for p in sorted((ROOT / "runs").glob("*.json"))])

    def shown(name: str, c: int) -> str:
        median, low, high = beside(runs, name, "v1 predict, batching on", c)
        return f"{median:.2f}x [{low:.2f}-{high:.2f}]"

    table = (ROOT / "docs/performance.md").read_text()
    for name in (OVER_TLS, *TRACED.values(), CACHE_HIT, CACHE_MISS):
        assert f"| {shown(name, 1)} | {shown(name, 64)} |" in table, name


def test_the_first_tls_and_tracing_table_is_its_run() -> None:
    """performance.md's table of the first run that priced TLS and tracing is that run's."""
    run = json.loads((ROOT / "runs/tls-and-tracing-2026-11-27/benchmarks.json").read_text())
    rps = {(r["scenario"], r["concurrency"]): r["rps"] for r in run["http"]}
    plain = rps[("v1 predict, batching on", 64)]
    table = (ROOT / "docs/performance.md").read_text()
    for name in (OVER_TLS, *TRACED.values()):
        ratios = f"{rps[(name, 1)] / rps[('v1 predict, batching on', 1)]:.2f}x / "
        ratios += f"{rps[(name, 64)] / plain:.2f}x"
        assert ratios in table, name


def test_the_readme_states_the_limits_the_bench_sets() -> None:
    readme = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    passes = {3: "three", 4: "four", 5: "five", 6: "six"}[ROUNDS]
    assert f"makes {passes} whole passes over every point (`--rounds`), of {SECONDS:g} s" in readme
    assert f"a point taken under more than {MAX_STEAL} cores of steal is measured again" in readme
    assert f"read within {HOST_MATCH:.2f}x of each other" in readme
    assert "(under 1 ms) every half second" in readme and PERIOD == 0.5


def test_the_tuning_figures_are_the_tuners_output() -> None:
    """performance.md's section on `gelu-serve tune` quotes the tuner's own lines as they ran
    (runs/tune-2026-11-28/): each sitting's choice, and each check's ratios by concurrency."""
    folder = ROOT / "runs" / "tune-2026-11-28"
    page = (ROOT / "docs" / "performance.md").read_text()
    for name in ("tune.txt", "second/tune.txt", "ab.txt"):
        lines = (folder / name).read_text().splitlines()
        quoted = [line for line in lines if re.match(r"\| \d+ \| \d+\.\d+x \[", line)]
        quoted += [line for line in lines if line.startswith(("chosen: ", "kept: ", "keep: "))]
        assert quoted, name
        for line in quoted:
            assert line in page, (name, line)


def test_the_ceiling_tables_are_their_runs() -> None:
    """The instructions and CPU per request quoted in "Where the small model's request spends
    its time" are the committed outputs of runs/ceiling-2026-11-28/where.py."""
    runs = ROOT / "runs/ceiling-2026-11-28"
    targets = ("asgi-floor", "v1", "v2-json", "grpc-floor", "grpc")
    page = (ROOT / "docs/performance.md").read_text()

    def line(path: Path, label: str) -> list[str]:
        found = next(x for x in path.read_text().splitlines() if x.startswith(label))
        return re.findall(r"[\d.]+", found.split(label, 1)[1])

    counts = [f"{int(line(runs / f'count-{t}.txt', 'instructions/request')[0]):,}" for t in targets]
    assert "| instructions (callgrind) | " + " | ".join(counts) + " |" in page
    for prefix in ("cpu", "cpu2"):  # "cpu µs/request 39.1: user 25.8, system 13.3"
        cpu = [line(runs / f"{prefix}-{t}.txt", "cpu µs/request") for t in targets]
        row = " | ".join(f"{a} ({u} + {s})" for a, u, s in cpu)
        assert f"| {row} |" in page, prefix
