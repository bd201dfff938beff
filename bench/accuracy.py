"""How close the activation endpoint's kernels are to the correctly rounded float32 value.

``make accuracy`` (``python -m bench.accuracy --out docs``) evaluates every function and
derivative on both kernels, in process on the CPU provider, against a 50-digit mpmath
reference, and writes ``docs/accuracy.md`` (the worst error per region, in float32 ULPs) and
``docs/accuracy.png`` (the error along x). torch's float32 functions are measured beside them
when torch is installed. The tests measure the same way, on fewer points, against ``BOUNDS``.

An error in ULPs is |result - exact| / ulp(exact rounded to float32); a correctly rounded
result is within 0.5. Points whose exact value is below float32's normal range (or zero) are
checked separately: their result must be finite and within float32's smallest normal of it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mpmath
import numpy as np

from contract.readme import block, replace_block
from service.activations import ACCURATE, ACTIVATIONS, NATIVE, ActivationEvaluator, kernels

DIGITS = 50  # the reference's precision; the module's constants are made at it too
mpmath.mp.dps = DIGITS
TINY = float(np.finfo(np.float32).tiny)
MAX = float(np.finfo(np.float32).max)
Reference = Callable[[mpmath.mpf], mpmath.mpf]


def _sigmoid(v: mpmath.mpf) -> mpmath.mpf:
    return 1 / (1 + mpmath.exp(-v))


def _sigmoid_form(v: Reference, dv: Reference) -> tuple[Reference, Reference]:
    """x sigmoid(v(x)) and its derivative sigmoid(v) (1 + x v'(x) sigmoid(-v))."""
    return (
        lambda x: x * _sigmoid(v(x)),
        lambda x: _sigmoid(v(x)) * (1 + x * dv(x) * _sigmoid(-v(x))),
    )


_C = mpmath.sqrt(2 / mpmath.pi)
# 0.5 (1 + tanh(u)) = sigmoid(2u): the same function, without 1 + tanh cancelling in mpmath too.
_TANH = _sigmoid_form(
    lambda x: 2 * _C * (x + mpmath.mpf("0.044715") * x**3),
    lambda x: 2 * _C * (1 + 3 * mpmath.mpf("0.044715") * x**2),
)
_K = mpmath.mpf("1.702")
REFERENCES: dict[str, tuple[Reference, Reference]] = {
    "gelu": (lambda x: x * mpmath.ncdf(x), lambda x: mpmath.ncdf(x) + x * mpmath.npdf(x)),
    "gelu_tanh": _TANH,
    "gelu_sigmoid": _sigmoid_form(lambda x: _K * x, lambda x: _K),
    "silu": _sigmoid_form(lambda x: x, lambda x: mpmath.mpf(1)),
    "relu": (lambda x: max(x, 0), lambda x: mpmath.mpf(1 if x > 0 else 0)),
    "elu": (lambda x: x if x > 0 else mpmath.expm1(x), lambda x: 1 if x > 0 else mpmath.exp(x)),
    "phi": (mpmath.ncdf, mpmath.npdf),
}
# f(-inf), f(+inf) and f'(-inf), f'(+inf): the limits, which the kernels must answer at +-inf.
LIMITS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "gelu": ((0.0, np.inf), (0.0, 1.0)),
    "gelu_tanh": ((0.0, np.inf), (0.0, 1.0)),
    "gelu_sigmoid": ((0.0, np.inf), (0.0, 1.0)),
    "silu": ((0.0, np.inf), (0.0, 1.0)),
    "relu": ((0.0, np.inf), (0.0, 1.0)),
    "elu": ((-1.0, np.inf), (0.0, 1.0)),
    "phi": ((0.0, 1.0), (0.0, 0.0)),
}


@dataclass(frozen=True)
class Region:
    name: str
    low: float
    high: float

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n float32 points: uniform inside, log-uniform in |x| for the unbounded tails."""
        if np.isinf(self.low) or np.isinf(self.high):
            edge = self.high if np.isinf(self.low) else self.low
            sign = -1.0 if np.isinf(self.low) else 1.0
            near = rng.uniform(abs(edge), 4 * abs(edge), n // 2)  # where results are normal
            far = np.exp(rng.uniform(np.log(abs(edge)), np.log(MAX), n - n // 2))
            return (sign * np.concatenate([near, far])).astype(np.float32)
        if self.low == -self.high and self.high < 1:  # around zero: every scale down to 1e-30
            magnitude = np.exp(rng.uniform(np.log(1e-30), np.log(self.high), n))
            return (magnitude * rng.choice([-1.0, 1.0], n)).astype(np.float32)
        return rng.uniform(self.low, self.high, n).astype(np.float32)


REGIONS = (
    Region("x < -10", -np.inf, -10.0),
    Region("[-10, -3)", -10.0, -3.0),
    Region("[-3, -0.5)", -3.0, -0.5),
    Region("[-0.5, 0.5]", -0.5, 0.5),
    Region("(0.5, 3]", 0.5, 3.0),
    Region("(3, 10]", 3.0, 10.0),
    Region("x > 10", 10.0, np.inf),
)
# What docs/endpoints.md states and the tests hold the accurate kernel to, in float32 ULPs, in every
# region, for results in float32's normal range.
BOUNDS: dict[tuple[str, bool], float] = {
    (name, derivative): 0.0 if name == "relu" else 1.0
    for name in ACTIVATIONS
    for derivative in (False, True)
}


def exact(name: str, derivative: bool, x: np.ndarray) -> np.ndarray:
    """The ``DIGITS``-digit reference at each float32 point, as float64 (NaN for NaN, limits
    at inf), at that precision whatever another module set mpmath's to (bench.fits sets 40)."""
    function = REFERENCES[name][derivative]
    low, high = LIMITS[name][derivative]
    out = np.empty(x.shape, np.float64)
    with mpmath.workdps(DIGITS):
        for i, value in enumerate(x.astype(np.float64)):
            if np.isnan(value):
                out[i] = np.nan
            elif np.isinf(value):
                out[i] = high if value > 0 else low
            else:
                out[i] = float(function(mpmath.mpf(value)))
    return out


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in ULPs of want rounded to float32; NaN where want is not a normal float32.

    A non-finite or wrong-signed-infinity answer for a finite exact value counts as inf.
    """
    got64 = got.astype(np.float64)
    normal = np.isfinite(want) & (np.abs(want) >= TINY) & (np.abs(want) <= MAX)
    spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        error = np.abs(got64 - want) / spacing
    error[normal & ~np.isfinite(got64)] = np.inf
    return np.where(normal, error, np.nan)


def edge_failures(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> list[str]:
    """Points outside the normal range that are wrong: NaN, the wrong infinity, or off by more
    than float32's smallest normal where the exact value is tiny."""
    failures = []
    for xi, g, w in zip(x, got.astype(np.float64), want, strict=True):
        if np.isnan(w):
            ok = np.isnan(g)
        elif np.isinf(w) or abs(w) > MAX:
            ok = g == (np.inf if w > 0 else -np.inf)
        elif abs(w) < TINY:
            ok = bool(np.isfinite(g)) and abs(g - w) <= TINY
        else:
            continue
        if not ok:
            failures.append(f"x={xi!r}: got {g!r}, want {w!r}")
    return failures


EDGE_POINTS = np.array(
    [np.nan, -np.inf, np.inf, -MAX, MAX, -1e20, 1e20, -0.0, 0.0, -1e-40, 1e-40], np.float32
)


def roots() -> np.ndarray:
    """The float32 points nearest the derivatives' zeros, and 8 either side: where a
    difference of two terms would cancel to nothing."""
    points = []
    for name in ("gelu", "gelu_tanh", "gelu_sigmoid", "silu"):
        root = float(mpmath.findroot(REFERENCES[name][1], -1.0))
        x = np.float32(root)
        for _ in range(8):
            x = np.nextafter(x, np.float32(-np.inf))
        for _ in range(17):
            points.append(x)
            x = np.nextafter(x, np.float32(np.inf))
    return np.array(points, np.float32)


def measure(
    evaluate: Callable[[str, np.ndarray, bool, str], np.ndarray],
    n: int,
    seed: int = 0,
    kernels_to_measure: tuple[str, ...] = (ACCURATE, NATIVE),
) -> dict[tuple[str, bool, str], dict[str, float]]:
    """Worst ULP error per region for every function, derivative and kernel."""
    rng = np.random.default_rng(seed)
    samples = {region.name: region.sample(n, rng) for region in REGIONS}
    samples["[-3, -0.5)"] = np.concatenate([samples["[-3, -0.5)"], roots()])
    table: dict[tuple[str, bool, str], dict[str, float]] = {}
    for name, activation in ACTIVATIONS.items():
        for derivative in (False, True):
            wants = {r: exact(name, derivative, x) for r, x in samples.items()}
            for kernel in kernels(activation, derivative):
                if kernel not in kernels_to_measure:
                    continue
                row = {}
                for region, x in samples.items():
                    error = ulp_error(evaluate(name, x, derivative, kernel), wants[region])
                    # NaN: no result in the region is a normal float32 (relu's left side).
                    row[region] = float(np.nanmax(error)) if (~np.isnan(error)).any() else np.nan
                table[name, derivative, kernel] = row
    return table


def evaluator(compile: bool = True) -> ActivationEvaluator:
    """The service's evaluator on the CPU: the accurate kernel compiled, or (``compile=False``)
    its graphs on onnxruntime, as on other execution providers."""
    import onnxruntime as ort

    from service.onnxrt import SessionFactory

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = SessionFactory(["CPUExecutionProvider"], options, strict=False)
    return ActivationEvaluator(sessions, compile)


# ---- torch, for comparison ---------------------------------------------------------------------


def torch_evaluate(name: str, x: np.ndarray, derivative: bool) -> np.ndarray | None:
    """torch's float32 function (autograd for derivatives), as a user of torch would call it."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    functions = {
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "gelu_sigmoid": lambda t: t * torch.sigmoid(1.702 * t),
        "silu": F.silu,
        "relu": F.relu,
        "elu": F.elu,
        "phi": lambda t: 0.5 * (1 + torch.erf(t / math.sqrt(2))),
    }
    t = torch.from_numpy(np.ascontiguousarray(x, np.float32)).requires_grad_(derivative)
    y = functions[name](t)
    if derivative:
        (y,) = torch.autograd.grad(y.sum(), t)
    return np.asarray(y.detach().numpy(), np.float32)


# ---- the report --------------------------------------------------------------------------------


def _label(name: str, derivative: bool) -> str:
    return f"{name}'" if derivative else name


def _cell(value: float) -> str:
    if np.isnan(value):
        return "n/a"
    if np.isinf(value):
        return "non-finite"
    return f"{value:.1f}" if value < 1e4 else f"{value:.1e}"


def render_table(table: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per ``label`` (function, derivative, kernel), worst ULPs per region."""
    regions = [r.name for r in REGIONS]
    lines = ["| function | kernel | " + " | ".join(regions) + " |"]
    lines.append("|---|---|" + "---|" * len(regions))
    for label, row in table.items():
        function, kernel = label.split(" / ")
        lines.append(
            f"| {function} | {kernel} | " + " | ".join(_cell(row[r]) for r in regions) + " |"
        )
    return "\n".join(lines)


README = Path(__file__).resolve().parent.parent / "docs" / "endpoints.md"  # its table block
ACCURATE_ON_ONNXRUNTIME = f"{ACCURATE} (onnxruntime)"
README_BLOCK = ("<!-- accuracy: generated by make accuracy -->\n", "<!-- /accuracy -->\n")


def readme_block(summary: dict[str, Any]) -> str:
    """The README's table: each function's bound (every region) and the worst measured per
    kernel, from a report's ``accuracy.json``."""
    table: dict[str, dict[str, float]] = summary["table"]

    def worst(label: str) -> str:
        """The worst over every row whose label starts so (the accurate kernel: both ways)."""
        rows = [v for k, v in table.items() if k.startswith(label)]
        if not rows:
            return "n/a"
        values = (x for row in rows for x in row.values() if not np.isnan(x))
        return _cell(max(values, default=np.nan))

    lines = [
        "| function | bound, every region | accurate (measured) | native | torch |",
        "|---|---|---|---|---|",
    ]
    for (name, derivative), bound in BOUNDS.items():
        label = _label(name, derivative)
        lines.append(
            f"| {label} | {'exact' if bound == 0 else f'≤ {bound:g} ULP'} | "
            f"{worst(f'{label} / {ACCURATE}')} | {worst(f'{label} / {NATIVE}')} | "
            f"{worst(f'{label} / torch')} |"
        )
    return README_BLOCK[0] + "\n".join(lines) + "\n" + README_BLOCK[1]


EXHAUSTIVE_REPORT = "accuracy-exhaustive.md"
# The table of ``make accuracy-exhaustive`` (bench/exhaustive.py), quoted in accuracy.md.
EXHAUSTIVE_BLOCK = (
    "<!-- exhaustive: generated by make accuracy-exhaustive -->\n",
    "<!-- /exhaustive -->\n",
)


def exhaustive_quote(out: Path) -> str:
    """The exhaustive report's table from ``out``, to quote (its markers alone if not run)."""
    try:
        return block((out / EXHAUSTIVE_REPORT).read_text(), EXHAUSTIVE_BLOCK)
    except (OSError, ValueError):
        return "".join(EXHAUSTIVE_BLOCK)


def report(out: Path, n: int) -> dict[str, object]:
    """Measure, write ``accuracy.{md,json,png}`` into ``out``, return what was measured."""
    started = time.monotonic()
    engine = evaluator()
    measured = measure(engine.evaluate, n)
    on_onnxruntime = measure(evaluator(compile=False).evaluate, n, kernels_to_measure=(ACCURATE,))

    def torch_kernel(name: str, x: np.ndarray, derivative: bool, kernel: str) -> np.ndarray:
        result = torch_evaluate(name, x, derivative)
        if result is None:
            raise ImportError("torch")
        return result

    rows: dict[str, dict[str, float]] = {}
    for (name, derivative, kernel), row in measured.items():
        rows[f"{_label(name, derivative)} / {kernel}"] = row
    for (name, derivative, _), row in on_onnxruntime.items():
        rows[f"{_label(name, derivative)} / {ACCURATE_ON_ONNXRUNTIME}"] = row
    try:
        for (name, derivative, _), row in measure(
            torch_kernel, n, kernels_to_measure=(ACCURATE,)
        ).items():
            rows[f"{_label(name, derivative)} / torch {__import__('torch').__version__}"] = row
    except ImportError:
        pass
    rows = dict(sorted(rows.items(), key=lambda item: _order(item[0])))
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "points_per_region": n,
        "worst_accurate": max(
            v
            for table in (measured, on_onnxruntime)
            for (_, _, k), row in table.items()
            if k == ACCURATE
            for v in row.values()
            if not np.isnan(v)
        ),
        "table": rows,
    }
    (out / "accuracy.json").write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n")
    _plot(engine, out / "accuracy.png")
    markdown = [
        "# Activation accuracy",
        "",
        "Generated by `make accuracy` (`python -m bench.accuracy --out docs`, "
        f"{time.monotonic() - started:.0f} s). Each cell is the worst error, in float32 ULPs "
        "of the exact value, over "
        f"{n} float32 points per region (log-uniform in |x| out to ±3.4e38 in the unbounded "
        "regions, down to 1e-30 around 0, and the 17 floats nearest each derivative's zero in "
        "[-3, -0.5)), against mpmath at 50 digits. Only points whose exact value is a normal "
        "float32 count; `n/a`: none in the region. `accurate` is the endpoint's default kernel, "
        f"here {engine.accurate}; `{ACCURATE_ON_ONNXRUNTIME}` is the same formulas as float64 "
        "ONNX graphs, as it runs on other execution providers or with "
        "`GELU_COMPILE_ACTIVATIONS=false`; `native` is the ONNX op an exported model runs "
        "(`?kernel=native`); torch's float32 functions (autograd for the derivatives) are "
        "measured the same way for comparison.",
        "",
        render_table(rows),
        "",
        "![error along x](accuracy.png)",
        "",
        "## Every float32 input",
        "",
        "`make accuracy-exhaustive` runs all 2^32 float32 bit patterns through every function "
        "and derivative, against a reference correctly rounded at each; its report, with where "
        f"the errors are and the special values, is [{EXHAUSTIVE_REPORT}]({EXHAUSTIVE_REPORT}). "
        "Its table:",
        "",
        exhaustive_quote(out),
    ]
    (out / "accuracy.md").write_text("\n".join(markdown))
    return summary


def _order(label: str) -> tuple[int, bool, int]:
    function, kernel = label.split(" / ")
    name = function.rstrip("'")
    ranks = {ACCURATE: 0, ACCURATE_ON_ONNXRUNTIME: 1, NATIVE: 2}
    rank = ranks.get(kernel, len(ranks))
    return list(ACTIVATIONS).index(name), function.endswith("'"), rank


def _plot(engine: ActivationEvaluator, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.linspace(-20, 20, 8001, dtype=np.float32)
    fig, axes = plt.subplots(len(ACTIVATIONS), 2, figsize=(11, 2.3 * len(ACTIVATIONS)), sharex=True)
    for i, (name, activation) in enumerate(ACTIVATIONS.items()):
        for j, derivative in enumerate((False, True)):
            ax = axes[i, j]
            want = exact(name, derivative, x)
            curves = {
                k: engine.evaluate(name, x, derivative, k) for k in kernels(activation, derivative)
            }
            from_torch = torch_evaluate(name, x, derivative)
            if from_torch is not None:
                curves["torch"] = from_torch
            for label, got in curves.items():
                error = np.clip(
                    np.nan_to_num(ulp_error(got, want), nan=np.nan, posinf=1e9), 0.01, 1e9
                )
                colour = {ACCURATE: "tab:blue", NATIVE: "tab:orange"}.get(label, "tab:green")
                ax.semilogy(x, error, label=label, linewidth=0.7, color=colour)
            ax.axhline(BOUNDS[name, derivative], color="black", linewidth=0.5, linestyle=":")
            ax.set_title(_label(name, derivative), fontsize=9)
            ax.set_ylim(0.01, 1e9)
            if j == 0:
                ax.set_ylabel("ULPs")
            ax.legend(fontsize=7, loc="upper right")
    for ax in axes[-1]:
        ax.set_xlabel("x")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs", help="directory for accuracy.{md,json,png}")
    parser.add_argument("--points", type=int, default=2000, help="points per region")
    args = parser.parse_args(argv)
    summary = report(Path(args.out), args.points)
    README.write_text(replace_block(README.read_text(), README_BLOCK, readme_block(summary)))
    worst = summary["worst_accurate"]
    print(f"worst accurate-kernel error: {worst:.2f} ULP; see {args.out}/accuracy.md")


if __name__ == "__main__":
    main()
