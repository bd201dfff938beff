"""Two checkouts of the service measured by one harness, pass by pass, beside one HTTP floor.

    python -m bench.ab OLD_CHECKOUT NEW_CHECKOUT --out FOLDER [--rounds 9] [--seconds 3]

``make bench`` measures the checkout it runs in, so two revisions each measured by their own
bench differ in how they are measured as well as in what they serve. Here both are served
(``gelu-serve serve`` run in each checkout, on one model repository) and driven by this
checkout's harness. Each pass starts a new HTTP floor and, for each checkout, a new server
with batching on and one with it off, all on the server core (CPU 0; the client on CPU 1).
It then drives the small model's V1, V2 JSON and V2 binary at c=64 (batching on) and at c=1
(on, then off), the two checkouts' points one right after the other, in the other order
every other pass. Writes ``old-1.json`` and ``new-1.json`` to FOLDER, each a run's ``http``
rows (the floor's in both), as ``gelu-serve bench --pool`` and
``python -m bench.compare`` read them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.launch import SERVICE_APP, Server, server, start_order
from bench.measure import drive, measure, requests_for, sample_inputs
from bench.results import HTTP_FLOOR, SMALL, median_rounds
from bench.speed import HostSpeed
from bench.wrk import Request

KINDS = ("v1", "v2-json", "v2-binary")
SERVER_CPU, CLIENT_CPU = 0, 1


class AB:
    """The two checkouts' servers, pass by pass, and every point's rows by checkout."""

    def __init__(self, args: argparse.Namespace, host: HostSpeed) -> None:
        self.args, self.host = args, host
        self.trees = {"old": args.old.resolve(), "new": args.new.resolve()}
        self.small = requests_for(SMALL, sample_inputs(64))
        self.floor_request = Request("/floor", self.small["v1"].body, self.small["v1"].headers)
        self.env = {"GELU_MODEL_REPOSITORY": str(args.repository.resolve()),
                    "GELU_LOG_LEVEL": "warning", "GELU_DRAIN_SECONDS": "0",
                    "GELU_GRPC_PORT": "0"}  # fmt: skip
        self.rows: dict[str, list[dict[str, Any]]] = {tree: [] for tree in self.trees}

    def servers(self, round_index: int, stack: ExitStack) -> dict[tuple[str, bool], Server]:
        """Each checkout's batching-on and batching-off servers, started in the pass's turn
        (``bench.launch.start_order``), each warmed by an unrecorded point (``warm``)."""
        states = [(tree, batching) for tree in self.trees for batching in (True, False)]
        started: dict[tuple[str, bool], Server] = {}
        for i in start_order(len(states), round_index):
            tree, batching = states[i]
            env = {**self.env, "GELU_BATCHING": str(batching).lower()}
            started[states[i]] = stack.enter_context(
                server(
                    SERVICE_APP, env, 1, str(SERVER_CPU), "/v2/health/ready", root=self.trees[tree]
                )
            )
        for target in started.values():
            self.warm(target, self.small["v1"])
        return started

    def warm(self, target: Server, request: Request) -> None:
        """A second of load (no more than a point's), not recorded."""
        drive(target, request, 8, min(1.0, self.args.seconds), CLIENT_CPU)

    def point(self, trees: list[str], name: str, target: Server, request: Request, c: int) -> None:
        """One point, recorded under each of ``trees`` (the floor's under both)."""
        row = measure(target, request, c, self.args.seconds, CLIENT_CPU, self.host)
        row.update(scenario=name, concurrency=c)
        for tree in trees:
            self.rows[tree].append(row)
        print(f"{'/'.join(trees):7s} {name:32s} c={c:<3d} {row['rps']:7.0f} req/s", flush=True)

    def one_pass(self, round_index: int) -> None:
        with ExitStack() as stack:
            floor = stack.enter_context(
                server("bench.floor:create_app", {}, 1, str(SERVER_CPU), "/docs")
            )
            self.warm(floor, self.floor_request)
            started = self.servers(round_index, stack)
            order = list(self.trees)[:: 1 if round_index % 2 == 0 else -1]
            self.point(list(self.trees), HTTP_FLOOR, floor, self.floor_request, 64)
            kinds = self.args.kinds.split(",")
            for kind in kinds:
                for tree in order:
                    on = started[tree, True]
                    self.point([tree], f"{kind} predict, batching on", on, self.small[kind], 64)
            for kind in kinds:
                for tree in order:
                    for batching, state in ((True, "on"), (False, "off")):
                        target, name = started[tree, batching], f"{kind} predict, batching {state}"
                        self.point([tree], name, target, self.small[kind], 1)

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for tree, path in self.trees.items():
            revision = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip()  # fmt: skip
            environment = {"checkout": str(path), "revision": revision, "date": when,
                           "rounds": self.args.rounds, "seconds": self.args.seconds}  # fmt: skip
            run = {"environment": environment, "http": median_rounds(self.rows[tree])}
            (folder / f"{tree}-1.json").write_text(json.dumps(run, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the checkout measured as old")
    parser.add_argument("new", type=Path, help="the checkout measured as new")
    parser.add_argument("--out", type=Path, required=True, help="folder for the two runs")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--rounds", type=int, default=9, help="passes (9)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per point (3)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"protocols ({','.join(KINDS)})")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CPU})
    with HostSpeed([SERVER_CPU]) as host:
        ab = AB(args, host)
        for round_index in range(args.rounds):
            ab.one_pass(round_index)
    ab.write(args.out)


if __name__ == "__main__":
    main()
