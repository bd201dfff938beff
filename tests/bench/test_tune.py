"""``bench.tune`` (``gelu-serve tune``): the search and the choice on made-up landscapes, the
written config, the drawing; and the real tuner, as docs/tuning.md runs it, on a small model."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.tune import (
    KNOBS,
    Budget,
    Point,
    Reading,
    Space,
    Trial,
    choose,
    confirm,
    request_for,
    search,
    space_for,
    svg_plot,
    tuned_text,
)
from contract.model_config import load_model_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """name: "m"
platform: "onnxruntime_onnx"
version_policy { all { } }
max_batch_size: 256
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
response_cache { enable: true }
"""
BEST = Point(32, 300, 2, 1)  # the landscape's peak


def landscape(point: Point, concurrencies: tuple[int, ...] = (16, 64)) -> Trial:
    """A made-up machine: throughput peaks at ``BEST`` knob by knob (a step off it costs a
    tenth), p99 grows with the queue delay and the batch limit."""
    rps = 1000.0
    for knob in KNOBS:
        ladder = (4, 8, 16, 32, 64, 128, 256) if knob == "max_batch_size" else None
        mine, best = getattr(point, knob), getattr(BEST, knob)
        steps = abs(ladder.index(mine) - ladder.index(best)) if ladder else abs(mine - best) / 300
        rps *= 0.9 ** (steps if knob != "max_queue_delay_us" else min(steps, 3))
    return Trial(
        point,
        tuple(
            Reading(
                c,
                rps * (1 + c / 100),
                5 + point.max_queue_delay_us / 100 + point.max_batch_size / 16 + c / 16,
                0,
            )
            for c in concurrencies
        ),
    )


def space() -> Space:
    return space_for(load_model_config(CONFIG), cpus=2, threads=1)


def test_the_space_is_the_models_own_point_and_ladders_around_it() -> None:
    s = space()
    assert s.default == Point(256, 0, 1, 1)
    assert s.ladder("max_batch_size") == (4, 8, 16, 32, 64, 128, 256)
    assert s.ladder("max_queue_delay_us")[0] == 0 and 1000 in s.ladder("max_queue_delay_us")
    assert s.ladder("threads") == (1, 2)  # never more threads than the servers' CPUs
    unbatched = load_model_config(CONFIG.replace("max_batch_size: 256", "max_batch_size: 0"))
    flat = space_for(unbatched, cpus=4, threads=1)
    assert flat.ladder("max_batch_size") == (0,) and flat.ladder("max_queue_delay_us") == (0,)
    assert flat.ladder("threads") == (1, 2, 4)


def test_the_coarse_pass_moves_one_knob_at_a_time() -> None:
    s = space()
    for point in s.coarse():
        moved = [k for k in KNOBS if getattr(point, k) != getattr(s.default, k)]
        assert len(moved) == 1, point
    assert Point(4, 0, 1, 1) in s.coarse() and Point(256, 10_000, 1, 1) in s.coarse()
    assert all(len(n.__dict__) == 4 for n in s.neighbours(s.default))
    assert Point(128, 0, 1, 1) in s.neighbours(s.default)


def test_the_search_finds_the_peak_and_starts_from_the_models_own() -> None:
    s = space()
    trials = search(s, landscape, budget_ms=1000, budget=Budget(points=64, seconds=1e9))
    assert trials[0].point == s.default
    assert choose(trials, s.default, 1000).point == BEST
    assert len({t.point for t in trials}) == len(trials)  # none measured twice


def test_the_search_stops_at_its_point_count_and_its_time() -> None:
    s = space()
    assert len(search(s, landscape, 1000, Budget(points=5, seconds=1e9))) == 5
    now = [0.0]

    def slow(point: Point) -> Trial:
        now[0] += 10  # each point takes 10 "seconds"
        return landscape(point)

    trials = search(s, slow, 1000, Budget(points=64, seconds=35, clock=lambda: now[0]))
    assert len(trials) == 3  # a fourth would end at 40 s


def test_the_choice_is_never_over_budget() -> None:
    s = space()
    trials = search(s, landscape, budget_ms=1000, budget=Budget(64, 1e9))
    tight = 12.0  # only small delays and batches stay under it
    choice = choose(trials, s.default, tight)
    chosen = next(t for t in trials if t.point == choice.point)
    assert chosen.within(tight) and choice.improved
    faster = [t for t in trials if t.throughput > chosen.throughput]
    assert faster and not any(t.within(tight) for t in faster)


def test_a_point_with_errors_is_never_chosen() -> None:
    s = space()
    broken = dataclasses.replace(landscape(BEST), readings=tuple(
        dataclasses.replace(r, errors=1) for r in landscape(BEST).readings))  # fmt: skip
    assert choose([landscape(s.default), broken], s.default, 1000).point == s.default


def test_the_models_own_is_written_when_nothing_beats_it_or_nothing_meets_the_budget() -> None:
    s = space()
    own = landscape(s.default)
    slower = Trial(Point(4, 0, 1, 1), tuple(dataclasses.replace(r, rps=r.rps / 2)
                                            for r in own.readings))  # fmt: skip
    kept = choose([own, slower], s.default, 1000)
    assert kept.point == s.default and not kept.improved and "is the best" in kept.reason
    unmet = choose([own, slower], s.default, 1.0)
    assert unmet.point == s.default and not unmet.improved and "no point" in unmet.reason


def test_confirm_keeps_a_choice_only_faster_and_within_budget_again() -> None:
    own, chosen = landscape(Point(256, 0, 1, 1)), landscape(BEST)
    rounds = [(own, chosen)] * 3
    verdict = confirm(rounds, budget_ms=1000)
    ratio = chosen.readings[0].rps / own.readings[0].rps
    assert verdict.keep and verdict.ratios[16] == pytest.approx((ratio, ratio, ratio))
    assert not confirm([(chosen, own)] * 3, 1000).keep  # slower when measured again
    # faster by the median, but one round of three slower: the interval reaches below 1
    assert not confirm([(own, chosen), (own, chosen), (chosen, own)], 1000).keep
    assert not confirm(rounds, budget_ms=chosen.p99_ms - 1).keep  # over budget again


def test_the_written_config_keeps_every_other_field_and_reads_back() -> None:
    text = tuned_text(CONFIG, Point(32, 300, 2, 2), ["tuned for a test"])
    assert text.startswith("# tuned for a test\n")
    config = load_model_config(text)
    assert (config.max_batch_size, config.max_queue_delay_us, config.instance_count) == (
        32, 300, 2
    )  # fmt: skip
    original = load_model_config(CONFIG)
    assert config.response_cache and config.version_policy == original.version_policy
    assert config.inputs == original.inputs and config.outputs == original.outputs
    assert load_model_config(tuned_text(CONFIG, space().default, [])) == original


def test_the_drawing_marks_the_chosen_and_the_own_point() -> None:
    s = space()
    trials = [landscape(s.default), landscape(BEST)]
    svg = ET.fromstring(svg_plot(trials, BEST, s.default, budget_ms=40))
    ns = "{http://www.w3.org/2000/svg}"
    dots = [c for c in svg.iter(f"{ns}circle") if c.get("r") == "3"]
    rings = [c for c in svg.iter(f"{ns}circle") if c.get("r") == "8"]
    assert len(dots) == 4 and len(rings) == 2  # every reading; the chosen at each concurrency
    assert len(list(svg.iter(f"{ns}rect"))) == 3  # the background and the own point's squares
    assert any("budget 40 ms" in (t.text or "") for t in svg.iter(f"{ns}text"))


def test_the_request_carries_one_sample_of_every_input() -> None:
    request = request_for(load_model_config(CONFIG))
    length = int(request.headers["Inference-Header-Content-Length"])
    header = json.loads(request.body[:length])
    assert header["inputs"][0]["shape"] == [1, 64]
    assert (
        len(request.body) - length
        == 64 * 4
        == header["inputs"][0]["parameters"]["binary_data_size"]
    )


def example() -> list[str]:
    """docs/tuning.md's command: its first ``console`` block's ``$ gelu-serve tune`` line."""
    page = (ROOT / "docs" / "tuning.md").read_text()
    found = re.search(r"```console\n\$ (gelu-serve tune .*?)\n", page)
    assert found, "docs/tuning.md has a console example of gelu-serve tune"
    return shlex.split(found.group(1))


@pytest.mark.slow  # real servers, a few points
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_the_documented_example_writes_a_config_within_budget(
    bench_repository: Path, tmp_path: Path
) -> None:
    command = example()
    budget = float(command[command.index("--p99-budget-ms") + 1])
    model = command[2]
    plot = tmp_path / "tune.svg"
    argv = [sys.executable, "-m", "cli", *command[1:], "--repository", str(bench_repository),
            "--plot", str(plot)]  # fmt: skip
    own = (bench_repository / model / "config.pbtxt").read_text()
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gelu-serve tune: point 1/" in result.stderr  # progress, on stderr
    written = bench_repository / model / "config.pbtxt.tuned"
    config = load_model_config(written.read_text(), model)  # Triton's format, the project's parser
    assert (bench_repository / model / "config.pbtxt").read_text() == own  # beside, untouched
    # every point tried is printed; the written one's rows are within budget, or none was
    table = [line for line in result.stdout.splitlines() if re.match(r"\| \d", line)]
    rows = [line.split(" | ") for line in table if line.count("|") == 11]  # the points' table
    assert len(rows) >= 2 * len(command[command.index("--concurrency") + 1].split(","))
    text = written.read_text()
    threads = re.search(r"GELU_INTRA_OP_THREADS=(\d+)", text)
    assert threads, text
    point = (config.max_batch_size, config.max_queue_delay_us or 0, config.instance_count,
             int(threads.group(1)))  # fmt: skip
    mine = [r for r in rows if (int(r[0][2:]), int(r[1]), int(r[2]), int(r[3])) == point]
    assert mine, (point, rows)
    if "written unchanged" in text and "best within" not in text:  # none within, or not again
        assert config == load_model_config(own, model)
    else:
        assert all(float(r[6]) <= budget and r[7] == "0" for r in mine), mine
    assert ET.fromstring(plot.read_text()).tag.endswith("svg")
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "never overwrites" in again.stderr
