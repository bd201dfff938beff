"""Paired in-process runs of two trees: the median difference and its 95 % bootstrap interval.

    python -m bench.pairs RUNS.txt [RUNS.txt ...] A B

Each RUNS.txt has a line ``PAIR TREE MICROSECONDS`` per run: ``bench/asgi_path.py``'s figure
for one tree, two trees' runs alternated, a pair numbered in each file (pairs are numbered per
file, so the files of several sittings pool). The figure is the median over the pairs that ran
both ``A`` and ``B`` of A's run less B's; the interval resamples the pairs (fixed seed).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

RESAMPLES = 10_000
Pairs = dict[tuple[int, int], dict[str, float]]


def runs(*paths: Path) -> Pairs:
    """Each pair's figure by tree, the pairs keyed by (file, pair number)."""
    pairs: Pairs = {}
    for number, path in enumerate(paths):
        for line in path.read_text().splitlines():
            pair, tree, value = line.split()
            pairs.setdefault((number, int(pair)), {})[tree] = float(value)
    return pairs


def difference(pairs: Pairs, a: str, b: str) -> tuple[float, float, float]:
    """Median of a - b over the pairs that ran both, and its bootstrap 95 % interval."""
    diffs = [p[a] - p[b] for p in pairs.values() if a in p and b in p]
    if not diffs:
        raise ValueError(f"no pair ran both {a!r} and {b!r}")
    rng = random.Random(1)
    boots = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(RESAMPLES))
    return statistics.median(diffs), boots[RESAMPLES // 40], boots[RESAMPLES - RESAMPLES // 40]


def main(argv: list[str] | None = None) -> None:
    """Print A - B over the files' pairs."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.pairs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("files", nargs="+", type=Path, help="files of 'PAIR TREE MICROSECONDS'")
    parser.add_argument("a", help="the tree whose runs are taken first")
    parser.add_argument("b", help="the tree whose runs are taken from them")
    args = parser.parse_args(argv)
    median, low, high = difference(runs(*args.files), args.a, args.b)
    print(f"{args.a} - {args.b}: median {median:.2f} µs, 95 % bootstrap [{low:.2f}, {high:.2f}]")


if __name__ == "__main__":
    main()
