"""bench.speed: the probe of the host's speed and its readings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.speed import HostSpeed, apart

ROOT = Path(__file__).resolve().parents[2]


def test_a_point_reads_the_median_chunk_of_each_cpu_and_two_points_how_far_apart() -> None:
    host = HostSpeed([0, 1])
    for at, ms in enumerate([1.0, 2.0, 1.1, 0.9, 5.0]):  # CPU 0; CPU 1 times none
        host.add(0, float(at), ms)
    assert host.during([0, 1], 1.0, 3.0) == {"0": 1.1}  # the median; CPU 1 is left out
    assert apart({"0": 0.57}, {"0": 0.95}) == apart({"0": 0.95}, {"0": 0.57}) == 0.95 / 0.57
    # a CPU only one point read, against every CPU the other read: a 2-worker point's second
    # core against its 1-worker twin's one
    assert apart({"0": 1.0, "1": 3.0}, {"0": 1.5}) == apart({"0": 1.5}, {"0": 1.0, "1": 3.0}) == 2
    assert apart({"0": 1.0, "1": 1.1}, {"0": 1.05}) == 1.05
    assert apart({"0": 1.0, "1": 3.0}, {"0": 1.0, "1": 3.0}) == 1.0  # CPU by CPU when both read it
    assert apart({"0": 1.0}, {"1": 1.2}) == 1.2
    assert apart({"0": 1.0}, {}) is None and apart({}, {}) is None
    assert apart({"0": 0.0}, {"0": 1.0}) is None  # a reading of 0 is none


def test_the_probe_times_chunks_at_real_time_priority() -> None:
    probe = subprocess.Popen(
        [sys.executable, "-m", "bench.speed", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert probe.stdout is not None
        first = probe.stdout.readline().split()
        if first == ["unavailable"]:  # only where real-time priority is refused
            assert os.geteuid() != 0
            return
        assert os.sched_getscheduler(probe.pid) == os.SCHED_FIFO
        assert os.sched_getaffinity(probe.pid) == {0}
        second = probe.stdout.readline().split()
        (t1, ms1), (t2, ms2) = map(float, first), map(float, second)
        assert 0.4 < t2 - t1 < 1.5 and 0 < ms1 < 100 and 0 < ms2 < 100
    finally:
        probe.terminate()
        probe.wait(timeout=10)
