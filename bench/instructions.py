"""Instructions per request in the serving core, counted by valgrind's callgrind.

On a shared machine two timings a minute apart differ by more than batching on and off do for a
lone client (c=1); the count of instructions each executes does not. ``count`` runs this module
under callgrind: it serves ``CALLS`` small requests (``DataPlane.infer``, batch of one, one at a
time) in each of four windows, batching on, off, off and on (``ORDER``), each inside one
``operator.call``, the only window callgrind collects in (``--toggle-collect``; nothing else in
the process calls it), and writes each window's total as a part of its own (``--dump-after``);
a state's count is the mean of its two windows. Counted once each, on read 1.008x off when
counted first and 1.002x when counted second (2026-11-27): where a window falls in the
process moves its count by tenths of a percent (the heap is laid out differently as the
process goes on), so each state is counted early and late. The requests' onnxruntime runs are
in the count, HTTP is not. Under callgrind a run takes some 50 times as long, so the inline
bound is raised for the service to take the path it takes natively (inline, on the loop).
The requests run on an event loop, as served: batching on's window holds the looks for
company a lone client makes whenever a quiet ends (``service.batching.QUIET_MS``; natively one
every 64 ms, under callgrind's slower clock more often per request): the batcher's look is a
loop callback, so the requests cannot be driven by hand.

Start-up (imports, sessions, timings) is not counted, and is most of the time: callgrind runs
it uninstrumented (``--instr-atstart=no``; the imports ran four times as fast), the process
turns instrumentation on once each window's data plane has started and off before it stops
(``callgrind_control``), it does not compile the activation kernels (no request here runs
them), and the request's values come in a file rather than from scikit-learn's dataset loader.
"""

from __future__ import annotations

import asyncio
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest

ROOT = Path(__file__).resolve().parents[1]
SMALL = "digits-mlp"
CALLS = 2000
WARMUP = 200  # calls before the window: caches, lazy imports, the batcher's first looks
STATES = ("batching on", "batching off")
ORDER = (*STATES, *reversed(STATES))  # each state early and late in the process
WINDOW = "_operator_call"  # operator.call, in C


def count(repository: Path, inputs: np.ndarray, calls: int = CALLS) -> dict[str, float] | None:
    """Instructions per request with batching on and off (the mean of each state's windows),
    each request a batch of ``inputs``; None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out, sample = Path(tmp) / "callgrind.out", Path(tmp) / "inputs.npy"
        np.save(sample, inputs)
        subprocess.run(
            [
                valgrind, "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                f"--toggle-collect={WINDOW}", f"--dump-after={WINDOW}",
                f"--callgrind-out-file={out}",
                sys.executable, "-m", "bench.instructions",
                str(repository), str(sample), str(calls),
            ],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        parts = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [total(p.read_text()) for p in parts]
    if len(totals) != len(ORDER):
        raise RuntimeError(f"callgrind wrote {len(totals)} parts, not {len(ORDER)}")
    windows = list(zip(ORDER, totals, strict=True))
    return {
        state: sum(t for s, t in windows if s == state) / ORDER.count(state) / calls
        for state in STATES
    }


def total(profile: str) -> int:
    """The instructions a callgrind profile (part) counted: its ``totals`` line (its
    ``summary`` line is wrong in a part that instrumentation was turned off and on before)."""
    found = re.search(r"^totals: (\d+)", profile, re.MULTILINE)
    if found is None:
        raise ValueError("no totals line in the callgrind profile")
    return int(found.group(1))


def instrument(on: bool) -> None:
    """Turn callgrind's instrumentation of this process on or off."""
    subprocess.run(
        ["callgrind_control", f"--instr={'on' if on else 'off'}", str(os.getpid())],
        check=True,
        capture_output=True,
    )


async def serve(plane: DataPlane, request: InferenceRequest, times: int) -> None:
    """``request``, ``times`` times, one at a time, through ``plane``."""
    for _ in range(times):
        await plane.infer(SMALL, None, request)


def serve_alone(repository: Path, inputs: np.ndarray, calls: int) -> None:
    """``calls`` small requests of ``inputs``, one at a time, through each window's
    ``DataPlane.infer`` (a new one for each, in ``ORDER``), on an event loop whose
    ``run_until_complete`` runs inside one ``operator.call`` per window."""
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest, RequestInput
    from service.settings import Settings

    request = InferenceRequest([RequestInput(inputs)])
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for state in ORDER:
        plane = DataPlane(
            Settings(
                model_repository=repository,
                batching=state == "batching on",
                max_queue_delay_us=0,  # a lone request looks for company once, finds none
                model_control_mode="explicit",
                load_models=[SMALL],
                grpc_port=0,
                log_level="error",
                inline_max_us=20_000,
                compile_activations=False,  # the kernels are not on this path
            )
        )
        loop.run_until_complete(plane.start())
        instrument(True)
        loop.run_until_complete(serve(plane, request, WARMUP))
        operator.call(loop.run_until_complete, serve(plane, request, calls))
        instrument(False)
        loop.run_until_complete(plane.stop())
    loop.close()


if __name__ == "__main__":
    serve_alone(Path(sys.argv[1]), np.load(sys.argv[2]), int(sys.argv[3]))
