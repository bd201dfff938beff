"""Activation functions and their derivatives as small ONNX graphs run by onnxruntime.

Built at start-up on the same execution providers as the models. GELU is the native ONNX
``Gelu`` op (opset 20, ``approximate="none"`` or ``"tanh"``); the other functions and every
derivative are composed of elementary ONNX ops. Input and output: float32 of any shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from contract.names import EVALUATED_ACTIVATIONS
from service.runtime import SessionFactory

OPSET = 20
IR_VERSION = 10  # onnx's default IR is newer than onnxruntime 1.31 accepts
INPUT, OUTPUT = "x", "y"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class _GraphBuilder:
    """Appends ONNX nodes; each call returns the name of the value it produced."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = f"v{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value: float) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(helper.make_tensor(name, TensorProto.FLOAT, [], [value]))
        return name

    # Shorthands so that the formulas below read like the formulas.
    def add(self, a: str, b: str) -> str:
        return self.op("Add", a, b)

    def mul(self, a: str, b: str) -> str:
        return self.op("Mul", a, b)

    def scale(self, a: str, k: float) -> str:
        return self.mul(a, self.const(k))

    def model(self, result: str) -> onnx.ModelProto:
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


Builder = Callable[[_GraphBuilder, str], str]


def _phi(g: _GraphBuilder, x: str) -> str:
    """Phi(x) = 0.5 (1 + erf(x / sqrt 2))."""
    return g.scale(g.add(g.const(1.0), g.op("Erf", g.scale(x, INV_SQRT_2))), 0.5)


def _pdf(g: _GraphBuilder, x: str) -> str:
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    return g.scale(g.op("Exp", g.scale(g.mul(x, x), -0.5)), INV_SQRT_2PI)


def _sigmoid_scaled(g: _GraphBuilder, x: str, k: float) -> str:
    return g.op("Sigmoid", g.scale(x, k) if k != 1.0 else x)


def _x_sigmoid_derivative(g: _GraphBuilder, x: str, k: float) -> str:
    """d/dx x sigma(kx) = s + k x s (1 - s), s = sigma(kx)."""
    s = _sigmoid_scaled(g, x, k)
    one_minus_s = g.op("Sub", g.const(1.0), s)
    return g.add(s, g.scale(g.mul(g.mul(x, s), one_minus_s), k))


def _gelu_tanh_derivative(g: _GraphBuilder, x: str) -> str:
    """0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u)."""
    x2 = g.mul(x, x)
    u = g.scale(g.mul(x, g.add(g.const(1.0), g.scale(x2, 0.044715))), SQRT_2_OVER_PI)
    t = g.op("Tanh", u)
    left = g.scale(g.add(g.const(1.0), t), 0.5)
    sech2 = g.op("Sub", g.const(1.0), g.mul(t, t))
    du = g.scale(g.add(g.const(1.0), g.scale(x2, 3 * 0.044715)), SQRT_2_OVER_PI)
    return g.add(left, g.scale(g.mul(g.mul(x, sech2), du), 0.5))


def _step(g: _GraphBuilder, x: str) -> str:
    """1 where x > 0, else 0 (float)."""
    return g.op("Cast", g.op("Greater", x, g.const(0.0)), to=TensorProto.FLOAT)


@dataclass(frozen=True)
class Activation:
    """One activation: formulas shown to clients and the graphs that evaluate it."""

    name: str
    formula: str
    derivative_formula: str
    forward: Builder
    derivative: Builder


_DEFINED: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation(
            "gelu",
            "x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))",
            "Phi(x) + x * phi(x)",
            lambda g, x: g.op("Gelu", x, approximate="none"),
            lambda g, x: g.add(_phi(g, x), g.mul(x, _pdf(g, x))),
        ),
        Activation(
            "gelu_tanh",
            "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
            "0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 0.134145 x^2), t = tanh(...)",
            lambda g, x: g.op("Gelu", x, approximate="tanh"),
            _gelu_tanh_derivative,
        ),
        Activation(
            "gelu_sigmoid",
            "x * sigmoid(1.702 x)",
            "s + 1.702 x s (1 - s), s = sigmoid(1.702 x)",
            lambda g, x: g.mul(x, _sigmoid_scaled(g, x, 1.702)),
            lambda g, x: _x_sigmoid_derivative(g, x, 1.702),
        ),
        Activation(
            "silu",
            "x * sigmoid(x)",
            "s + x s (1 - s), s = sigmoid(x)",
            lambda g, x: g.mul(x, _sigmoid_scaled(g, x, 1.0)),
            lambda g, x: _x_sigmoid_derivative(g, x, 1.0),
        ),
        Activation(
            "relu",
            "max(x, 0)",
            "1 if x > 0 else 0",
            lambda g, x: g.op("Relu", x),
            _step,
        ),
        Activation(
            "elu",
            "x if x > 0 else exp(x) - 1",
            "1 if x > 0 else exp(x)",
            lambda g, x: g.op("Elu", x, alpha=1.0),
            lambda g, x: g.op(
                "Where", g.op("Greater", x, g.const(0.0)), g.const(1.0), g.op("Exp", x)
            ),
        ),
        Activation(
            "phi",
            "Phi(x) = 0.5 (1 + erf(x / sqrt(2))), the standard normal CDF",
            "phi(x) = exp(-x^2 / 2) / sqrt(2 pi)",
            _phi,
            _pdf,
        ),
    )
}
# Keyed and ordered by the repository contract's list, the one source of the names.
ACTIVATIONS = {name: _DEFINED[name] for name in EVALUATED_ACTIVATIONS}


def build_graph(activation: Activation, derivative: bool) -> onnx.ModelProto:
    """The ONNX model that evaluates ``activation`` (or its derivative) elementwise."""
    g = _GraphBuilder()
    builder = activation.derivative if derivative else activation.forward
    return g.model(builder(g, INPUT))


class ActivationEvaluator:
    """One onnxruntime session per activation and per derivative, built at start-up."""

    def __init__(self, sessions: SessionFactory) -> None:
        self.sessions: dict[tuple[str, bool], ort.InferenceSession] = {}
        self.providers: list[str] = []
        for name, activation in ACTIVATIONS.items():
            for derivative in (False, True):
                graph = build_graph(activation, derivative).SerializeToString()
                label = f"activation {name}{' derivative' if derivative else ''}"
                session, self.providers = sessions.create(graph, label)
                self.sessions[name, derivative] = session
        self.evaluate("gelu", np.zeros(8, np.float32))  # warm-up

    def evaluate(self, name: str, x: np.ndarray, derivative: bool = False) -> np.ndarray:
        """f(x) or f'(x) elementwise, float32; blocks, so call it off the event loop."""
        # Elementwise: run on a flat view, which also covers 0-d arrays onnxruntime refuses.
        flat = np.ascontiguousarray(x).reshape(-1)
        result: np.ndarray = self.sessions[name, derivative].run([OUTPUT], {INPUT: flat})[0]
        return result.reshape(x.shape)
