"""Elementwise formulas written once, built as ONNX graphs or as compiled loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")

# exp's argument is held where 2^k stays a normal double: below, e^a would be an exact 0, and
# a formula that carries a zero's sign through e (x e^-|v| for x < 0) would lose it.
EXP_LOWEST, EXP_HIGHEST = -708.0, 709.0


class Formula(Generic[V]):
    """Writes a formula as elementwise ops; each call returns the value it produced.

    ``service.activations`` writes each activation once against this interface; two targets
    build it: an ONNX graph for onnxruntime (``service.activations._GraphBuilder``) and one
    fused loop compiled with LLVM (``service.compiled``). The ops and their semantics are
    ONNX's.
    """

    def op(self, op_type: str, *inputs: V, **attrs: Any) -> V:
        raise NotImplementedError

    def const(self, value: float) -> V:
        raise NotImplementedError

    # Shorthands, so that a formula written with them reads like the formula.
    def add(self, a: V, b: V) -> V:
        return self.op("Add", a, b)

    def sub(self, a: V, b: V) -> V:
        return self.op("Sub", a, b)

    def mul(self, a: V, b: V) -> V:
        return self.op("Mul", a, b)

    def div(self, a: V, b: V) -> V:
        return self.op("Div", a, b)

    def scale(self, a: V, k: float) -> V:
        return self.mul(a, self.const(k))

    def shift(self, a: V, k: float) -> V:
        return self.add(a, self.const(k))

    def clamp_above(self, a: V, k: float) -> V:
        return self.op("Min", a, self.const(k))

    def exp(self, a: V) -> V:
        """e^a for a held to [EXP_LOWEST, EXP_HIGHEST]: never an exact 0 or inf."""
        held = self.op("Max", self.clamp_above(a, EXP_HIGHEST), self.const(EXP_LOWEST))
        return self.op("Exp", held)

    def step(self, x: V) -> V:
        """1 where x > 0, else 0 (NaN gives 0: every caller carries NaN through another term)."""
        positive = self.op("Greater", x, self.const(0.0))
        return self.op("Where", positive, self.const(1.0), self.const(0.0))

    def polynomial(self, x: V, coefficients: tuple[float, ...]) -> V:
        """Horner's scheme, coefficients in ascending powers."""
        result = self.const(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            result = self.shift(self.mul(result, x), c)
        return result

    def rational(self, x: V, p: tuple[float, ...], q: tuple[float, ...]) -> V:
        return self.div(self.polynomial(x, p), self.polynomial(x, q))


# A formula: builds f(x) from x with a target's ops.
Builder = Callable[[Formula[Any], Any], Any]
