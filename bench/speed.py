"""How fast the host is running this machine's CPUs, measured beside every benchmark point.

This machine is a virtual one on a shared host. Steal (time the hypervisor gives other guests,
in /proc/stat) is one way a point loses speed; there is another that nothing in the guest
shows. On 2026-11-26 a fixed chunk of Python pinned to one CPU here took 10.3-11 ms for
seconds at a time, then 17-19.7 ms, then 10.5 again, with no steal at all: the CPU ran all the
while and did half the work (another guest on the same physical core is the likely cause; this
guest has no performance counters to tell). Beside the service at c=64 on the same CPU, the
probe below and the service's requests/s, taken second by second over a minute, correlated at
r = 0.81; the one slow second served 3,053 requests against 5,100-6,300 in the others.

So the bench measures it. A probe on each CPU, at real-time priority so that it runs when due
whatever else the CPU runs, wakes every ``PERIOD`` s, spins ``RAMP`` s (a CPU woken from idle
runs a 1 ms chunk about 20 % slower and twice as unevenly as a busy one, measured here) and
times a fixed loop of Python, about 1 ms here: 0.6 % of the CPU, the same for every point. A
CPU's reading is the median of its last ``WINDOW`` chunks; a point's speed is the fastest
reading of the last ``MEMORY`` s over the point's median chunk, on the slowest of the server's
CPUs: 1.0 is the host at its best, 0.6 a point taken while something halved it.
``bench.run.measure`` waits for the host to be at speed before a point and measures a slow
point again, as it does one taken under steal.
"""

from __future__ import annotations

import math
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
ITERATIONS = 10_000  # one chunk's loop
WINDOW = 6  # chunks in one reading of a CPU's speed (3 s)
MEMORY = 300.0  # seconds: the reference is the fastest reading this recent
WAIT_SECONDS = 10.0  # the longest wait for the host to be at speed before a point
RAMP = 0.002  # seconds of spinning before each chunk
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
            ramp = time.perf_counter() + RAMP  # a CPU that was idle runs slower at first
            while time.perf_counter() < ramp:
                pass
            print(f"{time.monotonic():.4f} {chunk() * 1e3:.4f}", flush=True)
    except BrokenPipeError:
        pass


class HostSpeed:
    """Probes on ``cpus`` while in a ``with`` block, and what they measured; ``add`` takes a
    chunk by hand (the tests). ``min_speed`` 0 records speeds without waiting or judging."""

    def __init__(self, cpus: Iterable[int], min_speed: float) -> None:
        self.cpus = sorted(cpus)
        self.min_speed = min_speed
        self.available = True
        self.fastest: dict[str, float] = {str(cpu): math.inf for cpu in self.cpus}  # the run's
        self._chunks: dict[int, deque[tuple[float, float]]] = {
            cpu: deque(maxlen=KEPT) for cpu in self.cpus
        }
        self._readings: dict[int, deque[tuple[float, float]]] = {cpu: deque() for cpu in self.cpus}
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
            if line.strip() == "unavailable":
                self.available = False
                return
            at, ms = map(float, line.split())
            self.add(cpu, at, ms)

    def add(self, cpu: int, at: float, ms: float) -> None:
        """One chunk of ``ms`` on ``cpu``, finished at monotonic time ``at``."""
        with self._lock:
            chunks, readings = self._chunks[cpu], self._readings[cpu]
            chunks.append((at, ms))
            if len(chunks) < WINDOW:
                return
            reading = statistics.median(m for _, m in list(chunks)[-WINDOW:])
            readings.append((at, reading))
            while readings[0][0] < at - MEMORY:
                readings.popleft()
            self.fastest[str(cpu)] = min(self.fastest[str(cpu)], reading)

    def during(self, cpus: Iterable[int], start: float, end: float) -> dict[str, float]:
        """Each CPU's median chunk ms between monotonic times ``start`` and ``end`` (keys are
        strings, as JSON keeps them); a CPU without a chunk then is left out."""
        with self._lock:
            taken = {cpu: [m for at, m in self._chunks[cpu] if start <= at <= end] for cpu in cpus}
        return {str(cpu): statistics.median(ms) for cpu, ms in taken.items() if ms}

    def speed(self, chunk_ms: dict[str, float]) -> float | None:
        """The slowest CPU's speed in ``chunk_ms`` (``during``) against its fastest recent
        reading; None when there is nothing to compare."""
        with self._lock:
            speeds = [
                min(r for _, r in self._readings[int(cpu)]) / ms
                for cpu, ms in chunk_ms.items()
                if self._readings[int(cpu)]
            ]
        return min(speeds) if speeds else None

    def at_speed(self, speed: float | None) -> bool:
        """Whether a point measured at ``speed`` is kept (no speed known counts as kept)."""
        return speed is None or speed >= self.min_speed

    def wait(self, cpus: Iterable[int], timeout: float = WAIT_SECONDS) -> float:
        """Wait until each of ``cpus`` ran its last three chunks (their median) at speed, or
        ``timeout`` s; returns the seconds waited."""
        if not self.min_speed:
            return 0.0
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            with self._lock:
                recent = {cpu: [m for _, m in list(self._chunks[cpu])[-3:]] for cpu in cpus}
            last = {str(cpu): statistics.median(ms) for cpu, ms in recent.items() if ms}
            if self.at_speed(self.speed(last)):
                break
            time.sleep(0.05)
        return time.monotonic() - start


def report_speed(chunk_ms: dict[str, float], fastest: dict[str, float]) -> float | None:
    """A point's speed (its ``host_ms``, from ``during``) against the run's fastest readings
    (``HostSpeed.fastest``), for the report: the slowest of its CPUs; None when unknown."""
    speeds = [
        fastest[cpu] / ms
        for cpu, ms in chunk_ms.items()
        if math.isfinite(fastest.get(cpu, math.inf)) and ms > 0
    ]
    return min(speeds) if speeds else None


if __name__ == "__main__":
    probe(int(sys.argv[1]))
