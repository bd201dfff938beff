"""Activation functions, selectable by name for every architecture.

GELU(x) = x * Phi(x), with Phi the standard normal CDF (Hendrycks & Gimpel, 2016). The two
approximations from the paper, SiLU, ReLU and ELU are here so that the paper's comparisons run
on the same network. ``StochasticGELU`` is the paper's stochastic regulariser: in training it
multiplies x by m ~ Bernoulli(Phi(x)); in eval it returns the expectation x * Phi(x), which is
exactly GELU and exports as the native ONNX ``Gelu`` op.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from contract import names

_SIGMOID_GELU_SCALE = 1.702


class SigmoidGELU(nn.Module):
    """x * sigmoid(1.702 x): the paper's cheaper GELU approximation (exports as Sigmoid and Mul)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(_SIGMOID_GELU_SCALE * x)


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Phi(x), the standard normal CDF, computed with erf."""
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class StochasticGELU(nn.Module):
    """The stochastic regulariser whose expectation is GELU.

    Training: x * m with m ~ Bernoulli(Phi(x)). Eval: E[x * m] = x * Phi(x) = GELU(x).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            mask = torch.bernoulli(normal_cdf(x))
            return x * mask
        return nn.functional.gelu(x)


# Every activation that becomes an ONNX ``Gelu`` node when exported in eval mode.
GELU_MODULES: tuple[type[nn.Module], ...] = (nn.GELU, StochasticGELU)

_FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "gelu": lambda: nn.GELU(approximate="none"),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu_sigmoid": SigmoidGELU,
    "gelu_stochastic": StochasticGELU,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "elu": nn.ELU,
}
# Keyed and ordered by the repository contract's list, the one source of the names.
ACTIVATIONS = {name: _FACTORIES[name] for name in names.ACTIVATIONS}


class UnknownActivationError(ValueError):
    """Raised for an activation name that is not in ``ACTIVATIONS``."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown activation {name!r}; choose one of: {', '.join(sorted(ACTIVATIONS))}"
        )


def make_activation(name: str) -> nn.Module:
    """Return a fresh activation module for ``name``."""
    try:
        factory = ACTIVATIONS[name]
    except KeyError:
        raise UnknownActivationError(name) from None
    return factory()


def count_gelu_layers(model: nn.Module) -> int:
    """How many layers of ``model`` export to a native ONNX ``Gelu`` node."""
    return sum(isinstance(m, GELU_MODULES) for m in model.modules())
