"""bench.proc: pinned clients, the CPU's name, preemptions."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.proc import client_command, cpu_model, preempted_since, preemptions


def test_a_client_runs_pinned_as_a_batch_job() -> None:
    """The load generator's command, run: scheduled as SCHED_BATCH, on the CPU it is given."""
    report = "import os; print(os.sched_getscheduler(0), sorted(os.sched_getaffinity(0)))"
    for cpu, cpus in ((0, [0]), (None, sorted(os.sched_getaffinity(0)))):
        command = client_command([sys.executable, "-c", report], cpu)
        shown = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert shown.split(" ", 1) == [str(os.SCHED_BATCH), f"{cpus}\n"], command


def test_the_cpu_is_named_with_its_family_and_model() -> None:
    """A hypervisor's masked "AMD EPYC" still tells Zen 3 from Zen 4 by its numbers; this
    machine's own CPU is named the same way."""
    masked = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    assert cpu_model(masked).startswith("AMD EPYC (family 25, model 1)")
    assert cpu_model(masked + "processor\t: 1\nmodel\t\t: 17\n").startswith(
        "AMD EPYC (family 25, model 1)"
    )  # the first processor's
    assert cpu_model("").startswith("unknown CPU")


def test_preemptions_count_a_busy_tree_sharing_one_cpu() -> None:
    """Two processes spinning on one CPU take it from each other; an idle one is never
    preempted, so its count stays put."""
    spin = "import time; t = time.monotonic() + 0.5\nwhile time.monotonic() < t: pass"
    asleep = "import time; print('asleep', flush=True); time.sleep(5)"
    idle = subprocess.Popen([sys.executable, "-c", asleep], stdout=subprocess.PIPE, text=True)
    try:
        assert idle.stdout is not None and idle.stdout.readline() == "asleep\n"  # past start-up
        idle_before = preemptions(idle.pid)
        spinners = [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", spin])
                    for _ in range(2)]  # fmt: skip
        time.sleep(0.3)  # both spinning
        during = [preempted_since({}, p.pid) for p in spinners]
        for p in spinners:
            assert p.wait(timeout=30) == 0
        assert sum(during) > 0, during
        assert preempted_since(idle_before, idle.pid) == 0
        # a thread that ended takes its count with it: never a negative count
        assert preempted_since({**idle_before, -1: 10**6}, idle.pid) == 0
    finally:
        idle.kill()
        idle.wait()
