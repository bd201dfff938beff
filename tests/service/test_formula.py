"""Formulas written once against ``Formula``: its shorthands are ONNX's ops, and a target
that evaluates the ops (here numpy's, in float64) gets the formula's value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from service.formula import Formula

OPS: dict[str, Callable[..., np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Min": np.minimum,
    "Greater": np.greater,
    "Where": np.where,
}


class Numpy(Formula[Any]):
    """A target that evaluates each op at once, recording the ops it was asked for."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        self.ops.append(op_type)
        return OPS[op_type](*inputs)

    def const(self, value: float) -> Any:
        return np.float64(value)


X = np.array([-2.5, -1.0, 0.0, 0.5, 3.0])


@pytest.mark.parametrize(
    ("shorthand", "op", "expected"),
    [
        (lambda g, x: g.add(x, g.const(1.5)), "Add", X + 1.5),
        (lambda g, x: g.sub(g.const(1.5), x), "Sub", 1.5 - X),
        (lambda g, x: g.mul(x, x), "Mul", X * X),
        (lambda g, x: g.div(x, g.const(4.0)), "Div", X / 4.0),
        (lambda g, x: g.scale(x, 3.0), "Mul", X * 3.0),
        (lambda g, x: g.shift(x, -0.5), "Add", X - 0.5),
        (lambda g, x: g.clamp_above(x, 0.25), "Min", np.minimum(X, 0.25)),
    ],
    ids=["add", "sub", "mul", "div", "scale", "shift", "clamp_above"],
)
def test_each_shorthand_is_one_onnx_op(shorthand: Any, op: str, expected: np.ndarray) -> None:
    target = Numpy()
    np.testing.assert_array_equal(shorthand(target, X), expected)
    assert target.ops == [op]


def test_step_is_one_where_x_is_positive_and_zero_elsewhere_nan_included() -> None:
    target = Numpy()
    x = np.array([-1.0, -0.0, 0.0, 1e-300, 2.0, np.nan])
    np.testing.assert_array_equal(target.step(x), [0, 0, 0, 1, 1, 0])
    assert target.ops == ["Greater", "Where"]


def test_a_polynomial_is_horners_scheme_in_ascending_powers() -> None:
    target = Numpy()
    got = target.polynomial(X, (1.0, -2.0, 0.5, 4.0))
    np.testing.assert_allclose(got, 1.0 - 2.0 * X + 0.5 * X**2 + 4.0 * X**3, rtol=1e-15)
    assert target.ops == ["Mul", "Add"] * 3  # one multiply and one add per degree


def test_a_rational_is_one_polynomial_over_another() -> None:
    target = Numpy()
    got = target.rational(X, (1.0, 2.0), (3.0, 0.0, 1.0))
    np.testing.assert_allclose(got, (1.0 + 2.0 * X) / (3.0 + X**2), rtol=1e-15)
    assert target.ops[-1] == "Div"


def test_the_interface_alone_builds_nothing() -> None:
    interface: Formula[Any] = Formula()
    with pytest.raises(NotImplementedError):
        interface.op("Add", 1.0, 2.0)
    with pytest.raises(NotImplementedError):
        interface.const(1.0)
