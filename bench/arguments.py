"""The ``bench`` subcommand's options, kept free of the benchmark's imports (the web stack,
onnx) so that every ``gelu-serve`` command starts without them."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVATION_VALUES = 1_000_000
# Five passes of 3-s points rather than three of 5 s, in the same time: a pass whose two points
# of a target the probe read at two speeds is set aside (bench.judge.HOST_MATCH), and a third or
# more of them can be, so more passes leave a target more of them to count.
ROUNDS = 5
SECONDS = 3.0
IDLE_SECONDS = 10.0  # bench.fleet: CPU ticks are 10 ms, so 0.1 % of a core is one tick


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options."""
    parser.add_argument(
        "--seconds", type=float, default=SECONDS, help=f"seconds per wrk run ({SECONDS:g})"
    )
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections (1,16,64)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"passes over every point; each point reports its median round ({ROUNDS})",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=IDLE_SECONDS,
        help=f"seconds the many-models servers idle, measured, each pass ({IDLE_SECONDS:g})",
    )
    parser.add_argument("--server-cpus", default="0", help="taskset CPU list of servers (0)")
    parser.add_argument("--client-cpu", type=int, default=1, help="CPU of wrk and client (1)")
    parser.add_argument("--repository", default="model_repository", help="model repository")
    parser.add_argument(
        "--activation-values",
        type=int,
        default=ACTIVATION_VALUES,
        help="values per activation request (1e6)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="report directory (docs)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also MLServer and BentoML, each installed once into .bench-peers/ (`make "
        "bench-peers`)",
    )
    parser.add_argument(
        "--pool",
        nargs="+",
        type=Path,
        metavar="RUN.json",
        help="measure nothing: judge the targets over every pass of these earlier runs' "
        "benchmarks.json together, written to benchmarks-pooled.md (bench/pool.py)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few seconds: no larger model and no 2-worker runs, for the tests",
    )
