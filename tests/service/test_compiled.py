"""The accurate kernel compiled with LLVM: the same answers as its onnxruntime graphs, op by op
and function by function, and chosen only where it runs on the CPU alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto

from bench import accuracy
from service.activations import (
    ACCURATE,
    ACTIVATIONS,
    CPU_PROVIDER,
    OUTPUT,
    ActivationEvaluator,
    _GraphBuilder,
    why_not_compiled,
)
from service.compiled import AHEAD, BLOCK, CompiledKernels
from service.formula import Builder, Formula
from service.rest.app import create_app

SPECIALS = np.array(
    [np.nan, -np.inf, np.inf, -0.0, 0.0, -1e-40, 1e-40, -1e-30, 1e-30, -3.4e38, 3.4e38], np.float32
)


def _sample(n: int) -> np.ndarray:
    """Every scale of the float32 line, both signs, and the special values."""
    rng = np.random.default_rng(0)
    magnitudes = 10.0 ** rng.uniform(-40, 38.5, n)
    ordinary = rng.normal(0.0, 6.0, n)
    x = np.concatenate([magnitudes * rng.choice([-1.0, 1.0], n), ordinary])
    return np.concatenate([x.astype(np.float32), SPECIALS])


def _on_onnxruntime(formula: Builder, x: np.ndarray) -> np.ndarray:
    g = _GraphBuilder(TensorProto.DOUBLE)
    model = g.model(formula(g, g.op("Cast", "x", to=TensorProto.DOUBLE)))
    session = ort.InferenceSession(model.SerializeToString(), providers=[CPU_PROVIDER])
    result: np.ndarray = session.run([OUTPUT], {"x": x})[0]
    return result


def _ulps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float32 steps; 0 where both are NaN or both zero (of either sign)."""

    def order(v: np.ndarray) -> np.ndarray:
        magnitude = v.view(np.int32) & 0x7FFFFFFF
        return np.where(np.signbit(v), -magnitude, magnitude)

    apart = np.abs(order(a).astype(np.int64) - order(b).astype(np.int64)).astype(float)
    apart[np.isnan(a) & np.isnan(b)] = 0
    apart[np.isnan(a) != np.isnan(b)] = np.inf
    return apart


# Each op the formulas use, alone, with the constants the formulas give it.
OPS: dict[str, Builder] = {
    "Add": lambda g, x: g.add(x, g.const(1.5)),
    "Sub": lambda g, x: g.sub(g.const(1.5), x),
    "Mul": lambda g, x: g.mul(x, x),
    "Div": lambda g, x: g.div(g.const(1.0), x),
    "Min": lambda g, x: g.clamp_above(x, 40.0),
    "Relu": lambda g, x: g.op("Relu", x),
    "IsNaN and Where": lambda g, x: g.op("Where", g.op("IsNaN", x), g.const(1.0), x),
    "Abs": lambda g, x: g.op("Abs", x),
    "Neg": lambda g, x: g.op("Neg", x),
    "Greater and Where": lambda g, x: g.step(x),
    "Exp": lambda g, x: g.op("Exp", g.clamp_above(x, 0.0)),
    "Tanh": lambda g, x: g.op("Tanh", x),
}


@pytest.fixture(scope="module")
def ops() -> CompiledKernels:
    return CompiledKernels(OPS)


@pytest.mark.parametrize("op", list(OPS))
def test_each_op_answers_as_onnxruntime_does(ops: CompiledKernels, op: str) -> None:
    """NaN, infinities, signed zeros and tiny values included; Exp and Tanh (ours, not libm's)
    within one float32 step, the rest exactly."""
    x = _sample(20_000)
    got, want = ops.evaluate(op, x), _on_onnxruntime(OPS[op], x)
    apart = _ulps_apart(got, want)
    assert apart.max() <= (1 if op in ("Exp", "Tanh") else 0), x[np.argmax(apart)]
    if op in ("Relu", "IsNaN and Where", "Neg", "Min"):  # signs of zeros as onnxruntime's
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_exp_and_tanh_round_like_float64s() -> None:
    """Our Exp and Tanh, rounded to float32, are numpy's float64 ones rounded to float32 but at
    a handful of points within 1e-13 of a rounding boundary."""
    x = np.concatenate([np.linspace(-745, 0, 200_001), np.linspace(-1, 1, 200_001)])
    x = x.astype(np.float32)
    kernels = CompiledKernels({"exp": OPS["Exp"], "tanh": OPS["Tanh"]})
    for name, reference in (("exp", np.exp), ("tanh", np.tanh)):
        wide = x.astype(np.float64)
        want = reference(np.minimum(wide, 0) if name == "exp" else wide)
        apart = _ulps_apart(kernels.evaluate(name, x), want.astype(np.float32))
        assert apart.max() <= 1 and (apart > 0).mean() < 1e-4, name


def test_every_function_as_its_onnxruntime_graph() -> None:
    """Compiled or on onnxruntime, the accurate kernel gives the same float32 (at most one step
    apart, where ELU's derivative rounds float32's exp against our float64 one)."""
    compiled, graphs = accuracy.evaluator(compile=True), accuracy.evaluator(compile=False)
    assert compiled.compiled is not None and graphs.compiled is None
    x = _sample(20_000)
    for name in ACTIVATIONS:
        for derivative in (False, True):
            got = compiled.evaluate(name, x, derivative, ACCURATE)
            want = graphs.evaluate(name, x, derivative, ACCURATE)
            assert _ulps_apart(got, want).max() <= 1, (name, derivative)


@pytest.mark.parametrize("n", [1, 15, 63, 64, 65, 200, BLOCK * 3 - 1, AHEAD + 1, AHEAD * 3 + 17])
def test_every_length_is_evaluated_whole_and_nothing_past_it(ops: CompiledKernels, n: int) -> None:
    """The loop runs in blocks that prefetch ahead: an array ending inside a block, on its
    edge or within the prefetch distance is evaluated to its last value, and not one value is
    written past its end."""
    x = np.linspace(-3.0, 3.0, n, dtype=np.float32)
    y = np.full(n + 2 * BLOCK, 7.0, np.float32)
    ops._kernels["Abs"](x.ctypes.data, y.ctypes.data, n)
    np.testing.assert_array_equal(y[:n], np.abs(x))
    assert (y[n:] == 7.0).all()


def test_any_shape_and_the_empty_array() -> None:
    evaluator = accuracy.evaluator()
    x = np.linspace(-4, 4, 24, dtype=np.float32).reshape(2, 3, 4)
    y = evaluator.evaluate("gelu", x)
    assert y.shape == (2, 3, 4) and y.dtype == np.float32
    np.testing.assert_array_equal(y.reshape(-1), evaluator.evaluate("gelu", x.reshape(-1)))
    assert evaluator.evaluate("gelu", x[:, ::2]).shape == (2, 2, 4)  # strided: copied first
    assert evaluator.evaluate("phi", np.zeros(0, np.float32)).shape == (0,)
    assert evaluator.evaluate("phi", np.zeros((), np.float32)) == np.float32(0.5)


@pytest.mark.parametrize(
    ("compile", "providers", "why_not"),
    [
        (True, [CPU_PROVIDER], None),
        (False, [CPU_PROVIDER], "GELU_COMPILE_ACTIVATIONS=false"),
        (True, ["CUDAExecutionProvider", CPU_PROVIDER], "providers CUDAExecutionProvider"),
    ],
)
def test_compiled_only_where_everything_runs_on_the_cpu(
    compile: bool, providers: list[str], why_not: str | None
) -> None:
    """On CUDA the graphs run where the models run; a provider that fell back to the CPU
    leaves the CPU alone in use, and the kernel compiled."""
    reason = why_not_compiled(compile, providers)
    assert reason == why_not if why_not is None else (reason or "").startswith(why_not)


@pytest.mark.parametrize("compile", [True, False])
def test_the_listing_says_how_the_accurate_kernel_runs(settings_factory, compile: bool) -> None:
    with TestClient(create_app(settings_factory(compile_activations=compile))) as client:
        body = client.get("/v1/activations").json()
        answer = client.post("/v1/activations/gelu", json={"data": [-10.0]}).json()
    if compile:
        assert body["accurate_kernel"].startswith("compiled for ")
    else:
        assert body["accurate_kernel"].startswith("onnxruntime float64 graphs")
    assert np.float32(answer["data"][0]) == np.float32(-7.619853024160526066e-23)


def test_a_formula_with_an_op_it_cannot_compile_is_refused() -> None:
    def unknown(g: Formula[Any], x: Any) -> Any:
        return g.op("Erf", x)

    with pytest.raises(ValueError, match="no compiled form of the op Erf"):
        CompiledKernels({"erf": unknown})


def test_a_failed_compile_serves_on_the_graphs(monkeypatch, caplog) -> None:
    """LLVM failing on some CPU costs speed, not availability: the graphs answer, and the
    listing and the log say why."""
    import service.activations

    def failing() -> None:
        raise RuntimeError("LLVM ERROR: no target for this CPU")

    monkeypatch.setattr(service.activations, "compiled_kernels", failing)
    evaluator = accuracy.evaluator()
    assert evaluator.compiled is None
    assert evaluator.accurate == (
        "onnxruntime float64 graphs (compiling failed: LLVM ERROR: no target for this CPU)"
    )
    assert "the accurate kernel runs as graphs" in caplog.text
    assert evaluator.evaluate("gelu", np.array([-10.0], np.float32))[0] == np.float32(
        -7.619853024160526066e-23
    )


def test_the_evaluator_compiles_once_for_every_function() -> None:
    evaluator = accuracy.evaluator()
    assert isinstance(evaluator, ActivationEvaluator) and evaluator.compiled is not None
    assert accuracy.evaluator().compiled is evaluator.compiled  # once per process
    assert evaluator.accurate.startswith(f"compiled for {evaluator.compiled.cpu}")
    assert not any(kernel == ACCURATE for _, _, kernel in evaluator.sessions)
