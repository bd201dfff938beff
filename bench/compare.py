"""The small model's rows of two serving codes measured in one sitting, side by side.

    python -m bench.compare FOLDER [FOLDER ...]

Each FOLDER holds ``old-*.json`` and ``new-*.json``: runs of ``make bench``
(``benchmarks.json``) or of ``python -m bench.ab`` (``make bench-ab`` writes them to
``.bench-ab/runs``); the runs of every folder named are pooled.

Each tree's runs are pooled as ``gelu-serve bench --pool`` pools them (every pass of every
run); a row's figure for a tree is the median of its passes' ratios, counting the passes whose
two points the probe read at one speed (``bench.judge.by_round``, ``HOST_MATCH``), as a target
does. The new code's figure over the old's is given with a 95 % bootstrap interval, each tree's
passes resampled on their own, and is met only when the whole interval is at or above ``GOAL``
(issue 50: within 5 % or better).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from bench.judge import HOST_MATCH, RESAMPLES, by_round
from bench.pool import pool_rows

GOAL = 0.95
TREES = ("old", "new")
# (row, scenario, its base, concurrency)
ROWS = [
    (f"{kind} at c=64, share of the HTTP floor", f"{kind} predict, batching on", "http floor", 64)
    for kind in ("v1", "v2-json", "v2-binary")
] + [
    (f"{kind} at c=1, batching on against off", f"{kind} predict, batching on",
     f"{kind} predict, batching off", 1)
    for kind in ("v1", "v2-json", "v2-binary")
]  # fmt: skip


def passes(folders: tuple[Path, ...], tree: str, scenario: str, base: str, c: int) -> list[float]:
    """One tree's pooled per-pass ratios of ``scenario`` over ``base`` at ``c`` (none if a run
    did not measure both)."""
    runs = [run for folder in folders for run in sorted(folder.glob(f"{tree}-*.json"))]
    rows = {(r["scenario"], r["concurrency"]): r
            for r in pool_rows([json.loads(p.read_text())["http"] for p in runs])}  # fmt: skip
    if (scenario, c) not in rows or (base, c) not in rows:
        return []
    ratios = by_round(rows[(scenario, c)], rows[(base, c)])
    alike = [ratio for ratio, far in ratios if far is None or far <= HOST_MATCH]
    return alike or [ratio for ratio, _ in ratios]


def compare(new: list[float], old: list[float]) -> tuple[float, float, float]:
    """median(new) / median(old), and its 95 % bootstrap interval (fixed seed)."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(new, k=len(new)))
        / statistics.median(rng.choices(old, k=len(old)))
        for _ in range(RESAMPLES)
    )
    low, high = ratios[int(0.025 * RESAMPLES)], ratios[int(0.975 * RESAMPLES) - 1]
    return statistics.median(new) / statistics.median(old), low, high


def table(*folders: Path) -> str:
    """The comparison of the runs in ``folders`` as a Markdown table: a row for each of
    ``ROWS`` that both trees measured."""
    if not folders:
        raise ValueError("name at least one folder of old-*.json and new-*.json runs")
    lines = ["| row (pooled passes) | old | new | new / old [95 %] | within 5 % |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, scenario, base, c in ROWS:
        old, new = (passes(folders, tree, scenario, base, c) for tree in TREES)
        if not old or not new:
            continue
        ratio, low, high = compare(new, old)
        shown: Callable[[float], str] = (
            (lambda x: f"{x:.0%}") if "share" in name else (lambda x: f"{x:.2f}x")
        )
        verdict = "yes" if low >= GOAL else "**no**"  # an interval across 0.95 is not met
        lines.append(
            f"| {name} ({len(old)} / {len(new)}) | {shown(statistics.median(old))} | "
            f"{shown(statistics.median(new))} | {ratio:.3f} [{low:.3f}, {high:.3f}] | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the table of the folders named."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folders", nargs="+", type=Path, help="folders of old-*/new-*.json")
    print(table(*parser.parse_args(argv).folders))


if __name__ == "__main__":
    main()
