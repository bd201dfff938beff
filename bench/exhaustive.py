"""Every float32 input through every activation kernel, against the correctly rounded value.

``make accuracy-exhaustive`` (``python -m bench.exhaustive --out docs``) runs all 2^32 bit
patterns (NaNs, infinities, zeros and subnormals included) through each function and derivative
the activation endpoint serves, on the accurate kernel and, for the functions an exported model
can contain, the native one (onnxruntime's own ops, one thread), and writes
``docs/accuracy-exhaustive.md``: per function and kernel the largest error in float32 ULPs and
where, how many results are not correctly rounded (above 0.5 ULP), where the errors above 1 ULP
lie, and the results at the special values.

The reference is correctly rounded at every input: each function is evaluated in float64
(scipy's ``ndtr``, numpy's ``exp``/``expm1``, in forms that do not cancel except where the
function itself crosses zero) with an error bound; where the float32 rounding boundary nearest
the float64 value lies within that bound, the 50-digit mpmath reference of ``make accuracy``
decides. The line is cut into ``CHUNKS`` chunks of consecutive bit patterns; each (function,
chunk) leaves a checkpoint file, so a stopped run resumes where it stopped, and the report can
be written from whatever has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import mpmath
import numpy as np
import scipy.special

from bench.accuracy import DIGITS, EXHAUSTIVE_BLOCK, EXHAUSTIVE_REPORT, LIMITS, REFERENCES
from contract.readme import replace_block
from service.activations import (
    ACCURATE,
    ACTIVATIONS,
    NATIVE,
    SIGMOID_GELU_SCALE,
    SQRT_2_OVER_PI,
    TANH_CUBIC,
    kernels,
)

BITS = 32
CHUNK_BITS = 22  # 2^22 inputs a chunk: 16 MB of float32, a few float64 arrays of 32 MB
CHUNKS = 1 << (BITS - CHUNK_BITS)
CHUNK = 1 << CHUNK_BITS
# The float64 reference's error bound, relative to the sum of the magnitudes of the terms it
# adds: scipy's ndtr (Cephes' erfc, 5.7e-14 peak relative error as Cephes measured it), numpy's
# exp within a few float64 ulps, and arguments at most ~110 in magnitude where a result is not
# zero in float32 (an argument's rounding error scaled by it, 1.2e-14) stay below 1e-13;
# 2^-40 (9.1e-13) leaves a factor of 9.
RELATIVE_BOUND = 2.0**-40
ABSOLUTE_BOUND = 2.0**-1060  # float64's subnormals, far below float32's smallest (2^-149)
# Below this |x|, f(x) = x/2 + c x^2 + ... is x/2 to within one float64 step (the x^2 term is
# 2^-60 of it at most), and the sign of c x^2 settles the rounding (``_half_near_zero``).
TAYLOR_BELOW = 2.0**-60
SMALLEST = 2.0**-149  # float32's smallest subnormal: the ULP of a zero result
_LARGEST = float(np.finfo(np.float32).max)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
F32 = np.float32

Function = tuple[str, bool]  # (activation, derivative)
Reference64 = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


# ---- the float64 reference: (value, the magnitudes its error is relative to) at finite x ------

# Where numpy's exp underflows to 0 and scipy's ndtr is 0 or 1 in float64 (|Phi - H| < 1e-349),
# their answers are known; computed, they take 10-20 times as long (half the line is there).
EXP_UNDERFLOW = -746.0
NDTR_SATURATED = 40.0


def _exp(a: np.ndarray) -> np.ndarray:
    """np.exp(a), without its slow path where the result underflows to 0."""
    low = a < EXP_UNDERFLOW
    if not low.any():
        return np.exp(a)
    return np.exp(a, out=np.zeros_like(a), where=~low)


def _ndtr(x: np.ndarray) -> np.ndarray:
    """scipy's ndtr(x), the same values, without computing where it is 0 or 1."""
    inside = np.abs(x) < NDTR_SATURATED
    if inside.all():
        return np.asarray(scipy.special.ndtr(x))
    out = (x > 0).astype(np.float64)
    if inside.any():
        out[inside] = scipy.special.ndtr(x[inside])
    return out


def _sigmoids(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sigmoid(v) and sigmoid(-v), neither by subtraction from 1."""
    e = _exp(-np.abs(v))
    big, small = 1.0 / (1.0 + e), e / (1.0 + e)
    positive = v > 0
    return np.where(positive, big, small), np.where(positive, small, big)


def _sigmoid_form(
    v: Callable[[np.ndarray], np.ndarray], w: Callable[[np.ndarray], np.ndarray]
) -> tuple[Reference64, Reference64]:
    """x sigmoid(v(x)) and its derivative sigmoid(v) (1 + w sigmoid(-v)), w = x v'(x)."""

    def forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _half_near_zero(x, x * _sigmoids(v(x))[0])

    def derivative(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, s_minus = _sigmoids(v(x))
        ws = w(x) * s_minus
        return s * (1.0 + ws), s * (1.0 + np.abs(ws))

    return forward, derivative


def _half_near_zero(x: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, |value|) for f(x) = x g(x) with g(0) = 1/2 and g'(0) > 0, settled near 0.

    There f(x) = x/2 + c x^2 with c > 0, and float64 returns x/2 alone, which for an odd
    subnormal x is exactly halfway between two float32s; the x^2 term, above it, decides. One
    float64 step up from x/2 rounds to float32 as the exact value does (and is not within the
    bound of a boundary, so mpmath is not asked 2^23 times a function).
    """
    tiny = (np.abs(x) < TAYLOR_BELOW) & (x != 0)
    value[tiny] = np.nextafter(x[tiny] / 2, np.inf)
    magnitude = np.abs(value)
    magnitude[tiny] = 0.0
    return value, magnitude


def _gelu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _half_near_zero(x, x * _ndtr(x))


def _gelu_derivative(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cdf, density = _ndtr(x), x * _pdf(x)[0]
    value = cdf + density
    # Below the root (about -0.75) the derivative is negative: where both terms underflow
    # (x < -38), its float32 value is -0, not the +0 that 0 + -0 gives.
    value[(value == 0) & (x < 0)] = -0.0
    return value, cdf + np.abs(density)


def _pdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    value = _exp(-0.5 * (x * x)) * INV_SQRT_2PI  # x * x is exact for a float32 x
    return value, value


def _phi(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    value = _ndtr(x)
    return value, value


def _exact(f: Callable[[np.ndarray], np.ndarray]) -> Reference64:
    return lambda x: (f(x), np.zeros(1))


def _elu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    value = np.where(x > 0, x, np.expm1(np.where(x > 0, 0.0, x)))  # expm1(-0) = -0
    return value, np.abs(value)


def _elu_derivative(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    value = _exp(np.minimum(x, 0.0))
    return value, value


_K_TANH = 2.0 * SQRT_2_OVER_PI
REFERENCE64: dict[Function, Reference64] = {
    ("gelu", False): _gelu,
    ("gelu", True): _gelu_derivative,
    **dict(
        zip(
            (("gelu_tanh", False), ("gelu_tanh", True)),
            _sigmoid_form(
                lambda x: _K_TANH * (x + TANH_CUBIC * (x * x * x)),  # x**3 is 20 times slower
                lambda x: _K_TANH * (x + 3 * TANH_CUBIC * (x * x * x)),
            ),
            strict=True,
        )
    ),
    **dict(
        zip(
            (("gelu_sigmoid", False), ("gelu_sigmoid", True)),
            _sigmoid_form(lambda x: SIGMOID_GELU_SCALE * x, lambda x: SIGMOID_GELU_SCALE * x),
            strict=True,
        )
    ),
    **dict(
        zip(
            (("silu", False), ("silu", True)),
            _sigmoid_form(lambda x: x, lambda x: x),
            strict=True,
        )
    ),
    # IEEE 754-2019's maximum: relu(-0) = +0.
    ("relu", False): _exact(lambda x: np.maximum(x, 0.0)),
    ("relu", True): _exact(lambda x: (x > 0).astype(np.float64)),
    ("elu", False): _elu,
    ("elu", True): _elu_derivative,
    ("phi", False): _phi,
    ("phi", True): _pdf,
}
FUNCTIONS: tuple[Function, ...] = tuple(
    (name, derivative) for name in ACTIVATIONS for derivative in (False, True)
)


def _round_mp(value: mpmath.mpf) -> tuple[np.float32, float]:
    """``value`` correctly rounded to float32 (ties to even), and as a float64."""
    near = F32(float(value))  # at most one float32 off: the double rounding's only error
    with np.errstate(over="ignore"):
        candidates = [np.nextafter(near, F32(-np.inf)), near, np.nextafter(near, F32(np.inf))]
    finite = [c for c in candidates if np.isfinite(c)]
    distances = [abs(mpmath.mpf(float(c)) - value) for c in finite]
    best = min(distances)
    tied = [c for c, d in zip(finite, distances, strict=True) if d == best]
    # A tie between two floats: the one whose significand is even.
    chosen = min(tied, key=lambda c: int(np.array(c).view(np.uint32)) & 1)
    return F32(chosen), float(value)


@cache
def limits_at_infinity(function: Function) -> tuple[float, float]:
    """f(-inf) and f(+inf): ``make accuracy``'s limits, a zero signed as the function
    approaches it (gelu(x) < 0 for every x < 0: -0 at -inf, as at -3.4e38)."""
    signed = []
    for limit, end in zip(LIMITS[function[0]][function[1]], (-np.inf, np.inf), strict=True):
        if limit == 0:
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                near = REFERENCE64[function](np.array([np.sign(end) * float(np.finfo(F32).max)]))
            limit = math.copysign(0.0, float(near[0][0]))
        signed.append(limit)
    return signed[0], signed[1]


def reference(function: Function, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The correctly rounded float32 value of ``function`` at each float32 ``x``, the value as
    float64 (for the error in ULPs), and how many points needed mpmath to decide.

    NaN for NaN, the limits at +-inf; at finite points the float64 evaluation, unless a float32
    rounding boundary is within its error bound, then mpmath at ``DIGITS`` digits.
    """
    x64 = x.astype(np.float64)
    finite = np.isfinite(x64)
    everywhere = bool(finite.all())
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        value, magnitude = REFERENCE64[function](x64 if everywhere else np.where(finite, x64, 0.0))
    if not everywhere:
        low, high = limits_at_infinity(function)
        limits = np.where(x64 > 0, high, np.where(x64 < 0, low, np.nan))
        value = np.where(finite, value, limits)
    rounded = value.astype(F32)
    bound = RELATIVE_BOUND * magnitude + ABSOLUTE_BOUND
    # Rounding is monotonic: a rounding boundary lies within the bound iff its ends round apart.
    with np.errstate(over="ignore", invalid="ignore"):
        near = (value - bound).astype(F32) != (value + bound).astype(F32)
    unsure = np.flatnonzero(finite & near)
    if unsure.size:
        exact = REFERENCES[function[0]][function[1]]
        with mpmath.workdps(DIGITS):
            for i in unsure:
                rounded[i], value[i] = _round_mp(exact(mpmath.mpf(float(x64[i]))))
    return rounded, value, int(unsure.size)


# ---- one chunk ---------------------------------------------------------------------------------

BLOCK = 1 << 16  # values per pass of numpy: the float64 temporaries stay in cache
ACCURATE_ON_ONNXRUNTIME = "accurate-onnxruntime"  # the same formulas as float64 ONNX graphs


def chunk_inputs(chunk: int) -> np.ndarray:
    """The float32 values of bit patterns [chunk * CHUNK, (chunk + 1) * CHUNK)."""
    start = np.uint32(chunk * CHUNK)
    return (np.arange(CHUNK, dtype=np.uint32) + start).view(F32)


def ulp_errors(got: np.ndarray, rounded: np.ndarray, value: np.ndarray) -> np.ndarray:
    """|got - exact| in ULPs of the exact value rounded to float32 (``rounded``; a zero's ULP is
    the smallest subnormal): at most 0.5 for a correctly rounded result. 0 where both are NaN or
    the same infinity, inf for NaN against a number or a wrong infinity."""
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = np.spacing(np.abs(rounded)).astype(np.float64)
        spacing[np.abs(rounded) == _LARGEST] = 2.0**104  # numpy's spacing there is inf
        error = np.abs(got.astype(np.float64) - value) / spacing
    special = ~np.isfinite(error)
    if special.any():
        same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
        error[special] = np.where(same[special], 0.0, np.inf)
    return error


@dataclass
class Tally:
    """What one kernel did on some inputs: the worst error and where, and the counts."""

    worst: float = 0.0  # among the results not correctly rounded (0: every result was)
    worst_x: float = math.nan
    not_rounded: int = 0  # results other than the correctly rounded float32 (above 0.5 ULP)
    above_one: int = 0  # results more than 1 ULP off
    zero_sign: int = 0  # a zero of the other sign than the correctly rounded zero
    above_one_low: float = math.inf  # the least and greatest x more than 1 ULP off
    above_one_high: float = -math.inf

    def add(self, x: np.ndarray, got: np.ndarray, rounded: np.ndarray, value: np.ndarray) -> None:
        """Tally ``got`` at ``x`` against the correctly rounded ``rounded`` (``value``: the
        exact value as float64). Only results whose bits differ are looked at further."""
        (i,) = np.nonzero(got.view(np.uint32) != rounded.view(np.uint32))
        if not i.size:
            return
        got, rounded, value, x = got[i], rounded[i], value[i], x[i]
        nans = np.isnan(got) & np.isnan(rounded)  # another NaN's payload: the same answer
        zeros = (got == 0) & (rounded == 0)
        self.zero_sign += int(np.count_nonzero(zeros))
        wrong = ~(nans | zeros)
        if not wrong.any():
            return
        got, rounded, value, x = got[wrong], rounded[wrong], value[wrong], x[wrong]
        self.not_rounded += int(got.size)
        error = ulp_errors(got, rounded, value)
        worst = int(np.argmax(error))
        if error[worst] > self.worst:
            self.worst, self.worst_x = float(error[worst]), float(x[worst])
        far = x[error > 1.0]
        if far.size:
            self.above_one += int(far.size)
            self.above_one_low = min(self.above_one_low, float(far.min()))
            self.above_one_high = max(self.above_one_high, float(far.max()))

    def merge(self, other: Tally) -> None:
        if other.worst > self.worst:
            self.worst, self.worst_x = other.worst, other.worst_x
        self.not_rounded += other.not_rounded
        self.above_one += other.above_one
        self.zero_sign += other.zero_sign
        self.above_one_low = min(self.above_one_low, other.above_one_low)
        self.above_one_high = max(self.above_one_high, other.above_one_high)


def available_kernels(function: Function) -> tuple[str, ...]:
    """The kernels that evaluate ``function``: the endpoint's, and the accurate graphs."""
    name, derivative = function
    return (*kernels(ACTIVATIONS[name], derivative), ACCURATE_ON_ONNXRUNTIME)


class Kernels:
    """The endpoint's kernels in this process: the accurate one compiled (as served on the
    CPU), its float64 graphs on onnxruntime, and the native ops on onnxruntime, one thread."""

    def __init__(self) -> None:
        from bench.accuracy import evaluator

        self.compiled = evaluator(compile=True)
        self._graphs: Any = None

    def evaluate(self, function: Function, kernel: str, x: np.ndarray) -> np.ndarray:
        name, derivative = function
        if kernel == ACCURATE_ON_ONNXRUNTIME:
            if self._graphs is None:
                from bench.accuracy import evaluator

                self._graphs = evaluator(compile=False)
            return np.asarray(self._graphs.evaluate(name, x, derivative, ACCURATE))
        return np.asarray(self.compiled.evaluate(name, x, derivative, kernel))


def sweep(
    engine: Kernels, function: Function, x: np.ndarray, kernel_names: Iterable[str]
) -> tuple[dict[str, Tally], int]:
    """Every input of ``x`` through ``function`` on each of ``kernel_names`` it has: a tally
    per kernel, and how many inputs mpmath decided."""
    chosen = [k for k in kernel_names if k in available_kernels(function)]
    outputs = {k: engine.evaluate(function, k, x) for k in chosen}
    tallies = {k: Tally() for k in chosen}
    decided = 0
    for start in range(0, x.size, BLOCK):
        part = x[start : start + BLOCK]
        rounded, value, unsure = reference(function, part)
        decided += unsure
        for k in chosen:
            tallies[k].add(part, outputs[k][start : start + BLOCK], rounded, value)
    return tallies, decided


def sweep_chunk(
    engine: Kernels, function: Function, chunk: int, kernel_names: Iterable[str]
) -> dict[str, Any]:
    """``sweep`` over ``chunk``, as its checkpoint holds it."""
    started = time.monotonic()
    x = chunk_inputs(chunk)
    tallies, decided = sweep(engine, function, x, kernel_names)
    return {
        "chunk": chunk,
        "low": float(x[0]),
        "high": float(x[-1]),
        "mpmath": decided,
        "seconds": round(time.monotonic() - started, 3),
        "kernels": {k: vars(t) for k, t in tallies.items()},
    }


# ---- the run: (function, chunk) tasks over worker processes, a checkpoint file for each ------


def label(function: Function) -> str:
    name, derivative = function
    return f"{name}'" if derivative else name


def checkpoint(state: Path, function: Function, chunk: int) -> Path:
    return state / label(function).replace("'", "_derivative") / f"{chunk:04d}.json"


def done(path: Path, kernel_names: Iterable[str], engine_kernels: Iterable[str]) -> bool:
    """The checkpoint exists and holds every asked kernel this function has."""
    if not path.exists():
        return False
    held = json.loads(path.read_text())["kernels"]
    return all(k in held for k in kernel_names if k in engine_kernels)


_ENGINE: Kernels | None = None


def _worker_start() -> None:
    global _ENGINE
    _ENGINE = Kernels()


def _work(task: tuple[Function, int, tuple[str, ...], str]) -> tuple[Function, int, float]:
    function, chunk, kernel_names, state = task
    assert _ENGINE is not None
    result = sweep_chunk(_ENGINE, function, chunk, kernel_names)
    path = checkpoint(Path(state), function, chunk)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():  # keep kernels swept before with others
        old = json.loads(path.read_text())
        result["kernels"] = {**old["kernels"], **result["kernels"]}
        result["seconds"] = round(result["seconds"] + old["seconds"], 3)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result))
    temporary.replace(path)  # atomic: a killed run leaves a whole checkpoint or none
    return function, chunk, result["seconds"]


def run(
    state: Path,
    functions: Iterable[Function],
    kernel_names: tuple[str, ...],
    chunks: Iterable[int],
    workers: int,
) -> None:
    """Sweep every (function, chunk) not yet checkpointed, printing progress."""
    tasks = [
        (f, c, kernel_names, str(state))
        for f in functions
        for c in chunks
        if not done(checkpoint(state, f, c), kernel_names, available_kernels(f))
    ]
    total = len(tasks)
    print(f"{total} (function, chunk) tasks to sweep; checkpoints in {state}", flush=True)
    if not total:
        return
    started = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(workers, _worker_start) as pool:
        for n, (function, chunk, seconds) in enumerate(pool.imap(_work, tasks), 1):
            if n % 16 == 0 or n == total:
                elapsed = time.monotonic() - started
                eta = elapsed / n * (total - n)
                print(
                    f"[{n}/{total}] {label(function)} chunk {chunk} ({seconds:.2f} s); "
                    f"{elapsed / 60:.1f} min gone, about {eta / 60:.1f} min left",
                    flush=True,
                )


# ---- the report --------------------------------------------------------------------------------

_LOWEST_NORMAL = float(np.finfo(F32).tiny)
SPECIAL = np.array(
    [
        np.nan,
        -np.inf,
        np.inf,
        -0.0,
        0.0,
        -SMALLEST,
        SMALLEST,
        -_LOWEST_NORMAL,
        _LOWEST_NORMAL,
        -_LARGEST,
        _LARGEST,
    ],
    F32,
)
SPECIAL_NAMES = (
    "NaN",
    "-inf",
    "+inf",
    "-0",
    "+0",
    "-2^-149",
    "2^-149",
    "-2^-126",
    "2^-126",
    "-max",
    "max",
)


def _spans(runs: list[tuple[int, float, float, int]]) -> list[tuple[float, float, int]]:
    """Adjacent chunks' (chunk, low, high, count) merged: [low, high] and how many inputs in it
    are more than 1 ULP off, in x order."""
    merged: list[list[Any]] = []
    for chunk, low, high, count in sorted(runs):
        if merged and merged[-1][0] == chunk - 1:
            merged[-1][0] = chunk
            merged[-1][1] = min(merged[-1][1], low)
            merged[-1][2] = max(merged[-1][2], high)
            merged[-1][3] += count
        else:
            merged.append([chunk, low, high, count])
    return sorted(((low, high, count) for _, low, high, count in merged), key=lambda s: s[0])


def gather(state: Path) -> dict[str, Any]:
    """The checkpoints in ``state`` summed per function and per kernel (each kernel over the
    chunks swept with it)."""
    functions: dict[str, Any] = {}
    for function in FUNCTIONS:
        order = available_kernels(function)
        tallies: dict[str, Tally] = {}
        swept: dict[str, int] = {}
        runs: dict[str, list[tuple[int, float, float, int]]] = {}
        finite: dict[str, tuple[float, float]] = {}  # the worst finite error, and where
        chunks, decided, seconds = 0, 0, 0.0
        for chunk in range(CHUNKS):
            path = checkpoint(state, function, chunk)
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            chunks += 1
            decided += data["mpmath"]
            seconds += data["seconds"]
            for k, held in data["kernels"].items():
                tally = Tally(**held)
                tallies.setdefault(k, Tally()).merge(tally)
                if math.isfinite(tally.worst) and tally.worst >= finite.get(k, (0.0, 0.0))[0]:
                    finite[k] = (tally.worst, tally.worst_x)
                swept[k] = swept.get(k, 0) + 1
                if tally.above_one:
                    runs.setdefault(k, []).append(
                        (chunk, tally.above_one_low, tally.above_one_high, tally.above_one)
                    )
        functions[label(function)] = {
            "chunks": chunks,
            "mpmath": decided,
            "seconds": round(seconds, 1),
            "kernels": {
                k: {
                    **vars(tallies[k]),
                    "worst_finite": finite.get(k, (0.0, math.nan)),
                    "chunks": swept[k],
                    "spans": _spans(runs.get(k, [])),
                }
                for k in sorted(tallies, key=order.index)
            },
        }
    return {"chunks": CHUNKS, "chunk_inputs": CHUNK, "functions": functions}


def _number(x: float) -> str:
    """A float32 as numpy prints it (the shortest repr that reads back), NaN and inf too."""
    return str(F32(x)) if np.isfinite(x) else str(x)


def _ulps(value: float) -> str:
    if np.isinf(value):
        return "non-finite"
    return f"{value:.3f}" if value < 1e4 else f"{value:.2e}"


QUOTE = EXHAUSTIVE_BLOCK


def render_table(summary: dict[str, Any]) -> str:
    """The report's table, between ``QUOTE``'s markers (docs/accuracy.md quotes it)."""
    lines = [
        "| function | kernel | inputs | worst (ULP) | at x | not correctly rounded "
        "(> 0.5 ULP) | > 1 ULP | wrong-signed zeros |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in summary["functions"].items():
        for kernel, t in entry["kernels"].items():
            swept = t["chunks"]
            inputs = "all 2^32" if swept == summary["chunks"] else f"{swept * CHUNK:,}"
            worst = _ulps(t["worst"]) if t["not_rounded"] else "≤ 0.5"
            where = _number(t["worst_x"]) if t["not_rounded"] else "—"
            if math.isinf(t["worst"]):  # a NaN or an infinity: give the worst finite error too
                error, x = t["worst_finite"]
                worst, where = _ulps(error), f"{_number(x)}; non-finite at {where}"
            lines.append(
                f"| {name} | {kernel} | {inputs} | {worst} | {where} | {t['not_rounded']:,} | "
                f"{t['above_one']:,} | {t['zero_sign']:,} |"
            )
    return QUOTE[0] + "\n".join(lines) + "\n" + QUOTE[1]


def special_values(engine: Kernels, summary: dict[str, Any]) -> str:
    """A table of every function's results at ``SPECIAL`` per kernel, beside the correctly
    rounded value; ✗ marks a result whose bits differ (any NaN is a NaN)."""
    lines = ["| function | kernel | " + " | ".join(SPECIAL_NAMES) + " |"]
    lines.append("|---|---|" + "---|" * len(SPECIAL))
    for function in FUNCTIONS:
        rounded, _, _ = reference(function, SPECIAL)
        cells = [_number(float(v)) for v in rounded]
        lines.append(f"| {label(function)} | correctly rounded | " + " | ".join(cells) + " |")
        for kernel in summary["functions"][label(function)]["kernels"]:
            got = engine.evaluate(function, kernel, SPECIAL.copy())
            same = (got.view(np.uint32) == rounded.view(np.uint32)) | (
                np.isnan(got) & np.isnan(rounded)
            )
            cells = [
                _number(float(g)) + ("" if ok else " ✗") for g, ok in zip(got, same, strict=True)
            ]
            lines.append(f"| | {kernel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spans_text(summary: dict[str, Any]) -> str:
    """Where each kernel is more than 1 ULP off: x ranges (adjacent chunks merged) and counts."""
    lines = []
    for name, entry in summary["functions"].items():
        for kernel, t in entry["kernels"].items():
            if not t["above_one"]:
                continue
            ranges = ", ".join(
                f"[{_number(low)}, {_number(high)}] ({count:,})" for low, high, count in t["spans"]
            )
            lines.append(f"- {name} / {kernel}: {ranges}")
    return "\n".join(lines) if lines else "None: every kernel is within 1 ULP everywhere swept."


# ---- what the native kernels' errors do to an exported model's outputs ------------------------

MODEL_SCALES = (1.0, 4.0, 16.0)  # input = scale * N(0, 1): larger scales drive more inputs low
MODEL_ROWS = 2048


def _gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    function = ("gelu" if approximate == "none" else "gelu_tanh", False)
    return REFERENCE64[function](x)[0]


def forward64(model: Any, x: np.ndarray) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The model's outputs computed in float64 with exact GELUs (the ops the default models
    hold: Gemm, Gelu, Sigmoid, Softmax), and every Gelu's input."""
    from onnx import helper, numpy_helper

    values = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    values[model.graph.input[0].name] = x.astype(np.float64)
    gelu_inputs = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        args = [values[i] for i in node.input]
        if node.op_type == "Gemm":
            a, b = args[0], args[1]
            a = a.T if attrs.get("transA") else a
            b = b.T if attrs.get("transB") else b
            out = attrs.get("alpha", 1.0) * (a @ b)
            if len(args) > 2:
                out = out + attrs.get("beta", 1.0) * args[2]
        elif node.op_type == "Gelu":
            gelu_inputs.append(args[0])
            approximate = attrs.get("approximate", b"none")
            out = _gelu64(
                args[0], approximate.decode() if isinstance(approximate, bytes) else approximate
            )
        elif node.op_type == "Sigmoid":
            out = _sigmoids(args[0])[0]
        elif node.op_type == "Softmax":
            z = args[0] - args[0].max(axis=attrs.get("axis", -1), keepdims=True)
            e = np.exp(z)
            out = e / e.sum(axis=attrs.get("axis", -1), keepdims=True)
        else:
            raise ValueError(f"no float64 reference for the op {node.op_type}")
        values[node.output[0]] = out
    return {o.name: values[o.name] for o in model.graph.output}, gelu_inputs


def with_accurate_gelu(model: Any) -> Any:
    """A copy of ``model`` whose Gelu nodes are the accurate kernel's float64 graphs."""
    import onnx
    from onnx import helper

    from service.activations import INPUT, OUTPUT, build_graph

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for index, node in enumerate(copy.graph.node):
        if node.op_type != "Gelu":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        tanh = attrs.get("approximate", b"none") in (b"tanh", "tanh")
        graph = build_graph(ACTIVATIONS["gelu_tanh" if tanh else "gelu"], False).graph
        rename = {INPUT: node.input[0], OUTPUT: node.output[0]}
        for name in [n for inner in graph.node for n in (*inner.input, *inner.output)] + [
            t.name for t in graph.initializer
        ]:
            rename.setdefault(name, f"gelu{index}_{name}")
        for inner in graph.node:
            inner.input[:] = [rename[n] for n in inner.input]
            inner.output[:] = [rename[n] for n in inner.output]
            nodes.append(inner)
        for t in graph.initializer:
            t.name = rename[t.name]
            copy.graph.initializer.append(t)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def model_effect(repository: Path, engine: Kernels, seed: int = 0) -> str:
    """For each default model with Gelu nodes, at each input scale: how many of its GELU inputs
    the native kernel evaluates more than 1 ULP off, and the largest absolute error that makes;
    then the outputs' largest error against a float64 forward pass, with the native Gelu and with
    the accurate one spliced in (onnxruntime, one thread, the same GEMMs), and how many predicted
    classes differ between the two."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    rng = np.random.default_rng(seed)
    runs: list[str] = []
    ratios: list[float] = []
    classes = 0
    lines = [
        "| model | input scale | GELU inputs > 1 ULP off (native) | largest GELU error | "
        "output | worst error, native Gelu | worst error, accurate GELU | native - accurate | "
        "classes changed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(repository.glob("*/1/model.onnx")):
        model = onnx.load(path)
        gelus = [n for n in model.graph.node if n.op_type == "Gelu"]
        if not gelus:
            continue
        tanh = any(a.s == b"tanh" for n in gelus for a in n.attribute)
        function = ("gelu_tanh" if tanh else "gelu", False)
        sessions = [
            ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
            for m in (model, with_accurate_gelu(model))
        ]
        runs.append(f"`{path.parent.parent.name}`: {_optimized_gelus(model)}")
        feed = model.graph.input[0]
        width = feed.type.tensor_type.shape.dim[1].dim_value
        for scale in MODEL_SCALES:
            x = (scale * rng.standard_normal((MODEL_ROWS, width))).astype(F32)
            exact, gelu_inputs = forward64(model, x)
            pre = np.concatenate([g.ravel() for g in gelu_inputs]).astype(F32)
            rounded, value, _ = reference(function, pre)
            gelu = engine.evaluate(function, NATIVE, pre)
            off = int(np.count_nonzero(ulp_errors(gelu, rounded, value) > 1.0))
            gelu_error = float(np.max(np.abs(gelu.astype(np.float64) - value)))
            native, accurate = (s.run(None, {feed.name: x}) for s in sessions)
            for i, output in enumerate(model.graph.output):
                want = exact[output.name]
                errors = [float(np.max(np.abs(r[i] - want))) for r in (native, accurate)]
                ratios.append(errors[0] / errors[1])
                apart = float(np.max(np.abs(native[i] - accurate[i])))
                changed = "—"
                if output.name in ("probabilities", "logits"):
                    differ = native[i].argmax(axis=1) != accurate[i].argmax(axis=1)
                    changed = str(int(np.count_nonzero(differ)))
                    classes += int(np.count_nonzero(differ))
                lines.append(
                    f"| {path.parent.parent.name} | {scale:g} | {off:,} of {pre.size:,} | "
                    f"{gelu_error:.1e} | {output.name} | {errors[0]:.2e} | {errors[1]:.2e} | "
                    f"{apart:.2e} | {changed} |"
                )
    ran = "; ".join(runs)
    # Within a factor of 2 either way and no class changed: the native Gelu's errors are lost
    # in the GEMMs' own float32 rounding; otherwise they reach the outputs.
    lost = max(ratios) < 2 and classes == 0
    verdict = (
        "the GEMMs' float32 rounding, not the Gelu, sets the outputs' error"
        if lost
        else "the native Gelu's errors reach the outputs"
    )
    return (
        f"The Gelu nodes onnxruntime runs, after its graph optimizations: {ran}.\n\n"
        + "\n".join(lines)
        + f"\n\nThe worst output error with the native Gelu is {min(ratios):.2f} to "
        f"{max(ratios):.2f} times that with the accurate GELU, row for row above, and "
        f"{classes} predicted classes differ: {verdict}."
    )


def _optimized_gelus(model: Any) -> str:
    """The GELU ops left in ``model`` once onnxruntime has optimized it (its default level, as
    the service loads models), counted by domain and mode: the ops the native sweep ran."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import helper

    with tempfile.TemporaryDirectory() as directory:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        options.log_severity_level = 3  # its warning that the file is for this machine only
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    kinds: dict[str, int] = {}
    for node in optimized.graph.node:
        if "Gelu" in node.op_type:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            mode = attrs.get("approximate", b"none")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            kind = f"{node.domain or 'ai.onnx'} {node.op_type} (approximate={mode})"
            kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{n} x {kind}" for kind, n in kinds.items()) or "none"


# ---- the command -------------------------------------------------------------------------------

STATE = Path(".exhaustive")  # the checkpoints (git ignores them)
DEFAULT_KERNELS = (ACCURATE, NATIVE)
REPORT = EXHAUSTIVE_REPORT
SUMMARY = "accuracy-exhaustive.json"
ACCURACY_DOC = "accuracy.md"  # quotes the table


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def write_report(state: Path, out: Path, repository: Path | None) -> dict[str, Any]:
    """Write ``REPORT`` and ``SUMMARY`` into ``out`` from the checkpoints in ``state``, and
    the table's quote into ``out``/``ACCURACY_DOC``; return the summary."""
    summary = gather(state)
    engine = Kernels()
    complete = all(
        k["chunks"] == CHUNKS for f in summary["functions"].values() for k in f["kernels"].values()
    )
    cpu = sum(f["seconds"] for f in summary["functions"].values())
    decided = sum(f["mpmath"] for f in summary["functions"].values())
    coverage = (
        "every one of the 2^32 float32 bit patterns"
        if complete
        else "every one of the 2^32 float32 bit patterns where a row's `inputs` says `all 2^32`, "
        "and part of the line where it gives a count (the rest was not swept)"
    )
    markdown = [
        "# Every float32 input, every activation kernel",
        "",
        f"Generated by `make accuracy-exhaustive` (`python -m bench.exhaustive --out {out}`: "
        f"{CHUNKS} chunks of 2^{CHUNK_BITS} inputs per function, {cpu / 3600:.1f} hours of "
        "worker time in all, niced on a shared machine; load average "
        f"{os.getloadavg()[0]:.1f} as the report was written). "
        f"It ran {coverage} through each function and derivative the activation endpoint "
        f"serves: the `{ACCURATE}` kernel ({engine.compiled.accurate}) and, for the functions "
        f"an exported model can contain, the `{NATIVE}` one: the one-node models "
        "`?kernel=native` runs (ONNX opset 20 `Gelu` with approximate none and tanh, "
        f"`Sigmoid` and `Mul`, `Relu`, `Elu`) on onnxruntime {_ort_version()}'s CPU provider, "
        "one thread. Rows `accurate-onnxruntime` are the accurate kernel's formulas as float64 "
        "ONNX graphs on onnxruntime (as it runs on other execution providers or with "
        "`GELU_COMPILE_ACTIVATIONS=false`), swept for the functions that have such a row. "
        "The reference is correctly rounded at every input: float64 (scipy's `ndtr`, numpy's "
        "`exp`/`expm1`), and where a float32 rounding boundary lies within the float64 value's "
        f"error bound (2^-40 of its terms' magnitudes), mpmath at {DIGITS} digits "
        f"({decided:,} inputs). An error in ULPs is |result - exact| / ulp(exact rounded to "
        "float32), a zero's ULP being 2^-149; NaN inputs must give a NaN (any payload), ±inf "
        "the limits. `worst` is over the results not correctly rounded (`≤ 0.5`: every "
        "result was); a wrong-signed zero is counted apart, not as an error in ULPs.",
        "",
        render_table(summary),
        "",
        "## Where the errors above 1 ULP are",
        "",
        "x ranges holding every input more than 1 ULP off (adjacent chunks merged; a range is "
        "the least and greatest such input, not every input in it), with how many:",
        "",
        spans_text(summary),
        "",
        "## Special values",
        "",
        special_values(engine, summary),
        "",
    ]
    if repository is not None:
        markdown += [
            "## What the native kernels' errors do to an exported model",
            "",
            f"Each default model with Gelu nodes (`{repository}`), {MODEL_ROWS} rows of "
            "scale x N(0, 1) inputs per scale (seed 0): how many of its GELU inputs "
            "onnxruntime's Gelu evaluates more than 1 ULP off, and the largest absolute error "
            "that makes; the outputs' largest absolute error against a float64 forward pass "
            "(exact GELUs), with the native Gelu and with the accurate kernel's graph spliced in "
            "its place (the same onnxruntime GEMMs, one thread); and the predicted classes that "
            "differ between the two.",
            "",
            model_effect(repository, engine),
            "",
        ]
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT).write_text("\n".join(markdown))
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    doc = out / ACCURACY_DOC
    if doc.exists():
        doc.write_text(replace_block(doc.read_text(), QUOTE, render_table(summary)))
    return summary


def _functions(names: str | None) -> tuple[Function, ...]:
    if not names:
        return FUNCTIONS
    wanted = set(names.split(","))
    unknown = wanted - {label(f) for f in FUNCTIONS}
    if unknown:
        known = ", ".join(label(f) for f in FUNCTIONS)
        raise SystemExit(f"unknown functions {sorted(unknown)}; known: {known}")
    return tuple(f for f in FUNCTIONS if label(f) in wanted)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs"), help="the report's directory")
    parser.add_argument("--state", type=Path, default=STATE, help="the checkpoints' directory")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--functions", help="comma-separated labels (gelu, gelu', ...); all")
    parser.add_argument(
        "--kernels",
        default=",".join(DEFAULT_KERNELS),
        help=f"comma-separated, of {ACCURATE}, {NATIVE}, {ACCURATE_ON_ONNXRUNTIME}",
    )
    parser.add_argument(
        "--repository", type=Path, help="measure its models against a float64 forward pass"
    )
    parser.add_argument("--report-only", action="store_true", help="sweep nothing")
    args = parser.parse_args(argv)
    kernel_names = tuple(args.kernels.split(","))
    if not args.report_only:
        run(args.state, _functions(args.functions), kernel_names, range(CHUNKS), args.workers)
    summary = write_report(args.state, args.out, args.repository)
    worst = max(
        (
            k["worst"]
            for f in summary["functions"].values()
            for n, k in f["kernels"].items()
            if n == ACCURATE
        ),
        default=0.0,
    )
    print(f"worst accurate-kernel error: {worst:.3f} ULP; see {args.out / REPORT}")


if __name__ == "__main__":
    main()
