"""Instructions per request in the serving core, counted by valgrind's callgrind.

On a shared machine two timings a minute apart differ by more than batching on and off do for a
lone client (c=1); the count of instructions each executes does not. ``count`` runs this module
under callgrind: it serves ``CALLS`` small requests (``DataPlane.infer``, batch of one, one at a
time) with batching on and then off, each inside one ``operator.call``, the only window
callgrind collects in (``--toggle-collect``; nothing else in the process calls it), and writes
each window's total as a part of its own (``--dump-after``). The requests' onnxruntime runs are
in the count, HTTP is not. Under callgrind a run takes some 50 times as long, so the inline
bound is raised for the service to take the path it takes natively (inline, on the loop).
"""

from __future__ import annotations

import asyncio
import operator
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest

ROOT = Path(__file__).resolve().parents[1]
SMALL = "digits-mlp"
CALLS = 2000
WARMUP = 200  # calls before the window: caches, lazy imports, the batcher's first probes
STATES = ("batching on", "batching off")
WINDOW = "_operator_call"  # operator.call, in C


def count(repository: Path, calls: int = CALLS) -> dict[str, float] | None:
    """Instructions per request with batching on and off; None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                valgrind, "--tool=callgrind", "--collect-atstart=no",
                f"--toggle-collect={WINDOW}", f"--dump-after={WINDOW}",
                f"--callgrind-out-file={out}",
                sys.executable, "-m", "bench.instructions", str(repository), str(calls),
            ],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        parts = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [total(p.read_text()) for p in parts]
    if len(totals) != len(STATES):
        raise RuntimeError(f"callgrind wrote {len(totals)} parts, not {len(STATES)}")
    return {state: t / calls for state, t in zip(STATES, totals, strict=True)}


def total(profile: str) -> int:
    """The instructions a callgrind profile (part) counted."""
    found = re.search(r"^summary: (\d+)", profile, re.MULTILINE)
    if found is None:
        raise ValueError("no summary line in the callgrind profile")
    return int(found.group(1))


def serve_one(plane: DataPlane, request: InferenceRequest, times: int = 1) -> None:
    """``request``, ``times`` times, one at a time, through ``plane``; driven by hand, not by
    an event loop: a lone request at most yields bare (asyncio's sleep(0)) while it looks for
    company, and none comes."""
    for _ in range(times):
        answer = plane.infer(SMALL, None, request)
        try:
            while True:
                answer.send(None)
        except StopIteration:
            pass


async def serve_alone(repository: Path, calls: int) -> None:
    """``calls`` small requests, one at a time, through each state's ``DataPlane.infer``,
    inside one ``operator.call`` for each state."""
    from bench.run import sample_inputs
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest, RequestInput
    from service.settings import Settings

    request = InferenceRequest([RequestInput(sample_inputs(64))])
    for state in STATES:
        plane = DataPlane(
            Settings(
                model_repository=repository,
                batching=state == "batching on",
                max_queue_delay_us=0,  # a request that looks for company yields, bare
                model_control_mode="explicit",
                load_models=[SMALL],
                grpc_port=0,
                log_level="error",
                inline_max_us=20_000,
            )
        )
        await plane.start()
        serve_one(plane, request, WARMUP)
        operator.call(serve_one, plane, request, calls)
        await plane.stop()


if __name__ == "__main__":
    asyncio.run(serve_alone(Path(sys.argv[1]), int(sys.argv[2])))
