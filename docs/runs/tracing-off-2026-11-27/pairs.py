"""Paired runs of two trees: the median difference and its bootstrap 95 % interval.

python pairs.py RUNS.txt A B     # RUNS.txt: lines 'PAIR TREE MICROSECONDS'
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path


def runs(*paths: Path) -> dict[tuple[int, int], dict[str, float]]:
    """Each pair's runs by tree; pairs numbered per file."""
    pairs: dict[tuple[int, int], dict[str, float]] = {}
    for number, path in enumerate(paths):
        for line in path.read_text().splitlines():
            pair, tree, value = line.split()
            pairs.setdefault((number, int(pair)), {})[tree] = float(value)
    return pairs


def difference(
    pairs: dict[tuple[int, int], dict[str, float]], a: str, b: str
) -> tuple[float, float, float]:
    """Median of a - b over the pairs that ran both, and its bootstrap 95 % interval."""
    diffs = [p[a] - p[b] for p in pairs.values() if a in p and b in p]
    rng = random.Random(1)
    boots = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(10_000))
    return statistics.median(diffs), boots[250], boots[9750]


if __name__ == "__main__":
    *files, a, b = sys.argv[1:]
    median, low, high = difference(runs(*map(Path, files)), a, b)
    print(f"{a} - {b}: median {median:.2f} us, 95% bootstrap [{low:.2f}, {high:.2f}]")
