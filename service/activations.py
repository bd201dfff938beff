"""Activation functions and their derivatives, evaluated elementwise.

Two kernels, both built at start-up:

- ``accurate`` (the default): every function and derivative within a few float32 ULPs of the
  correctly rounded value over the whole float32 line, with the right limits at +-inf. It
  computes in float64 with formulas that never subtract nearly equal numbers: Phi's left tail
  as phi(a) M(a) with M the Mills ratio (a rational fit, ``bench/fits.py``), sigmoids as
  exp(-|v|) / (1 + exp(-|v|)), GELU's derivative through its root, and ELU through
  expm1 = 2 tanh(x/2) / (1 - tanh(x/2)); then it rounds once, to float32. The formulas are
  written once (``service.formula``) and run compiled for the CPU (``service.compiled``) or, on
  other execution providers, as ONNX graphs on onnxruntime.
- ``native``: exactly the ops an exported model runs (``Gelu``, ``Sigmoid`` and ``Mul``,
  ``Relu``, ``Elu``), in float32, for the functions a model can contain, on the models'
  execution providers.

Input and output: float32 of any shape.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, Generic

import anyio
import anyio.to_thread
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from contract.names import EVALUATED_ACTIVATIONS
from service.compiled import CompiledKernels, unavailable
from service.errors import BadInputError, NotFoundError, NotReadyError, PayloadTooLargeError
from service.formula import Builder, Formula, V
from service.onnxrt import SessionFactory
from service.runtime import largest_within, median_us

logger = logging.getLogger("gelu_serve")

OPSET = 20
IR_VERSION = 10  # onnx's default IR is newer than onnxruntime 1.31 accepts
INPUT, OUTPUT = "x", "y"
ACCURATE, NATIVE = "accurate", "native"
CPU_PROVIDER = "CPUExecutionProvider"
KERNELS = (ACCURATE, NATIVE)
# Elements per onnxruntime call for the accurate graphs: their float64 intermediates then stay
# in cache (docs/performance.md, "The batcher's constants, and other measured choices").
CHUNK = 1 << 18

INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
SIGMOID_GELU_SCALE = 1.702
# Beyond these magnitudes every result is its limit in float32 (the Gaussian terms underflow,
# the sigmoid terms saturate); clamping there keeps inf * 0 out of the formulas.
GAUSSIAN_CLAMP = 40.0
SIGMOID_CLAMP = 1000.0

# From ``python -m bench.fits`` (mpmath): P/Q rational fits on [0, 14], relative error 9.2e-9
# (Mills ratio) and 4.7e-9 (root quotient); tests/service/test_activations.py re-derives them.
GELU_ROOT = 0.7517915246935645
MILLS_P = (
    1.253314148789514,
    1.1030755334811064,
    0.4627557056056879,
    0.10306412420628194,
    0.010510922844989223,
)
MILLS_Q = (
    1.0,
    1.6780120775082141,
    1.208079412676948,
    0.47312279518096195,
    0.1030702963900458,
    0.010510808028888041,
)
ROOT_QUOTIENT_P = (
    1.6671032995404949,
    1.8374625483013973,
    0.8992644927490822,
    0.22107234348242755,
    0.023268299968499884,
)
ROOT_QUOTIENT_Q = (
    1.0,
    1.3678016266698951,
    0.7560330365070532,
    0.20360041712154187,
    0.023267443248943254,
    1.522921411201139e-08,
)


class _GraphBuilder(Formula[str]):
    """Appends ONNX nodes; values are the names of the nodes' outputs.

    Constants take the builder's element type: float64 for the accurate kernel, float32 for
    the native one and the formulas exact in float32.
    """

    def __init__(self, elem_type: int) -> None:
        self.elem_type = elem_type
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: dict[float, str] = {}

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = f"v{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value: float) -> str:
        if value not in self._constants:
            name = f"c{len(self.initializers)}"
            self.initializers.append(helper.make_tensor(name, self.elem_type, [], [value]))
            self._constants[value] = name
        return self._constants[value]

    def model(self, result: str) -> onnx.ModelProto:
        """float32 in and out; an inner float64 graph is cast at both ends."""
        if self.elem_type != TensorProto.FLOAT:
            result = self.op("Cast", result, to=TensorProto.FLOAT)
        self.nodes.append(helper.make_node("Identity", [result], [OUTPUT]))
        tensor = helper.make_tensor_value_info
        graph = helper.make_graph(
            self.nodes,
            "activation",
            [tensor(INPUT, TensorProto.FLOAT, None)],
            [tensor(OUTPUT, TensorProto.FLOAT, None)],
            self.initializers,
        )
        # Any rank: the value infos carry no shape, which onnx.checker refuses for graph inputs
        # but the ONNX spec and onnxruntime accept; onnxruntime validates the graph on load.
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
        )


# ---- the accurate kernel: x is float64 (the graphs cast to it; compiled code loads it so) -------


class _Gaussian(Generic[V]):
    """The pieces shared by Phi, GELU and their derivatives, for a = min(|x|, 40)."""

    def __init__(self, g: Formula[V], x: V) -> None:
        self.a = g.clamp_above(g.op("Abs", x), GAUSSIAN_CLAMP)
        self.pdf = g.scale(g.exp(g.scale(g.mul(self.a, self.a), -0.5)), INV_SQRT_2PI)

    def tail(self, g: Formula[V]) -> V:
        """Phi(-a) = phi(a) M(a): the left tail, relative-accurate however small."""
        return g.mul(self.pdf, g.rational(self.a, MILLS_P, MILLS_Q))


def _phi(g: Formula[V], x: V) -> V:
    """Phi(x) = Phi(-a) for x <= 0, 1 - Phi(-a) for x > 0: H + (1 - 2H) Phi(-a)."""
    n, step = _Gaussian(g, x), g.step(x)
    sign = g.shift(g.scale(step, -2.0), 1.0)
    return g.add(step, g.mul(sign, n.tail(g)))


def _pdf(g: Formula[V], x: V) -> V:
    return _Gaussian(g, x).pdf


def _gelu(g: Formula[V], x: V) -> V:
    """x Phi(x) = relu(x) - a Phi(-a): for x > 0, x (1 - Phi(-x)); for x <= 0, x Phi(x)."""
    n = _Gaussian(g, x)
    return g.sub(g.op("Relu", x), g.mul(n.a, n.tail(g)))


def _gelu_derivative(g: Formula[V], x: V) -> V:
    """Phi(x) + x phi(x) = H + sign(x) phi(a) (a - M(a)), with a - M(a) = (a - a0) R(a)."""
    n, step = _Gaussian(g, x), g.step(x)
    sign = g.shift(g.scale(step, 2.0), -1.0)
    through_root = g.mul(
        g.shift(n.a, -GELU_ROOT), g.rational(n.a, ROOT_QUOTIENT_P, ROOT_QUOTIENT_Q)
    )
    return g.add(step, g.mul(sign, g.mul(n.pdf, through_root)))


@dataclass(frozen=True)
class _SigmoidForm:
    """f(x) = x sigmoid(v(x)) for an odd v with v(x) > 0 for x > 0.

    ``v(|x|)`` and ``w(|x|)``, where f'(x) = sigmoid(v) (1 + w sigmoid(-v)) and w = x v'(x)
    is even in sign with x (so w(-|x|) = -w(|x|)).
    """

    v: Builder
    w: Builder

    def _magnitude(self, g: Formula[V], x: V) -> tuple[V, V]:
        """|x| (clamped where the sigmoid has saturated) and e = exp(-|v(x)|)."""
        ax = g.clamp_above(g.op("Abs", x), SIGMOID_CLAMP)
        return ax, g.exp(g.op("Neg", self.v(g, ax)))

    def forward(self, g: Formula[V], x: V) -> V:
        """relu(x) - |x| e / (1 + e), e = exp(-|v|): no cancellation on either side."""
        ax, e = self._magnitude(g, x)
        return g.sub(g.op("Relu", x), g.div(g.mul(ax, e), g.shift(e, 1.0)))

    def derivative(self, g: Formula[V], x: V) -> V:
        """N / (1 + e)^2: N = 1 + e + w e for x > 0, e (1 + e - |w|) for x <= 0.

        The second is where the derivative crosses zero; float64 carries it through.
        """
        ax, e = self._magnitude(g, x)
        w = self.w(g, ax)
        one_plus_e = g.shift(e, 1.0)
        right = g.add(one_plus_e, g.mul(w, e))
        left = g.mul(e, g.sub(one_plus_e, w))
        h = g.step(x)
        blended = g.add(g.mul(h, right), g.mul(g.sub(g.const(1.0), h), left))
        return g.div(blended, g.mul(one_plus_e, one_plus_e))


def _scaled(k: float) -> _SigmoidForm:
    """x sigmoid(k x): v = k x, w = k x."""
    return _SigmoidForm(lambda g, a: g.scale(a, k), lambda g, a: g.scale(a, k))


def _odd_cubic(k1: float, k3: float) -> Builder:
    """a (k1 + k3 a^2), for a >= 0."""
    return lambda g, a: g.mul(a, g.shift(g.scale(g.mul(a, a), k3), k1))


# 0.5 (1 + tanh(u)) = sigmoid(2u): v = 2u = 2 sqrt(2/pi) (a + 0.044715 a^3), and
# w = a v'(a) = 2 sqrt(2/pi) (a + 3 * 0.044715 a^3).
_TANH_K = 2 * SQRT_2_OVER_PI
_TANH = _SigmoidForm(
    _odd_cubic(_TANH_K, _TANH_K * TANH_CUBIC), _odd_cubic(_TANH_K, 3 * _TANH_K * TANH_CUBIC)
)
_SILU = _scaled(1.0)
_SIGMOID_GELU = _scaled(SIGMOID_GELU_SCALE)


def _elu(g: Formula[V], x: V) -> V:
    """relu(x) + expm1(min(x, 0)), expm1(z) = 2t / (1 - t), t = tanh(z / 2)."""
    t = g.op("Tanh", g.scale(g.clamp_above(x, 0.0), 0.5))
    return g.add(g.op("Relu", x), g.div(g.scale(t, 2.0), g.sub(g.const(1.0), t)))


def _elu_derivative(g: Formula[V], x: V) -> V:
    """exp(min(x, 0)): 1 for x > 0."""
    return g.exp(g.clamp_above(x, 0.0))


def _relu_derivative(g: Formula[V], x: V) -> V:
    """1 for x > 0, 0 for x <= 0, NaN for NaN: by comparisons, whose NaN rules IEEE fixes
    (sign(relu(x)) gave 0 for NaN on CUDA, whose Sign compares)."""
    return g.op("Where", g.op("IsNaN", x), x, g.step(x))


# ---- the native kernel: x is float32, the ops an exported model runs ---------------------------


def _native_sigmoid_form(k: float) -> Builder:
    return lambda g, x: g.mul(x, g.op("Sigmoid", g.scale(x, k) if k != 1.0 else x))


@dataclass(frozen=True)
class Activation:
    """One activation: formulas shown to clients and the graphs that evaluate it."""

    name: str
    formula: str
    derivative_formula: str
    forward: Builder
    derivative: Builder
    native: Builder | None  # the forward pass as exported models run it, if a model can


_DEFINED: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation(
            "gelu",
            "x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))",
            "Phi(x) + x * phi(x)",
            _gelu,
            _gelu_derivative,
            lambda g, x: g.op("Gelu", x, approximate="none"),
        ),
        Activation(
            "gelu_tanh",
            "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
            "0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 0.134145 x^2), t = tanh(...)",
            _TANH.forward,
            _TANH.derivative,
            lambda g, x: g.op("Gelu", x, approximate="tanh"),
        ),
        Activation(
            "gelu_sigmoid",
            "x * sigmoid(1.702 x)",
            "s + 1.702 x s (1 - s), s = sigmoid(1.702 x)",
            _SIGMOID_GELU.forward,
            _SIGMOID_GELU.derivative,
            _native_sigmoid_form(SIGMOID_GELU_SCALE),
        ),
        Activation(
            "silu",
            "x * sigmoid(x)",
            "s + x s (1 - s), s = sigmoid(x)",
            _SILU.forward,
            _SILU.derivative,
            _native_sigmoid_form(1.0),
        ),
        Activation(
            "relu",
            "max(x, 0)",
            "1 if x > 0 else 0",
            lambda g, x: g.op("Relu", x),
            _relu_derivative,
            lambda g, x: g.op("Relu", x),
        ),
        Activation(
            "elu",
            "x if x > 0 else exp(x) - 1",
            "1 if x > 0 else exp(x)",
            _elu,
            _elu_derivative,
            lambda g, x: g.op("Elu", x, alpha=1.0),
        ),
        Activation(
            "phi",
            "Phi(x) = 0.5 (1 + erf(x / sqrt(2))), the standard normal CDF",
            "phi(x) = exp(-x^2 / 2) / sqrt(2 pi)",
            _phi,
            _pdf,
            None,
        ),
    )
}
# Keyed and ordered by the repository contract's list, the one source of the names.
ACTIVATIONS = {name: _DEFINED[name] for name in EVALUATED_ACTIVATIONS}
# Formulas as accurate in float32 as in float64 (relu is exact; ELU's derivative is one Exp of
# an exact argument), built without the float64 casts.
# Only selections and comparisons: exact in float32 on every provider. (elu' was here, as
# float32 Exp: 0.866 ULP at worst on the CPU but 1.82 on CUDA, docs/measurements/gpu-2026-11-28.md.)
EXACT_IN_FLOAT32 = {("relu", False), ("relu", True)}


def kernels(activation: Activation, derivative: bool) -> tuple[str, ...]:
    """The kernels that can evaluate ``activation`` (or its derivative)."""
    return (ACCURATE, NATIVE) if activation.native and not derivative else (ACCURATE,)


def _builder(activation: Activation, derivative: bool) -> Builder:
    return activation.derivative if derivative else activation.forward


# (name, derivative, kernel) of every function the endpoint evaluates.
FUNCTIONS = tuple(
    (name, derivative, kernel)
    for name, activation in ACTIVATIONS.items()
    for derivative in (False, True)
    for kernel in kernels(activation, derivative)
)


@cache
def compiled_kernels() -> CompiledKernels:
    """Every function's and derivative's accurate kernel, compiled for this CPU once per
    process (a quarter of a second of LLVM here): every evaluator a process builds shares the
    machine code, which depends on nothing but the formulas above and the CPU. Raises what LLVM
    raises."""
    return CompiledKernels(
        {
            (name, derivative): _builder(ACTIVATIONS[name], derivative)
            for name, derivative, kernel in FUNCTIONS
            if kernel == ACCURATE
        }
    )


def build_graph(
    activation: Activation, derivative: bool, kernel: str = ACCURATE
) -> onnx.ModelProto:
    """The ONNX model that evaluates ``activation`` (or its derivative) elementwise."""
    if kernel == NATIVE:
        if activation.native is None or derivative:
            raise ValueError(
                f"no native kernel for {activation.name}{' derivative' if derivative else ''}"
            )
        g = _GraphBuilder(TensorProto.FLOAT)
        return g.model(activation.native(g, INPUT))
    builder = _builder(activation, derivative)
    if (activation.name, derivative) in EXACT_IN_FLOAT32:
        g = _GraphBuilder(TensorProto.FLOAT)
        return g.model(builder(g, INPUT))
    g = _GraphBuilder(TensorProto.DOUBLE)
    return g.model(builder(g, g.op("Cast", INPUT, to=TensorProto.DOUBLE)))


def why_not_compiled(compile: bool, providers: list[str]) -> str | None:
    """Why the accurate kernel runs as graphs on onnxruntime, given the providers the native
    kernel's sessions use; None: it runs compiled. On a GPU the graphs run where the models
    do; a GPU provider that fell back to the CPU leaves the CPU alone, and the kernel compiled."""
    if not compile:
        return "GELU_COMPILE_ACTIVATIONS=false"
    if providers != [CPU_PROVIDER]:
        return f"providers {', '.join(providers)}"
    return unavailable()


class ActivationEvaluator:
    """Every activation, derivative and kernel, built at start-up.

    The native kernel is onnxruntime's ops, on the configured providers. The accurate kernel is
    compiled for this CPU (``service.compiled``) when those providers are the CPU's alone and
    ``compile`` allows; otherwise its float64 graphs run on onnxruntime beside the native ones.
    """

    def __init__(self, sessions: SessionFactory, compile: bool = True) -> None:
        self.sessions: dict[tuple[str, bool, str], ort.InferenceSession] = {}
        self.providers: list[str] = []
        for name, derivative, kernel in FUNCTIONS:
            if kernel == NATIVE:
                self._session(sessions, name, derivative, kernel)
        self.compiled: CompiledKernels | None = None
        why_not = why_not_compiled(compile, self.providers)
        if why_not is None:
            try:
                self.compiled = compiled_kernels()
                self.accurate = self.compiled.description
            except Exception as exc:  # LLVM's own errors: serve, on the graphs, and say why
                why_not = f"compiling failed: {exc}"
                logger.warning("activations: %s; the accurate kernel runs as graphs", why_not)
        if why_not is not None:
            for name, derivative, kernel in FUNCTIONS:
                if kernel == ACCURATE:
                    self._session(sessions, name, derivative, kernel)
            self.accurate = f"onnxruntime float64 graphs ({why_not})"
        self.evaluate("gelu", np.zeros(8, np.float32))  # warm-up

    def _session(self, sessions: SessionFactory, name: str, derivative: bool, kernel: str) -> None:
        graph = build_graph(ACTIVATIONS[name], derivative, kernel).SerializeToString()
        label = f"activation {name}{' derivative' if derivative else ''} ({kernel})"
        self.sessions[name, derivative, kernel], self.providers = sessions.create(graph, label)

    def evaluate(
        self, name: str, x: np.ndarray, derivative: bool = False, kernel: str = ACCURATE
    ) -> np.ndarray:
        """f(x) or f'(x) elementwise, float32; blocks, so call it off the event loop."""
        # Elementwise: run on a flat view, which also covers 0-d arrays onnxruntime refuses.
        flat = np.ascontiguousarray(x, np.float32).reshape(-1)
        if kernel == ACCURATE and self.compiled is not None:
            return self.compiled.evaluate((name, derivative), flat).reshape(x.shape)
        session = self.sessions[name, derivative, kernel]
        if kernel == NATIVE or flat.size <= CHUNK:
            result: np.ndarray = session.run([OUTPUT], {INPUT: flat})[0]
            return result.reshape(x.shape)
        out = np.empty_like(flat)
        for start in range(0, flat.size, CHUNK):
            part = flat[start : start + CHUNK]
            out[start : start + CHUNK] = session.run([OUTPUT], {INPUT: part})[0]
        return out.reshape(x.shape)

    def largest_within(self, budget_us: float) -> tuple[int, float]:
        """The largest array, a power of two from 256 to ``CHUNK`` values, that every function,
        derivative and kernel evaluates within ``budget_us``, timed here (the median of 5 runs
        of the dearest), with that time; (0, the time of 256) if none."""
        return largest_within(self._time_dearest, budget_us, 256, CHUNK)

    def _time_dearest(self, size: int) -> float:
        x = np.linspace(-8.0, 8.0, size, dtype=np.float32)
        return max(
            median_us(partial(self.evaluate, name, x, derivative, kernel))
            for name, derivative, kernel in FUNCTIONS
        )


class Activations:
    """The core's activation service: the evaluator built at start-up, the names and kernels
    it answers for, and where each evaluation runs (on the event loop when small, else on a
    worker thread, as many at once as the cores hold)."""

    def __init__(
        self, max_elements: int, inline_max_us: int, warmup_runs: int, intra_op_threads: int
    ) -> None:
        self.max_elements = max_elements
        self.inline_max_us = inline_max_us if warmup_runs else 0
        self._evaluator: ActivationEvaluator | None = None
        self._inline = 0  # arrays up to this many values evaluate on the event loop
        # As many evaluations at once as the cores this process may use hold their threads
        # (GELU_INTRA_OP_THREADS each): more would only share cores, and hold more inputs,
        # outputs and intermediates in memory.
        cores = len(os.sched_getaffinity(0))
        self._threads = anyio.CapacityLimiter(max(1, cores // (intra_op_threads or cores)))

    async def start(self, sessions: SessionFactory, compile: bool) -> None:
        """Build the graphs (or compile the accurate kernel) off the event loop, then time how
        large an array the loop may evaluate itself; ``ModelLoadError`` if they cannot be
        built."""
        evaluator = await anyio.to_thread.run_sync(ActivationEvaluator, sessions, compile)
        logger.info("activations: the accurate kernel runs %s", evaluator.accurate)
        self._inline = await self._inline_limit(evaluator)
        self._evaluator = evaluator

    def stop(self) -> None:
        self._evaluator = None

    @property
    def started(self) -> bool:
        return self._evaluator is not None

    def formulas(self) -> list[tuple[str, str, str, list[str]]]:
        """(name, formula, derivative's formula, the function's kernels) of every activation."""
        return [
            (a.name, a.formula, a.derivative_formula, list(kernels(a, derivative=False)))
            for a in ACTIVATIONS.values()
        ]

    @property
    def providers(self) -> list[str]:
        """The execution providers the activation graphs run on."""
        return self._started().providers

    @property
    def accurate(self) -> str:
        """How the accurate kernel runs: compiled for which CPU, or on onnxruntime and why."""
        return self._started().accurate

    def check(self, name: str) -> None:
        """404 for an activation that does not exist."""
        if name not in ACTIVATIONS:
            raise NotFoundError(f"unknown activation {name!r}; available: {', '.join(ACTIVATIONS)}")

    def kernel(self, name: str, derivative: bool, kernel: str | None) -> str:
        """The kernel to use (``accurate`` when none is named); 400 for one that cannot
        evaluate ``name`` (or its derivative)."""
        if kernel is None:
            return ACCURATE
        if kernel not in KERNELS:
            raise BadInputError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        if kernel not in kernels(ACTIVATIONS[name], derivative):
            what = f"{name}'s derivative" if derivative else name
            raise BadInputError(
                f"no {kernel} kernel for {what}: no exported model runs it; use kernel=accurate"
            )
        return kernel

    async def evaluate(
        self, name: str, x: np.ndarray, derivative: bool = False, kernel: str = ACCURATE
    ) -> np.ndarray:
        """Activation ``name`` (or its derivative) elementwise: on the event loop for a small
        array, on a thread otherwise."""
        evaluator = self._started()
        self.check(name)
        if x.size > self.max_elements:
            raise PayloadTooLargeError(
                f"array of {x.size} values is above the maximum of {self.max_elements} "
                "(GELU_MAX_ACTIVATION_ELEMENTS)"
            )
        if x.size <= self._inline:  # bounded: see _inline_limit
            return evaluator.evaluate(name, x, derivative, kernel)
        return await anyio.to_thread.run_sync(
            evaluator.evaluate, name, x, derivative, kernel, limiter=self._threads
        )

    async def _inline_limit(self, evaluator: ActivationEvaluator) -> int:
        """The largest array evaluated on the event loop, as for a model's batches
        (``GELU_INLINE_MAX_US``): handing a few hundred values to a thread and waking the loop
        again costs more than evaluating them; larger arrays go to a thread."""
        if not self.inline_max_us:
            return 0
        bound = self.inline_max_us
        limit, cost = await anyio.to_thread.run_sync(evaluator.largest_within, bound)
        logger.info(
            "activations: arrays up to %d values evaluate on the event loop (%s %.0f µs, "
            "bound %d µs)",
            limit,
            f"{limit} values took" if limit else "256 values took",
            cost,
            bound,
        )
        return limit

    def _started(self) -> ActivationEvaluator:
        if self._evaluator is None:
            raise NotReadyError("the service is not ready: the activation graphs are not built")
        return self._evaluator
