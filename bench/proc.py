"""What a benchmark point really used, read from /proc: the server's threads and their CPUs,
its CPU time, how often it was preempted, and the hypervisor's steal; which CPU the machine
has (``cpu_model``); and how the load generator is started beside it (``client_command``).

``taskset`` pins only the threads that exist when it starts the process, and onnxruntime sets
the affinity of the thread pools it creates later; a server "on one core" can then run on two.
``pin_tree`` pins every thread of a process and its children after start-up, and
``check_pinned`` proves it before each point.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU as ``/proc/cpuinfo`` names it, with its family and model numbers: a hypervisor
    may show only the vendor's line ("AMD EPYC"), and the numbers tell its generations apart,
    whose speeds differ by more than a run's noise (family 25 model 1 is Zen 3, model 17 Zen 4);
    and LLVM's name for it (znver3, ...) where llvmlite is installed."""
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "unknown CPU")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return name
    return f"{name}, {llvm.get_host_cpu_name()}"


def cpu_list(spec: str) -> set[int]:
    """``"0"``, ``"0,1"`` or ``"0-3"`` as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's worker processes)."""
    tree = [pid]
    for parent in tree:  # grows as children are found
        children = Path(f"/proc/{parent}/task/{parent}/children")
        with contextlib.suppress(OSError):
            tree += [int(c) for c in children.read_text().split()]
    return tree


def threads(pid: int) -> list[int]:
    """Thread ids of every process in ``pid``'s tree."""
    tids = []
    for process in process_tree(pid):
        with contextlib.suppress(OSError):
            tids += [int(t) for t in os.listdir(f"/proc/{process}/task")]
    return tids


def client_command(command: list[str], cpu: int | None) -> list[str]:
    """``command``, a load generator, pinned to ``cpu`` (if given) and scheduled as a batch
    job (``SCHED_BATCH``): when it wakes, it does not preempt the server it shares a core
    with, but runs when the server waits or at the scheduler's next tick.

    On a machine that holds the client too, a server free to use every core (the 2-worker
    rows) shares them with it. Scheduled normally, the client wakes for every few responses
    and takes the core from a worker mid-request: 0.3-0.5 preemptions per request of a 2-worker
    service at c=64 (measured on 2 cores on 2026-11-25), each costing the worker its caches; as
    a batch job, about 0.02, and it handles more responses per wake-up. A client on a core of
    its own (every other row) runs as before: nothing there to preempt."""
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    return ["chrt", "--batch", "0", *command]


def pin_tree(pid: int, cpus: set[int]) -> int:
    """Pin every thread of ``pid``'s tree to ``cpus``; returns how many were elsewhere."""
    moved = 0
    for tid in threads(pid):
        try:
            if os.sched_getaffinity(tid) != cpus:
                os.sched_setaffinity(tid, cpus)
                moved += 1
        except OSError:  # the thread ended meanwhile
            pass
    return moved


def check_pinned(pid: int, cpus: set[int]) -> int:
    """The number of threads in ``pid``'s tree, after checking each runs only on ``cpus``."""
    tids = threads(pid)
    stray = [t for t in tids if _affinity(t) not in (cpus, None)]
    if stray:
        raise RuntimeError(f"threads {stray} of process {pid} may run outside CPUs {cpus}")
    return len(tids)


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: the state first (field 3), then on
    (``OSError`` once the process is gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s tree so far."""
    total = 0
    for process in process_tree(pid):
        try:
            fields = stat_fields(process)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICKS


def preemptions(pid: int) -> dict[int, int]:
    """Involuntary context switches of each thread of ``pid``'s tree so far, by thread id: the
    times the scheduler took a core from the server while it still had work."""
    counts = {}
    for tid in threads(pid):
        with contextlib.suppress(OSError, StopIteration):  # the thread ended meanwhile
            status = Path(f"/proc/{tid}/status").read_text().splitlines()
            line = next(x for x in status if x.startswith("nonvoluntary_ctxt_switches:"))
            counts[tid] = int(line.split()[1])
    return counts


def preempted_since(before: dict[int, int], pid: int) -> int:
    """Preemptions of ``pid``'s tree since ``before`` (``preemptions``), thread by thread: a
    thread that ended meanwhile takes its count with it, a thread started meanwhile counts
    from zero."""
    return sum(count - before.get(tid, 0) for tid, count in preemptions(pid).items())


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests, machine-wide, so far."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / TICKS


@dataclass
class Usage:
    """Cores a server used, the times it was preempted and the cores stolen by the hypervisor
    over one measurement."""

    server_cores: float
    steal_cores: float
    preemptions: int = 0


class UsageMeter:
    """``start()`` before a run, ``stop()`` after: the server's cores, its preemptions and the
    steal between."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def start(self) -> None:
        self._wall = time.monotonic()
        self._cpu = cpu_seconds(self.pid) if self.pid else 0.0
        self._preempted = preemptions(self.pid) if self.pid else {}
        self._steal = steal_seconds()

    def stop(self) -> Usage:
        elapsed = time.monotonic() - self._wall
        cpu = cpu_seconds(self.pid) - self._cpu if self.pid else 0.0
        preempted = preempted_since(self._preempted, self.pid) if self.pid else 0
        return Usage(cpu / elapsed, (steal_seconds() - self._steal) / elapsed, preempted)
