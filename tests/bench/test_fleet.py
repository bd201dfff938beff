"""bench.fleet: the many-models repositories, the idle window's arithmetic, its rows by pass
and pooled, the judged rows; and a smoke run with real servers (never a speed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fleet import COPIED, cores, fleet_repositories, idle_cores, median_idle, pool_idle
from bench.judge import TARGET_IDLE_CORES, Judge
from bench.pool import pool
from bench.results import (
    FLEET_ALONE,
    FLEET_CROWDED,
    IDLE_ALONE,
    IDLE_CROWDED,
    SMALL,
    Results,
)
from contract.model_config import load_model_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_crowded_repository_holds_the_small_model_and_renamed_copies(
    tmp_path: Path, model_repository: Path
) -> None:
    alone, crowded = fleet_repositories(model_repository, tmp_path, neighbours=4)
    assert sorted(p.name for p in alone.iterdir()) == [SMALL]
    names = sorted(p.name for p in crowded.iterdir())
    assert len(names) == 5 and SMALL in names
    for name in names:  # every copy's config names its directory, or it would not load
        config = load_model_config((crowded / name / "config.pbtxt").read_bytes())
        assert config.name == name
    copied = {name.split("-copy-")[0] for name in names if name != SMALL}
    assert copied == set(COPIED)  # each model with a session of its own, in turn
    # the copies' files are the models' own
    one = crowded / f"{COPIED[0]}-copy-01"
    assert {p.name for p in one.iterdir()} == {
        p.name for p in (model_repository / COPIED[0]).iterdir()
    }
    # the source repository is untouched
    assert not any("-copy-" in p.name for p in model_repository.iterdir())


def test_cores_are_cpu_seconds_over_the_wall_time() -> None:
    assert cores(10.0, 10.5, 5.0) == pytest.approx(0.1)
    assert cores(3.0, 3.0, 10.0) == 0.0
    with pytest.raises(ValueError, match="measures nothing"):
        cores(1.0, 2.0, 0.0)


def test_an_idle_window_reads_each_process_tree_apart() -> None:
    """A process that spins reads a share of a core; one that sleeps reads none (bounds wide
    enough for a shared machine: at a load average of 20 on 2 cores a spinner still gets a
    tenth of one, and a sleeper's start-up is over before the window opens)."""
    ready = "import sys; print('ready', flush=True); "
    spin = subprocess.Popen([sys.executable, "-c", ready + "\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    sleep = subprocess.Popen([sys.executable, "-c", ready + "import time; time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for process in (spin, sleep):
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        busy, still = idle_cores([spin.pid, sleep.pid], 1.0)
    finally:
        for process in (spin, sleep):
            process.kill()
            process.wait()
    assert busy >= 0.03 and still <= 0.011, (busy, still)  # CPU time counts in 10 ms ticks


def idle_rows(crowded: list[float], alone: list[float]) -> list[dict]:
    """A row per pass of each idle scenario, as ``Fleet.idle`` records them."""
    rows = []
    for i, (a, b) in enumerate(zip(crowded, alone, strict=True)):
        rows += [{"scenario": IDLE_CROWDED, "cores": a, "load": f"{i}.00 0.50 0.40"},
                 {"scenario": IDLE_ALONE, "cores": b, "load": f"{i}.00 0.50 0.40"}]  # fmt: skip
    return rows


def test_idle_rows_keep_every_pass_and_pool_across_runs() -> None:
    rows = median_idle(idle_rows([0.003, 0.001, 0.002], [0.001, 0.002, 0.001]))
    crowded = next(r for r in rows if r["scenario"] == IDLE_CROWDED)
    assert crowded["cores"] == 0.002 and crowded["rounds_cores"] == [0.003, 0.001, 0.002]
    assert crowded["rounds_load"] == ["0.00 0.50 0.40", "1.00 0.50 0.40", "2.00 0.50 0.40"]
    second = median_idle(idle_rows([0.009, 0.008], [0.004, 0.005]))
    pooled = {r["scenario"]: r for r in pool_idle([rows, second])}
    assert pooled[IDLE_CROWDED]["rounds_cores"] == [0.003, 0.001, 0.002, 0.009, 0.008]
    assert pooled[IDLE_CROWDED]["cores"] == 0.003
    assert len(pooled[IDLE_ALONE]["rounds_load"]) == 5
    # a scenario one run lacks (a run before it was measured) is left out
    assert pool_idle([rows, []]) == []
    assert pool_idle([[], rows]) == []


def point(scenario: str, rounds: list[float], cpu_us: list[float]) -> dict:
    return {"scenario": scenario, "concurrency": 64, "rps": sorted(rounds)[len(rounds) // 2],
            "rounds_rps": rounds, "cpu_us_per_request": sorted(cpu_us)[len(cpu_us) // 2],
            "rounds_cpu_us_per_request": cpu_us, "errors": 0}  # fmt: skip


def judged(results: Results) -> dict[str, tuple[str, bool]]:
    judge = Judge(results)
    judge.fleet()
    return {target: (shown, met) for target, shown, met in judge.rows}


def test_the_fleet_rows_are_judged_by_pass_and_interval() -> None:
    """20 neighbours cost the request path nothing in two passes of three and 5 % in one:
    the median is met, the interval is not. Idle: met when the whole interval is below the
    target, the lone model's idle shown without one."""
    results = Results(
        {},
        http=[
            point(FLEET_CROWDED, [1000, 1000, 950], [50.0, 52.0, 51.0]),
            point(FLEET_ALONE, [1000, 1000, 1000], [50.0, 50.0, 50.0]),
        ],
        idle=median_idle(idle_rows([0.002, 0.003, 0.002], [0.001, 0.001, 0.002])),
    )
    rows = judged(results)
    crowded = rows["v1 at c=64 with 20 other models loaded >= 97% of its model alone"]
    assert crowded == (
        "100% [95 % 95%-100%] (1000 / 1000 req/s; by round 100% / 100% / 95%)",
        False,
    )
    # the server's CPU per request, pass by pass, beside it (no target)
    cpu = next(shown for name, (shown, _) in rows.items() if "CPU per request" in name)
    assert cpu == "1.02x [95 % 1.00x-1.04x] (51.0 / 50.0 µs; by round 1.00x / 1.04x / 1.02x)"
    idle = rows[f"{IDLE_CROWDED}: < {TARGET_IDLE_CORES:g} cores"]
    assert idle[1] and idle[0].startswith("0.0020 cores [95 % 0.0020-0.0030] (by round")
    assert "load average 0.00 0.50 0.40; 1.00 0.50 0.40" in idle[0]
    assert any(name.startswith(IDLE_ALONE) and "no target" in name for name in rows)
    # one pass over the target puts the interval's upper end over it: not met
    results.idle = median_idle(idle_rows([0.002, 0.003, 0.02], [0.001, 0.001, 0.002]))
    assert not judged(results)[f"{IDLE_CROWDED}: < {TARGET_IDLE_CORES:g} cores"][1]
    # pooled, the idle rows keep every run's passes
    twice = pool([results, results])
    assert len(twice.idle[0]["rounds_cores"]) == 6


@pytest.mark.slow  # real servers: 22 models loaded, twice
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_fleet_smoke(bench_repository: Path) -> None:
    """``python -m bench.fleet`` on two passes: both servers idle, measured, then driven with
    no errors, and every row judged."""
    cpus = sorted(os.sched_getaffinity(0))
    result = subprocess.run(
        [sys.executable, "-m", "bench.fleet", "--rounds", "2", "--seconds", "1",
         "--idle-seconds", "1", "--concurrency", "4", "--repository", str(bench_repository),
         "--server-cpus", str(cpus[0]), "--client-cpu", str(cpus[-1])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in (FLEET_CROWDED, FLEET_ALONE):
        driven = [line for line in lines if line.startswith(name) and " req/s " in line]
        assert len(driven) == 2 and all("errors 0 " in line for line in driven), lines
    for name in (IDLE_CROWDED, IDLE_ALONE):
        measured = [line for line in lines if line.startswith(name) and line.endswith(" cores")]
        assert len(measured) == 2, lines
    assert any(line.startswith("v1 at c=4 with 20 other models loaded") for line in lines)
    assert any(line.startswith(f"{IDLE_CROWDED}: < ") for line in lines), lines
    assert lines[0].startswith("load average before: ")
