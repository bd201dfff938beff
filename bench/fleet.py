"""Many models in one server: what 20 loaded models cost an idle server, and the request path
of another model (issue 65).

Two servers of the small model, batching on, over repositories made for the run: one holds
the small model alone, the other the small model and ``NEIGHBOURS`` copies of the small
default models beside it, each loaded and warmed as any model is. In each pass both idle
together for ``--idle-seconds`` first (their CPU time read from ``/proc/PID/stat``, utime +
stime of every thread, over the wall time), then each is driven one right after the other,
in the other order every other pass, as ``make bench`` takes its other pairs (``bench.run``,
at each concurrency). Standalone, at ``--concurrency`` (64), for trying settings without the
rest of the benchmark:

    python -m bench.fleet [--rounds 5] [--seconds 3] [--idle-seconds 10] [--env VARIABLE=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.arguments import IDLE_SECONDS
from bench.judge import Judge
from bench.launch import SERVICE_APP, Scenario, Server, started_in_turn
from bench.measure import drive, measure, requests_for, sample_inputs
from bench.proc import cpu_seconds
from bench.results import (
    FLEET_ALONE,
    FLEET_CROWDED,
    IDLE_ALONE,
    IDLE_CROWDED,
    SMALL,
    Results,
    median_rounds,
)
from bench.wrk import Request

NEIGHBOURS = 20
# The default models with a session of their own (the ensemble holds none), copied in turn.
COPIED = ("digits-mlp", "digits-mlp-tanh", "digits-autoencoder")
_NAME = re.compile(r'^name:\s*"[^"]*"', re.MULTILINE)


def fleet_repositories(source: Path, root: Path, neighbours: int = NEIGHBOURS) -> tuple[Path, Path]:
    """Two repositories under ``root``, from ``source``'s models: the small model alone, and
    the small model with ``neighbours`` copies of ``COPIED`` (each renamed, its config's name
    with it, as a model's directory and config name must agree)."""
    alone, crowded = root / "alone", root / "crowded"
    for repository in (alone, crowded):
        shutil.copytree(source / SMALL, repository / SMALL)
    for i in range(neighbours):
        model = COPIED[i % len(COPIED)]
        name = f"{model}-copy-{i + 1:02d}"
        shutil.copytree(source / model, crowded / name)
        config = crowded / name / "config.pbtxt"
        config.write_text(_NAME.sub(f'name: "{name}"', config.read_text(), count=1))
    return alone, crowded


def cores(cpu_before: float, cpu_after: float, wall_seconds: float) -> float:
    """CPU seconds used over a wall time, as cores."""
    if wall_seconds <= 0:
        raise ValueError(f"a wall time of {wall_seconds} s measures nothing")
    return (cpu_after - cpu_before) / wall_seconds


def idle_cores(pids: list[int], seconds: float) -> list[float]:
    """The cores each of ``pids`` (its whole process tree) used over ``seconds`` of one
    window in which nothing drives them."""
    before = [cpu_seconds(pid) for pid in pids]
    start = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    return [cores(b, cpu_seconds(pid), wall) for b, pid in zip(before, pids, strict=True)]


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as /proc/loadavg gives them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def median_idle(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per idle scenario from a row per pass: the median cores, with each pass's
    cores in ``rounds_cores`` and load average in ``rounds_load``."""
    taken: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        taken.setdefault(row["scenario"], []).append(row)
    return [
        {
            "scenario": scenario,
            "cores": statistics.median(r["cores"] for r in passes),
            "rounds_cores": [r["cores"] for r in passes],
            "rounds_load": [r["load"] for r in passes],
        }
        for scenario, passes in taken.items()
    ]


def pool_idle(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The idle scenarios measured in every run, each with the passes of every run (as
    ``bench.pool`` pools the points)."""
    keys = [{row["scenario"]: row for row in rows} for rows in runs]
    passes = [
        {"scenario": scenario, "cores": cores, "load": load}
        for scenario in keys[0]
        if all(scenario in run for run in keys[1:])
        for run in keys
        for cores, load in zip(
            run[scenario]["rounds_cores"],
            run[scenario].get("rounds_load", ["?"] * len(run[scenario]["rounds_cores"])),
            strict=True,
        )
    ]
    return median_idle(passes)


class Fleet:
    """The repositories of a run, and each pass's two servers and their idle window."""

    def __init__(self, repository: Path, scratch: Path, env: dict[str, str]) -> None:
        alone, crowded = fleet_repositories(repository, scratch)
        self.envs = {
            name: {**env, "GELU_MODEL_REPOSITORY": str(path)}
            for name, path in ((FLEET_CROWDED, crowded), (FLEET_ALONE, alone))
        }

    def servers(self, round_index: int, cpus: str, stack: ExitStack) -> dict[str, Server]:
        """Both servers, started in the pass's turn (``bench.launch.start_order``)."""
        names = list(self.envs)
        arguments = [(SERVICE_APP, self.envs[n], 1, cpus, "/v2/health/ready") for n in names]
        return dict(zip(names, started_in_turn(arguments, round_index, stack), strict=True))

    @staticmethod
    def pair(started: dict[str, Server], request: Request) -> list[Scenario]:
        """The two servers' scenarios, driven one right after the other."""
        return [(name, started[name], request) for name in (FLEET_CROWDED, FLEET_ALONE)]

    @staticmethod
    def idle(started: dict[str, Server], seconds: float) -> list[dict[str, Any]]:
        """Both servers' cores over one idle window: a row per idle scenario, with the load
        average at its end."""
        pids = [started[FLEET_CROWDED].pid, started[FLEET_ALONE].pid]
        measured = idle_cores(pids, seconds)
        load = load_average()
        return [
            {"scenario": name, "cores": value, "load": load}
            for name, value in zip((IDLE_CROWDED, IDLE_ALONE), measured, strict=True)
        ]


def main(argv: list[str] | None = None) -> None:
    """Measure the fleet's rows alone, printing each point and the judged rows."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--rounds", type=int, default=5, help="passes (5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per point (3)")
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="VARIABLE=VALUE, both servers")
    args = parser.parse_args(argv)
    env = {"GELU_LOG_LEVEL": "warning", "GELU_DRAIN_SECONDS": "0", "GELU_BATCHING": "true"}
    env.update(pair.split("=", 1) for pair in args.env)
    os.sched_setaffinity(0, {args.client_cpu})
    request = requests_for(SMALL, sample_inputs(64))["v1"]
    results = Results({})
    print(f"load average before: {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gelu-fleet-") as scratch:
        fleet = Fleet(args.repository.resolve(), Path(scratch), env)
        for round_index in range(args.rounds):
            with ExitStack() as stack:
                started = fleet.servers(round_index, args.server_cpus, stack)
                for target in started.values():
                    drive(target, request, 8, 1.0, args.client_cpu)  # warm, unrecorded
                for row in fleet.idle(started, args.idle_seconds):
                    results.idle.append(row)
                    print(f"{row['scenario']:40s} {row['cores']:.4f} cores", flush=True)
                scenarios = fleet.pair(started, request)
                for name, target, _ in scenarios[:: 1 if round_index % 2 == 0 else -1]:
                    row = measure(target, request, args.concurrency, args.seconds, args.client_cpu)
                    row.update(scenario=name, concurrency=args.concurrency)
                    results.http.append(row)
                    print(
                        f"{name:40s} c={args.concurrency} {row['rps']:7.0f} req/s  errors "
                        f"{row['errors']}  server {row['server_cores']:.2f} cores",
                        flush=True,
                    )
    print(f"load average after: {load_average()}")
    results.http, results.idle = median_rounds(results.http), median_idle(results.idle)
    judge = Judge(results)
    judge.fleet()
    for name, measured, met in judge.rows:
        print(f"{name}: {measured} {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
