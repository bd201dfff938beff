"""The exhaustive sweep (``make accuracy-exhaustive``): its reference is correctly rounded, a
random slice of the float32 line is within 1 ULP on every accurate kernel each time the tests
run, the committed report covers the whole line within 1 ULP, and docs/accuracy.md quotes it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import mpmath
import numpy as np
import pytest

from bench import accuracy, exhaustive
from contract.readme import block

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SLICE = 1 << 20  # inputs of the random slice: a quarter of a chunk, about a second


@pytest.fixture(scope="module")
def engine() -> exhaustive.Kernels:
    return exhaustive.Kernels()


def _points(rng: np.random.Generator) -> np.ndarray:
    """Random bit patterns, random points where the functions bend, the floats nearest the
    derivatives' zeros, and the special values (subnormals among them)."""
    bits = rng.integers(0, 1 << 32, 200, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bend = rng.uniform(-16.0, 16.0, 150).astype(np.float32)
    return np.concatenate([bits, bend, accuracy.roots(), exhaustive.SPECIAL])


def _correctly_rounded(function: exhaustive.Function, x: np.ndarray) -> np.ndarray:
    """mpmath's value at each finite x, rounded to float32 by ``_round_mp``."""
    exact = accuracy.REFERENCES[function[0]][function[1]]
    with mpmath.workdps(accuracy.DIGITS):
        return np.array([exhaustive._round_mp(exact(mpmath.mpf(float(v))))[0] for v in x])


@pytest.mark.parametrize("function", exhaustive.FUNCTIONS, ids=exhaustive.label)
def test_the_reference_is_mpmath_correctly_rounded(function: exhaustive.Function) -> None:
    """The float64 reference, with its mpmath tie-break, gives mpmath's correctly rounded
    float32 at every finite point (mpmath has no -0: zeros compare by value)."""
    x = _points(np.random.default_rng(7))
    x = x[np.isfinite(x)]
    got, _, _ = exhaustive.reference(function, x)
    want = _correctly_rounded(function, x)
    wrong = [(v, g, w) for v, g, w in zip(x, got, want, strict=True) if g != w]
    assert not wrong, wrong[:5]


def test_halfway_subnormals_round_by_the_square_term() -> None:
    """gelu(x) = x/2 + x^2 phi(0) + ...: at the odd subnormals x/2 is halfway between two
    float32s and the x^2 term, always above, decides: up for x > 0, to -0 for x < 0."""
    x = np.array([2.0**-149, -(2.0**-149), 3 * 2.0**-149, -3 * 2.0**-149], np.float32)
    for function in (("gelu", False), ("gelu_tanh", False), ("silu", False)):
        got, _, decided = exhaustive.reference(function, x)
        assert got.tolist() == [2.0**-149, -0.0, 2.0**-148, -(2.0**-149)]
        assert np.signbit(got[1]) and decided == 0


def test_a_wrong_answer_is_tallied_where_it_is() -> None:
    """One result a step off, one far off, a zero of the wrong sign and a NaN's other payload:
    the tally counts each as what it is, and remembers the worst and where."""
    x = np.array([1.0, 2.0, -50.0, np.nan], np.float32)
    rounded, value, _ = exhaustive.reference(("gelu", False), x)
    got = rounded.copy()
    toward_exact = np.float32(np.inf if value[0] > rounded[0] else -np.inf)
    got[0] = np.nextafter(got[0], toward_exact)  # within 1 ULP, not correctly rounded
    got[1] = got[1] * np.float32(1.001)
    got[2] = np.float32(0.0)  # the exact value rounds to -0
    got[3] = np.array(0x7FC00001, np.uint32).view(np.float32)
    tally = exhaustive.Tally()
    tally.add(x, got, rounded, value)
    assert (tally.not_rounded, tally.above_one, tally.zero_sign) == (2, 1, 1)
    assert tally.worst_x == 2.0 and tally.worst > 1000
    assert (tally.above_one_low, tally.above_one_high) == (2.0, 2.0)
    assert 0.5 < exhaustive.ulp_errors(got[:1], rounded[:1], value[:1])[0] < 1.5


def test_a_random_slice_of_the_line_is_within_one_ulp(engine: exhaustive.Kernels) -> None:
    """A slice of ``SLICE`` consecutive bit patterns at a random place on the line (seeded from
    the clock, printed), and the special values, through every accurate kernel: none is more
    than 1 ULP from the correctly rounded value, and every NaN input gives a NaN."""
    seed = time.time_ns()
    print(f"random slice seed: {seed}")
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, (1 << 32) - SLICE))
    x = (np.arange(SLICE, dtype=np.uint32) + np.uint32(start)).view(np.float32)
    x = np.concatenate([x, exhaustive.SPECIAL])
    where = f"bit patterns {start:#010x}+{SLICE} (seed {seed}), x from {x[0]} to {x[SLICE - 1]}"
    for function in exhaustive.FUNCTIONS:
        tallies, _ = exhaustive.sweep(engine, function, x, (accuracy.ACCURATE,))
        tally = tallies[accuracy.ACCURATE]
        assert tally.above_one == 0 and tally.worst <= 1.0, (exhaustive.label(function), where)


@pytest.mark.slow
def test_a_stopped_sweep_resumes_and_the_report_says_what_it_covers(tmp_path: Path) -> None:
    """The checkpoints: a task swept once is not swept again; the report counts what is there
    and writes its table into the accuracy.md beside it."""
    (tmp_path / "accuracy.md").write_text("before\n" + "".join(exhaustive.QUOTE) + "after\n")
    state = tmp_path / "state"
    relu = (("relu", False),)
    exhaustive.run(state, relu, exhaustive.DEFAULT_KERNELS, [3], workers=1)
    path = exhaustive.checkpoint(state, relu[0], 3)
    first = path.stat().st_mtime_ns
    exhaustive.run(state, relu, exhaustive.DEFAULT_KERNELS, [3, 4], workers=1)
    assert path.stat().st_mtime_ns == first  # resumed: only chunk 4 was swept
    assert exhaustive.checkpoint(state, relu[0], 4).exists()
    summary = exhaustive.write_report(state, tmp_path, None)
    assert summary["functions"]["relu"]["kernels"][accuracy.ACCURATE]["chunks"] == 2
    assert summary["functions"]["gelu"]["chunks"] == 0
    table = exhaustive.render_table(summary)
    assert f"| relu | accurate | {2 * exhaustive.CHUNK:,} |" in table
    doc = (tmp_path / "accuracy.md").read_text()
    assert doc == "before\n" + table + "after\n"


def test_docs_accuracy_quotes_the_committed_report() -> None:
    """docs/accuracy.md's table is the report's, and the report's is its summary's."""
    report = (DOCS / exhaustive.REPORT).read_text()
    summary = json.loads((DOCS / exhaustive.SUMMARY).read_text())
    quote = block((DOCS / exhaustive.ACCURACY_DOC).read_text(), exhaustive.QUOTE)
    assert quote == block(report, exhaustive.QUOTE) == exhaustive.render_table(summary)


def test_the_committed_report_proves_the_accurate_kernel() -> None:
    """Every accurate kernel swept on all 2^32 inputs, none more than 1 ULP off anywhere; the
    same for its onnxruntime graphs wherever they were swept."""
    summary = json.loads((DOCS / exhaustive.SUMMARY).read_text())
    for name, entry in summary["functions"].items():
        result = entry["kernels"][accuracy.ACCURATE]
        assert result["chunks"] == exhaustive.CHUNKS, name
        assert result["above_one"] == 0 and result["worst"] <= 1.0, name
        graphs = entry["kernels"].get(exhaustive.ACCURATE_ON_ONNXRUNTIME)
        if graphs is not None:
            assert graphs["above_one"] == 0 and graphs["worst"] <= 1.0, name
