"""Several runs of ``make bench`` judged as one: ``gelu-serve bench --pool RUN.json ...``.

On this shared machine a target within a few per cent of its goal is met in one run and missed
in the next on the same code: a run keeps five passes, and often only two or three of them read
the host at one speed (``bench.judge.HOST_MATCH``). Each pass already compares its two points
with each other, so the passes of several runs of the same code can be pooled: every point
keeps the passes of every run, and each target is then the median of all their ratios, counted
by the same rule as within one run (``bench.judge.targets``). Nothing is measured here; the runs
are the ``benchmarks.json`` files of earlier runs (the committed one of a revision is
``git show REV:docs/benchmarks.json``). Pool runs of one serving code only: the report lists
each run's date and revision, and pooling does not check that they agree.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.fleet import pool_idle
from bench.judge import targets, targets_table
from bench.results import Results, load_results

# A point's figures that are one per pass; pooled, they are concatenated in the runs' order.
PER_PASS = ("rounds_rps", "rounds_p99_ms", "rounds_host_ms", "rounds_server_pid",
            "rounds_cpu_us_per_request")  # fmt: skip


def passes(row: dict[str, Any]) -> dict[str, list[Any]]:
    """A point's per-pass figures; a report written before one of them was kept gives its
    median point's figure as its one pass (the probe unread)."""
    count = len(row.get("rounds_rps", [None]))
    whole = {
        "rounds_rps": row["rps"],
        "rounds_p99_ms": row.get("p99_ms"),
        "rounds_host_ms": row.get("host_ms", {}) if count == 1 else {},
        "rounds_server_pid": row.get("server_pid"),
        "rounds_cpu_us_per_request": row.get("cpu_us_per_request"),
    }
    return {key: row.get(key, [whole[key]] * count) for key in PER_PASS}


def pool_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The points measured in every run (a target compares two points pass by pass, so both
    must have the same passes), each with the passes of every run. A pooled point shows the
    pass of median requests/s (the lower of two middles), with that pass's p99, probe reading
    and server, as a run's point shows its own."""
    keys = [{(r["scenario"], r["concurrency"]): r for r in rows} for rows in runs]
    pooled = []
    for key, first in keys[0].items():
        if not all(key in run for run in keys[1:]):
            continue
        rows = [run[key] for run in keys]
        merged = {name: [x for row in rows for x in passes(row)[name]] for name in PER_PASS}
        middle = merged["rounds_rps"].index(statistics.median_low(merged["rounds_rps"]))
        pooled.append({
            **first,
            **merged,
            "rps": merged["rounds_rps"][middle],
            "p99_ms": merged["rounds_p99_ms"][middle],
            "host_ms": merged["rounds_host_ms"][middle],
            "server_pid": merged["rounds_server_pid"][middle],
            "rounds_errors": sum(r.get("rounds_errors", r.get("errors", 0)) for r in rows),
        })  # fmt: skip
    return pooled


def pool(runs: list[Results]) -> Results:
    """One ``Results`` holding the passes of every run; instruction counts are the runs' mean
    (a count barely moves between runs), the environment the first run's with ``runs`` naming
    each run."""
    if not runs:
        raise ValueError("nothing to pool")
    counts = [run.instructions for run in runs if run.instructions]
    return Results(
        environment={
            **runs[0].environment,
            "runs": [
                {key: run.environment.get(key) for key in ("date", "commit", "command", "rounds")}
                for run in runs
            ],
        },
        http=pool_rows([run.http for run in runs]),
        activations=pool_rows([run.activations for run in runs]),
        priority=pool_rows([run.priority for run in runs]),
        idle=pool_idle([run.idle for run in runs]),
        instructions={
            state: statistics.fmean(count[state] for count in counts) for state in counts[0]
        }
        if counts
        else {},
    )


def write_pooled(results: Results, sources: list[Path], out: Path) -> Path:
    """``benchmarks-pooled.md`` in ``out``: the runs pooled, then the targets over their
    passes."""
    runs = results.environment["runs"]
    lines = [
        f"# Benchmarks: {len(runs)} runs pooled",
        "",
        "Written by `gelu-serve bench --pool` (`bench/pool.py`); do not edit by hand. Each "
        "target is the median of the within-pass ratios of every pass of every run below, "
        "counting, as one run does, the passes whose two points the probe read at one speed "
        "(`docs/benchmarks.md` says how a run is made).",
        "",
        "| run | date | revision | passes | command |",
        "|---|---|---|---|---|",
    ]
    for source, run in zip(sources, runs, strict=True):
        lines.append(
            f"| `{source.name}` | {run['date']} | {run['commit'] or 'not recorded'} | "
            f"{run['rounds']} | `{run['command']}` |"
        )
    lines += ["", "## Targets", "", *targets_table(results), ""]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "benchmarks-pooled.md"
    path.write_text("\n".join(lines))
    return path


def report(sources: list[Path], out: Path) -> list[tuple[str, str, bool]]:
    """Pool the runs in ``sources``, write the report, and return each target's row."""
    results = pool([load_results(source) for source in sources])
    write_pooled(results, sources, out)
    return targets(results, results.environment["large_model"])
