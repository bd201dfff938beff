"""``gelu-serve bench`` (``python -m bench.command``): a run measured and reported
(``bench.run``), or earlier runs judged together (``bench.pool``)."""

from __future__ import annotations

import argparse

from bench import pool
from bench.arguments import ROOT, add_arguments
from bench.judge import targets
from bench.report import README, README_BLOCK, readme_block, write_report
from bench.run import run
from contract.readme import replace_block


def report(args: argparse.Namespace) -> None:
    """Measure, write the report, print each target as met or missed; with ``--pool``, judge
    earlier runs' passes together instead (``bench.pool``), measuring nothing."""
    if args.pool:
        rows = pool.report(args.pool, args.out)
        written = f"{args.out}/benchmarks-pooled.md"
    else:
        results = run(args)
        write_report(results, args.out)
        if args.out.resolve() == (ROOT / "docs").resolve() and not args.smoke:
            block = readme_block(results)
            README.write_text(replace_block(README.read_text(), README_BLOCK, block))
            print(f"updated the targets in {README}")
        rows = targets(results, results.environment["large_model"])
        written = f"{args.out}/benchmarks.md, benchmarks.json, benchmarks.png"
    for target, measured, met in rows:
        print(f"{'met ' if met else 'MISS'} {target}: {measured}")
    print(f"wrote {written}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.command``."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    report(parser.parse_args(argv))


if __name__ == "__main__":
    main()
