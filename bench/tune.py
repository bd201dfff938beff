"""``gelu-serve tune MODEL``: a small search for one model's serving configuration on this
machine, and the best config.pbtxt within a p99 budget, written beside the model's own.

What it varies (``Point``): the batch limit (``max_batch_size``), the queue delay
(``dynamic_batching.max_queue_delay_microseconds``), the number of instances
(``instance_group`` count) and onnxruntime's intra-op threads (``GELU_INTRA_OP_THREADS``, a
server setting: the written file says it in a comment). Triton's ``preferred_batch_size`` is
not varied: the service's batcher does not read it (docs/tuning.md).

How (``search``): the model's own configuration first, then each knob alone over its ladder's
ends and middle (the coarse pass), the coarse winners together, then one step either way along
each ladder from the best so far while that improves it (the refinement), all within
``--max-points`` and ``--budget-seconds``. Each point is a fresh ``gelu-serve serve`` of a
scratch copy of the model, pinned as ``make bench`` pins its servers, warmed for a second and
driven by wrk (``bench.measure.measure``) at each of ``--concurrency`` for ``--seconds``. A
point is within budget when it answered every request and its p99 at every concurrency is at
most ``--p99-budget-ms``; the best is the one within budget of the highest throughput (the
geometric mean over the concurrencies). The choice is then measured again against the model's
own configuration, interleaved for ``--rounds`` rounds as ``make bench``'s passes are
(``confirm``): it is kept only if it still holds the budget and is faster at every concurrency
by the whole 95 % interval of the rounds' ratios, printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.model_config import ModelConfig, load_model_config, message_pbtxt, parse_config
from contract.names import CONFIG_FILENAME

TUNED_SUFFIX = ".tuned"  # the written file: config.pbtxt.tuned, beside the model's own
DELAYS_US = (0, 100, 300, 1000, 3000, 10_000)  # queue delays tried, in µs
INSTANCES = (1, 2, 4)
SMALLEST_BATCH = 4  # the batch limit's ladder: powers of two from here to the model's own


@dataclass(frozen=True, order=True)
class Point:
    """One configuration tried."""

    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    threads: int  # onnxruntime intra-op threads (GELU_INTRA_OP_THREADS)

    def describe(self) -> str:
        return (
            f"max_batch_size {self.max_batch_size}, delay {self.max_queue_delay_us} us, "
            f"{self.instances} instance(s), {self.threads} thread(s)"
        )


KNOBS = tuple(f.name for f in dataclasses.fields(Point))


@dataclass(frozen=True)
class Space:
    """The values each knob may take (``ladders``, ascending) and the model's own point."""

    default: Point
    ladders: tuple[tuple[int, ...], ...]  # one per KNOBS entry

    def ladder(self, knob: str) -> tuple[int, ...]:
        return self.ladders[KNOBS.index(knob)]

    def coarse(self) -> list[Point]:
        """Each knob alone, from the model's own point, at its ladder's ends and middle."""
        points = []
        for knob in KNOBS:
            ladder = self.ladder(knob)
            for value in dict.fromkeys((ladder[0], ladder[len(ladder) // 2], ladder[-1])):
                point = dataclasses.replace(self.default, **{knob: value})
                if point != self.default:
                    points.append(point)
        return points

    def neighbours(self, point: Point) -> list[Point]:
        """One step down and up each knob's ladder from ``point``."""
        found = []
        for knob in KNOBS:
            ladder, value = self.ladder(knob), getattr(point, knob)
            at = ladder.index(value) if value in ladder else _nearest(ladder, value)
            for step in (at - 1, at + 1):
                if 0 <= step < len(ladder) and ladder[step] != value:
                    found.append(dataclasses.replace(point, **{knob: ladder[step]}))
        return found


def _nearest(ladder: Sequence[int], value: int) -> int:
    return min(range(len(ladder)), key=lambda i: abs(ladder[i] - value))


def space_for(config: ModelConfig, cpus: int, threads: int) -> Space:
    """The search space of a model whose config is ``config``, served on ``cpus`` CPUs with
    ``threads`` intra-op threads by default. A model without a batch axis (max_batch_size 0)
    keeps it, and its delay; its instances and threads still vary."""
    own = config.max_batch_size
    delay = config.max_queue_delay_us or 0
    if own > 0:
        batches = [2**k for k in range(SMALLEST_BATCH.bit_length() - 1, own.bit_length())]
        batches = sorted({b for b in batches if b <= own} | {own})
        delays = sorted({*DELAYS_US, delay})
    else:
        batches, delays = [0], [delay]
    default = Point(own, delay, config.instance_count, threads)
    thread_ladder = sorted({2**k for k in range(cpus.bit_length()) if 2**k <= cpus} | {threads})
    return Space(
        default,
        (
            tuple(batches),
            tuple(delays),
            tuple(sorted({*INSTANCES, config.instance_count})),
            tuple(thread_ladder),
        ),
    )


@dataclass(frozen=True)
class Reading:
    """One point driven at one concurrency."""

    concurrency: int
    rps: float
    p99_ms: float
    errors: int
    mean_batch: float = 0.0


@dataclass(frozen=True)
class Trial:
    """A point and what it measured at each concurrency."""

    point: Point
    readings: tuple[Reading, ...]

    @property
    def p99_ms(self) -> float:
        """The worst p99 over the concurrencies."""
        return max(r.p99_ms for r in self.readings)

    @property
    def throughput(self) -> float:
        """The geometric mean of requests/s over the concurrencies (0 if any answered none)."""
        if any(r.rps <= 0 for r in self.readings):
            return 0.0
        return math.exp(statistics.fmean(math.log(r.rps) for r in self.readings))

    def within(self, budget_ms: float) -> bool:
        """Every request answered, and every concurrency's p99 within the budget."""
        return all(r.errors == 0 for r in self.readings) and self.p99_ms <= budget_ms


@dataclass(frozen=True)
class Choice:
    """The point to write, and why."""

    point: Point
    reason: str
    improved: bool  # another point than the model's own


def choose(trials: Iterable[Trial], default: Point, budget_ms: float) -> Choice:
    """The trial within budget of the highest throughput; the model's own point when nothing
    within budget beats it, or when nothing is within budget at all (never a point over it)."""
    listed = list(trials)
    within = [t for t in listed if t.within(budget_ms)]
    if not within:
        unmet = f"no point tried kept p99 within {budget_ms:g} ms with no errors"
        return Choice(
            default, f"{unmet}: the model's own configuration is written unchanged", False
        )
    best = max(within, key=lambda t: (t.throughput, t.point == default))
    if best.point == default:
        return Choice(default, f"the model's own configuration is the best within "
                      f"{budget_ms:g} ms: written unchanged", False)  # fmt: skip
    own = next((t for t in within if t.point == default), None)
    than = f", {best.throughput / own.throughput:.2f}x its own" if own else " (its own is over it)"
    return Choice(best.point, f"the best within {budget_ms:g} ms{than}", True)


class Budget:
    """At most ``points`` trials, and none begun that would end past ``seconds`` (judged by
    the longest trial so far) from the budget's start."""

    def __init__(
        self, points: int, seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.points, self.seconds, self.clock = points, seconds, clock
        self.start = clock()
        self.used = 0
        self.longest = 0.0

    def allows(self) -> bool:
        elapsed = self.clock() - self.start
        return self.used < self.points and elapsed + self.longest <= self.seconds

    def spend(self, seconds: float) -> None:
        self.used += 1
        self.longest = max(self.longest, seconds)


def search(
    space: Space, measure: Callable[[Point], Trial], budget_ms: float, budget: Budget
) -> list[Trial]:
    """The trials of the coarse pass then the refinement (the module's docstring), in the
    order measured; the model's own point always first."""
    trials: dict[Point, Trial] = {}

    def tried(point: Point) -> bool:
        """Measure ``point`` if new and the budget allows; False once it no longer does."""
        if point in trials:
            return True
        if trials and not budget.allows():
            return False
        began = budget.clock()
        trials[point] = measure(point)
        budget.spend(budget.clock() - began)
        return True

    tried(space.default)
    for point in space.coarse():
        if not tried(point):
            return list(trials.values())
    # The coarse winners together: each knob at its value in the best trial that moved it alone.
    combined = {}
    for knob in KNOBS:
        others = [k for k in KNOBS if k != knob]
        alone = [
            t
            for t in trials.values()
            if all(getattr(t.point, k) == getattr(space.default, k) for k in others)
        ]
        best = choose(alone, space.default, budget_ms).point
        combined[knob] = getattr(best, knob)
    if not tried(Point(**combined)):
        return list(trials.values())
    while True:
        best = choose(trials.values(), space.default, budget_ms).point
        for point in space.neighbours(best):
            if not tried(point):
                return list(trials.values())
        if choose(trials.values(), space.default, budget_ms).point == best:
            return list(trials.values())


@dataclass(frozen=True)
class Verdict:
    """The choice measured again against the model's own point, round by round."""

    keep: bool
    ratios: dict[int, tuple[float, float, float]]  # concurrency -> median, 95 % low, high
    p99_ms: dict[int, tuple[float, float]]  # concurrency -> the own point's, the choice's median
    reason: str


def confirm(rounds: Sequence[tuple[Trial, Trial]], budget_ms: float) -> Verdict:
    """From ``rounds`` of (the model's own trial, the choice's), measured interleaved: the
    choice's requests/s over its own at each concurrency (the median of the rounds and its
    95 % interval, ``bench.judge.interval``), and whether to keep it: only when its median p99
    at every concurrency is within budget, no round had errors, and it is faster at every
    concurrency by the whole interval (as ``bench.judge`` meets a target): a choice that one
    sitting's noise flattered is not written."""
    from bench.judge import interval

    ratios: dict[int, tuple[float, float, float]] = {}
    p99: dict[int, tuple[float, float]] = {}
    concurrencies = [r.concurrency for r in rounds[0][0].readings]
    for i, c in enumerate(concurrencies):
        by_round = [chosen.readings[i].rps / own.readings[i].rps for own, chosen in rounds]
        ratios[c] = (statistics.median(by_round), *interval(by_round))
        p99[c] = (
            statistics.median(own.readings[i].p99_ms for own, _ in rounds),
            statistics.median(chosen.readings[i].p99_ms for _, chosen in rounds),
        )
    errors = sum(r.errors for _, chosen in rounds for r in chosen.readings)
    gain = math.exp(statistics.fmean(math.log(m) for m, _, _ in ratios.values()))
    if errors:
        return Verdict(False, ratios, p99, f"measured again, the choice failed {errors} requests")
    if any(p > budget_ms for _, p in p99.values()):
        return Verdict(False, ratios, p99, "measured again, the choice's p99 went over budget")
    if any(low <= 1.0 for _, low, _ in ratios.values()):
        return Verdict(False, ratios, p99, f"measured again, the choice was {gain:.2f}x its own, "
                       "not faster at every concurrency by the whole 95 % interval")  # fmt: skip
    return Verdict(True, ratios, p99, f"measured again, {gain:.2f}x the model's own")


def tuned_text(original: str, point: Point, comments: Sequence[str]) -> str:
    """``original`` (a config.pbtxt) with ``point``'s batch limit, queue delay and instance
    count, every other field kept, under ``comments`` (``#`` lines of the text format)."""
    message = parse_config(original)
    if message.max_batch_size:
        message.max_batch_size = point.max_batch_size
        message.dynamic_batching.max_queue_delay_microseconds = point.max_queue_delay_us
    kind = message.instance_group[0].kind if message.instance_group else None
    del message.instance_group[:]
    if point.instances != 1:
        group = message.instance_group.add(count=point.instances)
        if kind:
            group.kind = kind
    return "".join(f"# {line}\n" for line in comments) + message_pbtxt(message)


def svg_plot(trials: Sequence[Trial], chosen: Point, default: Point, budget_ms: float) -> str:
    """Throughput against p99 of every point at every concurrency, a colour per concurrency;
    the chosen point ringed, the model's own squared, the budget a dashed line."""
    width, height, pad = 640, 420, 56
    readings = [(t.point, r) for t in trials for r in t.readings]
    top_x = max([budget_ms, *(r.p99_ms for _, r in readings)]) * 1.1
    top_y = max(r.rps for _, r in readings) * 1.1 or 1.0

    def x(ms: float) -> float:
        return pad + (width - 2 * pad) * ms / top_x

    def y(rps: float) -> float:
        return height - pad - (height - 2 * pad) * rps / top_y

    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
    concurrencies = sorted({r.concurrency for _, r in readings})
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 16}" text-anchor="middle">p99 (ms)</text>',
        f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})" '
        'text-anchor="middle">requests/s</text>',
        f'<line x1="{x(budget_ms):.1f}" y1="{pad}" x2="{x(budget_ms):.1f}" y2="{height - pad}" '
        'stroke="grey" stroke-dasharray="4 3"/>',
        f'<text x="{x(budget_ms) + 4:.1f}" y="{pad + 12}" fill="grey">budget '
        f"{budget_ms:g} ms</text>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{x(top_x * fraction / 1.1):.1f}" y="{height - pad + 16}" '
                     f'text-anchor="middle">{top_x * fraction / 1.1:.3g}</text>')  # fmt: skip
        parts.append(f'<text x="{pad - 4}" y="{y(top_y * fraction / 1.1) + 4:.1f}" '
                     f'text-anchor="end">{top_y * fraction / 1.1:.3g}</text>')  # fmt: skip
    for index, c in enumerate(concurrencies):
        colour = colours[index % len(colours)]
        parts.append(f'<text x="{width - pad}" y="{pad + 16 * index}" text-anchor="end" '
                     f'fill="{colour}">c={c}</text>')  # fmt: skip
        for point, r in readings:
            if r.concurrency != c:
                continue
            cx, cy = x(r.p99_ms), y(r.rps)
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{colour}">'
                         f"<title>{point.describe()}: c={c}</title></circle>")  # fmt: skip
            if point == chosen:
                parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" '
                             f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
                parts.append(f'<text x="{cx + 10:.1f}" y="{cy - 8:.1f}">chosen</text>')
            if point == default:
                parts.append(f'<rect x="{cx - 6:.1f}" y="{cy - 6:.1f}" width="12" height="12" '
                             f'fill="none" stroke="{colour}"/>')  # fmt: skip
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def progress(message: str) -> None:
    print(f"gelu-serve tune: {message}", file=sys.stderr, flush=True)


def row(point: Point, reading: Reading, within: bool) -> str:
    """One line of the table of points tried."""
    return (
        f"| {point.max_batch_size} | {point.max_queue_delay_us} | {point.instances} | "
        f"{point.threads} | {reading.concurrency} | {reading.rps:.0f} | {reading.p99_ms:.2f} | "
        f"{reading.errors} | {reading.mean_batch:.1f} | {'yes' if within else 'no'} |"
    )


TABLE_HEAD = (
    "| max_batch_size | delay us | instances | threads | c | req/s | p99 ms | errors | "
    "mean batch | within budget |\n|---|---|---|---|---|---|---|---|---|---|"
)


class Runner:
    """Real points: a scratch repository holding a copy of the model, a fresh server for each
    point, wrk driving it."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, original: str) -> None:
        self.args = args
        self.original = original
        self.config = load_model_config(original, model_dir.name)
        self.concurrencies = [int(c) for c in args.concurrency.split(",")]
        self.scratch = Path(tempfile.mkdtemp(prefix="gelu-tune-"))
        self.model_dir = self.scratch / model_dir.name
        tuned = shutil.ignore_patterns("*" + TUNED_SUFFIX)
        shutil.copytree(model_dir, self.model_dir, ignore=tuned)
        self.request = request_for(self.config)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    @contextmanager
    def serving(self, point: Point) -> Iterator[Any]:
        """A fresh server of the model configured as ``point``, warmed for a second."""
        from bench.launch import SERVICE_APP, server
        from bench.measure import drive

        text = tuned_text(self.original, point, [])
        (self.model_dir / CONFIG_FILENAME).write_text(text)
        env = {
            "GELU_MODEL_REPOSITORY": str(self.scratch),
            "GELU_LOG_LEVEL": "warning",
            "GELU_DRAIN_SECONDS": "0",
            "GELU_INTRA_OP_THREADS": str(point.threads),
        }
        ready = f"/v2/models/{self.config.name}/ready"
        with server(SERVICE_APP, env, 1, self.args.server_cpus, ready) as target:
            drive(target, self.request, max(self.concurrencies), 1, self.args.client_cpu)
            yield target

    def readings(self, target: Any) -> tuple[Reading, ...]:
        """wrk at each concurrency, with the mean batch the requests ran in (from /metrics).
        Once each: a point that read slow is measured again by ``confirm`` if chosen."""
        from bench.measure import batch_totals, drive

        got = []
        for c in self.concurrencies:
            before = batch_totals(target)
            m = drive(target, self.request, c, self.args.seconds, self.args.client_cpu)
            samples, runs = (a - b for a, b in zip(batch_totals(target), before, strict=True))
            got.append(
                Reading(c, m["rps"], m["p99_ms"], m["errors"], samples / runs if runs else 0)
            )
        return tuple(got)

    def measure(self, point: Point) -> Trial:
        with self.serving(point) as target:
            return Trial(point, self.readings(target))


def request_for(config: ModelConfig) -> Any:
    """A V2 binary request of one sample of random values for every input of ``config``
    (a variable dimension taken as 1), its outputs asked for in binary."""
    import json

    import numpy as np

    from bench.wrk import Request

    rng = np.random.default_rng(0)
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    blobs = []
    for tensor in config.inputs:
        dims = [d if d > 0 else 1 for d in tensor.dims]
        shape = [1, *dims] if config.max_batch_size else dims
        if tensor.datatype == "BYTES":
            raise ValueError(f"{config.name}: input {tensor.name} is BYTES; tune drives numbers")
        values = rng.random(shape) * 2 - 1
        blob = np.asarray(values, dtype=tensor.numpy_dtype.newbyteorder("<")).tobytes()
        header["inputs"].append({"name": tensor.name, "shape": shape, "datatype": tensor.datatype,
                                 "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
        blobs.append(blob)
    head = json.dumps(header).encode()
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": str(len(head))}  # fmt: skip
    return Request(f"/v2/models/{config.name}/infer", head + b"".join(blobs), headers)


def run(args: argparse.Namespace) -> None:
    """``gelu-serve tune``: search, print, confirm, write, draw."""
    if shutil.which("wrk") is None:
        raise FileNotFoundError("wrk missing: `make tools` installs it (Debian's wrk)")
    model_dir = Path(args.repository) / args.model
    config_file = model_dir / CONFIG_FILENAME
    if not config_file.is_file():
        raise FileNotFoundError(f"no {config_file}: name a model of --repository")
    out = Path(args.out) if args.out else model_dir / (CONFIG_FILENAME + TUNED_SUFFIX)
    if out.exists():
        raise FileExistsError(f"{out} exists: tune never overwrites; move it or name --out")
    if args.plot and Path(args.plot).exists():
        raise FileExistsError(f"{args.plot} exists: tune never overwrites; name another --plot")
    original = config_file.read_text()
    runner = Runner(args, model_dir, original)
    from bench.proc import cpu_list

    cpus = len(cpu_list(args.server_cpus))
    space = space_for(runner.config, cpus, args.threads)
    budget = Budget(args.max_points, args.budget_seconds)
    started = time.monotonic()

    def measured(point: Point) -> Trial:
        progress(f"point {budget.used + 1}/{args.max_points}, {time.monotonic() - started:.0f} s "
                 f"of {args.budget_seconds:g}: {point.describe()}")  # fmt: skip
        trial = runner.measure(point)
        figures = "; ".join(
            f"c={r.concurrency} {r.rps:.0f} req/s p99 {r.p99_ms:.1f} ms"
            + (f" {r.errors} errors" if r.errors else "")
            for r in trial.readings
        )
        progress(f"  {figures}")
        return trial

    try:
        trials = search(space, measured, args.p99_budget_ms, budget)
        progress(f"searched {len(trials)} points in {time.monotonic() - started:.0f} s")
        print(f"{args.model}: {len(trials)} points at c={args.concurrency}, "
              f"{args.seconds:g} s each, p99 budget {args.p99_budget_ms:g} ms")  # fmt: skip
        print(TABLE_HEAD)
        for trial in trials:
            for reading in trial.readings:
                print(row(trial.point, reading, trial.within(args.p99_budget_ms)))
        choice = choose(trials, space.default, args.p99_budget_ms)
        print(f"chosen: {choice.point.describe()}: {choice.reason}")
        if choice.improved and args.rounds:
            verdict = confirmed(runner, space.default, choice.point, args)
            if verdict.keep:
                choice = dataclasses.replace(choice, reason=f"{choice.reason}; {verdict.reason}")
            else:
                choice = Choice(space.default, f"{verdict.reason}: the model's own configuration"
                                " is written unchanged", False)  # fmt: skip
            print(f"kept: {choice.point.describe()}: {verdict.reason}")
    finally:
        runner.close()
    chosen_trial = next(t for t in trials if t.point == choice.point)
    comments = [
        f"gelu-serve tune {args.model}: {choice.reason}.",
        f"p99 budget {args.p99_budget_ms:g} ms at c={args.concurrency}; measured: "
        + "; ".join(f"c={r.concurrency} {r.rps:.0f} req/s, p99 {r.p99_ms:.1f} ms"
                    for r in chosen_trial.readings),
        f"Serve with GELU_INTRA_OP_THREADS={choice.point.threads} (a server setting, not a "
        "model's).",
    ]  # fmt: skip
    text = tuned_text(original, choice.point, comments)
    load_model_config(text, args.model)  # what is written reads back, or nothing is written
    out.write_text(text)
    print(f"wrote {out}")
    if args.plot:
        Path(args.plot).write_text(
            svg_plot(trials, choice.point, space.default, args.p99_budget_ms)
        )
        print(f"drew {args.plot}")


def confirmed(runner: Runner, own: Point, chosen: Point, args: argparse.Namespace) -> Verdict:
    """``confirm`` over ``args.rounds`` rounds, each a fresh server of each point, driven one
    right after the other, in the other order every other round; printed."""
    rounds = []
    for index in range(args.rounds):
        order = [own, chosen] if index % 2 == 0 else [chosen, own]
        got = {}
        for point in order:
            progress(f"round {index + 1}/{args.rounds}: {point.describe()}")
            got[point] = runner.measure(point)
        rounds.append((got[own], got[chosen]))
    verdict = confirm(rounds, args.p99_budget_ms)
    print("| c | chosen / own req/s, median [95 %] | own p99 ms | chosen p99 ms |")
    print("|---|---|---|---|")
    for c, (middle, low, high) in verdict.ratios.items():
        own_p99, chosen_p99 = verdict.p99_ms[c]
        print(f"| {c} | {middle:.2f}x [{low:.2f}, {high:.2f}] | {own_p99:.1f} | {chosen_p99:.1f} |")
    return verdict
