"""Commit subjects of at most ``LIMIT`` characters, for every commit after ``BASE``:
``python -m workbench.subjects`` (``.ci/run``), exit 1 naming each commit over the limit.

Run on a clone with its history (CI's clean clone); it reads nothing from stdin.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

# Issue 63's base: the commits after this one are held to the limit, the history before it is
# left as it is. Set it to the parent of issue 63's first commit once that lands on main.
BASE = "f5b0f55072cd9b7eafc8aedf34d0344badd359d6"
LIMIT = 72


def subjects(base: str, head: str = "HEAD", cwd: Path | None = None) -> list[tuple[str, str]]:
    """(short hash, subject) of each commit in ``base..head``, newest first."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"],
        cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        raise ValueError(f"{base} is not in this clone's history (a shallow clone?)")
    log = subprocess.run(
        ["git", "log", "--format=%h%x00%s", f"{base}..{head}"],
        cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [(line.split("\0")[0], line.split("\0", 1)[1]) for line in log.stdout.splitlines()]


def too_long(commits: list[tuple[str, str]], limit: int = LIMIT) -> list[str]:
    """One line per commit whose subject is over ``limit`` characters."""
    return [f"{h} ({len(s)} > {limit}): {s}" for h, s in commits if len(s) > limit]


def main(argv: list[str] | None = None) -> None:
    """Check the subjects after ``--base`` (default ``BASE``); exit 1 listing those too long."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default=BASE, help="check the commits after this one")
    parser.add_argument("--head", default="HEAD")
    args = parser.parse_args(argv)
    try:
        commits = subjects(args.base, args.head)
    except ValueError as exc:
        sys.exit(f"workbench.subjects: {exc}")
    bad = too_long(commits)
    for line in bad:
        print(line, file=sys.stderr)
    if bad:
        sys.exit(f"workbench.subjects: {len(bad)} commit subject(s) over {LIMIT} characters")
    print(f"commit subjects: {len(commits)} after {args.base[:12]}, all within {LIMIT} characters")


if __name__ == "__main__":
    main()
