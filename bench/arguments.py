"""The ``bench`` subcommand's options, kept free of the benchmark's imports (the web stack,
onnx) so that every ``gelu-serve`` command starts without them."""

from __future__ import annotations

import argparse
import os
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


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tune`` subcommand's options (``bench.tune``)."""
    usable = sorted(os.sched_getaffinity(0))
    servers = ",".join(map(str, usable[:-1] or usable))  # every CPU but the client's
    parser.add_argument("model", help="the model to tune, a folder of --repository")
    parser.add_argument(
        "--p99-budget-ms", type=float, required=True, help="the p99 no chosen point may exceed"
    )
    parser.add_argument("--concurrency", default="16,64", help="wrk connections (16,64)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help=f"per wrk run ({SECONDS:g})")
    parser.add_argument("--max-points", type=int, default=16, help="points at most (16)")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=900,
        help="no point begun that would end later than this after the search began (900)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds measuring the choice against the model's own, interleaved; 0: none (5)",
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the own (1)")
    parser.add_argument("--repository", default="model_repository", help="model repository")
    parser.add_argument(
        "--out", type=Path, help="where to write (MODEL/config.pbtxt.tuned); never overwritten"
    )
    parser.add_argument("--plot", type=Path, help="an SVG of throughput against p99 to write")
    parser.add_argument(
        "--server-cpus", default=servers, help=f"taskset CPU list of the servers ({servers})"
    )
    parser.add_argument(
        "--client-cpu", type=int, default=usable[-1], help=f"CPU of wrk ({usable[-1]})"
    )
