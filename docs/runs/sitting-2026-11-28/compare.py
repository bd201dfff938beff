"""The small model's rows of two serving codes measured in one sitting, side by side.

    python docs/runs/sitting-2026-11-28/compare.py [FOLDER ...]   # from the repository root

Each FOLDER (this one unless named) holds ``old-*.json`` and ``new-*.json``: runs of ``make
bench`` (``benchmarks.json``) or of ``python -m bench.ab``; the runs of every folder named are
pooled.

Each tree's three runs are pooled as ``gelu-serve bench --pool`` pools them (every pass of
every run); a row's figure for a tree is the median of its passes' ratios, counting the passes
whose two points the probe read at one speed (``bench.judge.by_round``, ``HOST_MATCH``), as a
target does. The new code's figure over the old's is given with a 95 % bootstrap interval,
each tree's passes resampled on their own, and is met only when the whole interval is at or
above 0.95 (issue 50: within 5 % or better).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from bench.judge import HOST_MATCH, RESAMPLES, by_round  # noqa: E402
from bench.pool import pool_rows  # noqa: E402

GOAL = 0.95
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
    """The comparison of the runs in ``folders`` (this one if none) as a Markdown table."""
    folders = folders or (HERE,)
    lines = ["| row (pooled passes) | old | new | new / old [95 %] | within 5 % |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, scenario, base, c in ROWS:
        old, new = (passes(folders, tree, scenario, base, c) for tree in ("old", "new"))
        if not old or not new:
            continue
        ratio, low, high = compare(new, old)
        shown = (lambda x: f"{x:.0%}") if "share" in name else (lambda x: f"{x:.2f}x")
        verdict = "yes" if low >= GOAL else "**no**"  # an interval across 0.95 is not met
        lines.append(
            f"| {name} ({len(old)} / {len(new)}) | {shown(statistics.median(old))} | "
            f"{shown(statistics.median(new))} | {ratio:.3f} [{low:.3f}, {high:.3f}] | {verdict} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(*map(Path, sys.argv[1:])))
