"""How fast the host ran the server's CPUs during a benchmark point, read by a probe.

This machine is a virtual one on a shared host. Steal (time the hypervisor gives other guests,
in /proc/stat) is one way a point loses speed; there is another that nothing in the guest
shows: the same work on the same vCPU takes one time for seconds or minutes, then about 1.7
times as long, then the first again, with no steal at all (another guest on the same physical
core is the likely cause; this guest has no performance counters to tell). Measured here on
2026-11-26: the probe's chunk below took 0.51-0.65 ms or 0.80-0.99 ms beside 184 of the 192
points of one ``make bench-peers``, between the two beside 8.

So the bench reads it beside every point. A probe on each CPU, at real-time priority so that
it runs when due whatever else the CPU runs, wakes every ``PERIOD`` s, spins ``RAMP`` s (a CPU
woken from idle runs the chunk slower and more unevenly at first) and times ``ITERATIONS``
turns of a loop (under 1 ms): 0.6 % of the CPU, the same for every point. A point's reading
is the median chunk on each of the server's CPUs (``HostSpeed.during``).

A reading may depend on the point's own load as well as the host: in one trial, alternating
the HTTP floor's c=1 and c=64 every 4 s, the chunk took 0.87-0.94 ms beside c=1 three times and
0.57-0.72 ms beside c=64 (the core never idle) three times, though later runs read c=1 points at
0.53-0.58 too. So readings compare points of one kind only, such as the two points of a
target's ratio (batching on and off at one concurrency, two identical servers); that is how
``bench.judge`` uses them (``apart``). Two identical batching-off servers at c=1, driven in turn
ten times for 3 s each: the log of their requests/s ratio and the log of their readings' ratio
correlated at r = 0.92; the turns read at one speed (within 15 %) were 1.00-1.07x apart in
requests/s, the others 0.86-1.18x.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType

from bench.arguments import ROOT

PERIOD = 0.5  # seconds between a CPU's chunks
RAMP = 0.002  # seconds of spinning before each chunk
ITERATIONS = 10_000  # one chunk's loop: under 1 ms here (0.51-0.99 ms)
KEPT = 3_600  # chunks kept per CPU (half an hour)


def chunk() -> float:
    """Seconds to run the fixed loop once."""
    start = time.perf_counter()
    total = 0
    for i in range(ITERATIONS):
        total += i * i
    return time.perf_counter() - start


def probe(cpu: int, period: float = PERIOD) -> None:
    """``python -m bench.speed CPU``: on ``cpu`` at real-time priority, print
    ``<monotonic seconds> <chunk ms>`` every ``period`` s until the parent goes or stdout
    closes; ``unavailable`` if real-time priority is not allowed (a chunk would then time
    whatever shares the CPU, not the CPU)."""
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        print("unavailable", flush=True)
        return
    chunk()  # the first one warms the loop
    parent = os.getppid()
    try:
        while os.getppid() == parent:
            time.sleep(period)
            ramp = time.perf_counter() + RAMP
            while time.perf_counter() < ramp:
                pass
            print(f"{time.monotonic():.4f} {chunk() * 1e3:.4f}", flush=True)
    except BrokenPipeError:
        pass


class HostSpeed:
    """Probes on ``cpus`` while in a ``with`` block, and the chunks they timed; ``add`` takes
    a chunk by hand (the tests)."""

    def __init__(self, cpus: Iterable[int]) -> None:
        self.cpus = sorted(cpus)
        self._chunks: dict[int, deque[tuple[float, float]]] = {
            cpu: deque(maxlen=KEPT) for cpu in self.cpus
        }
        self._lock = threading.Lock()
        self._probes: list[subprocess.Popen[str]] = []

    def __enter__(self) -> HostSpeed:
        for cpu in self.cpus:
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.speed", str(cpu)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            self._probes.append(process)
            threading.Thread(target=self._read, args=(cpu, process), daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for process in self._probes:
            process.terminate()
            process.wait(timeout=10)

    def _read(self, cpu: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip() != "unavailable":
                at, ms = map(float, line.split())
                self.add(cpu, at, ms)

    def add(self, cpu: int, at: float, ms: float) -> None:
        """One chunk of ``ms`` on ``cpu``, finished at monotonic time ``at``."""
        with self._lock:
            self._chunks[cpu].append((at, ms))

    def during(self, cpus: Iterable[int], start: float, end: float) -> dict[str, float]:
        """Each CPU's median chunk ms between monotonic times ``start`` and ``end`` (keys are
        strings, as JSON keeps them); a CPU without a chunk then is left out."""
        with self._lock:
            taken = {cpu: [m for at, m in self._chunks[cpu] if start <= at <= end] for cpu in cpus}
        return {str(cpu): statistics.median(ms) for cpu, ms in taken.items() if ms}


def apart(a: dict[str, float], b: dict[str, float]) -> float | None:
    """How far apart two points' readings (``HostSpeed.during``) are, as a ratio of at least 1:
    the largest over the CPUs both read, and over each CPU only one of them read against every
    CPU the other did; None if either read none.

    The second part is for a point on more CPUs than its twin: a 2-worker point's two cores
    against the 1-worker twin's one, which stands for a core as fast as each of the two. The
    two vCPUs are not always at one speed: in the run committed in c1ffe45, one pass's 2-worker
    point read 0.58 ms on CPU 0 and 0.95 on CPU 1, its twin 0.57 on CPU 0; compared on CPU 0
    alone, that pass counted, at 1.38x, beside 1.42-1.80x in the passes read at one speed."""
    a = {cpu: ms for cpu, ms in a.items() if ms > 0}
    b = {cpu: ms for cpu, ms in b.items() if ms > 0}
    pairs = [(a[cpu], b[cpu]) for cpu in a.keys() & b.keys()]
    pairs += [(a[cpu], ms) for cpu in a.keys() - b.keys() for ms in b.values()]
    pairs += [(ms, b[cpu]) for cpu in b.keys() - a.keys() for ms in a.values()]
    return max(max(x, y) / min(x, y) for x, y in pairs) if pairs else None


if __name__ == "__main__":
    probe(int(sys.argv[1]))
