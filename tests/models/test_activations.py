"""Every activation against a float64 reference built on math.erf / math.tanh / math.exp."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from models.activations import (  # noqa: E402
    ACTIVATIONS,
    StochasticGELU,
    UnknownActivationError,
    count_gelu_layers,
    make_activation,
)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _sigmoid(x: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * x))  # overflow-free for large |x|


REFERENCES = {
    "gelu": lambda x: x * _phi(x),
    "gelu_tanh": lambda x: (
        0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "gelu_sigmoid": lambda x: x * _sigmoid(1.702 * x),
    "gelu_stochastic": lambda x: x * _phi(x),  # eval mode: the expectation
    "silu": lambda x: x * _sigmoid(x),
    "relu": lambda x: max(x, 0.0),
    "elu": lambda x: x if x > 0 else math.expm1(x),
}
# float32 evaluation against the float64 reference on the same float32 inputs: the error is a
# few ulps of the result, so the bound is relative with an absolute floor for results near 0.
ABS_TOL = 2e-6
REL_TOL = 2e-6
GRID = np.linspace(-10, 10, 20001, dtype=np.float32)


def test_registry_covers_every_reference() -> None:
    assert set(ACTIVATIONS) == set(REFERENCES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_activation_matches_float64_reference(name: str) -> None:
    module = make_activation(name).eval()
    got = module(torch.from_numpy(GRID)).double().numpy()
    want = np.array([REFERENCES[name](float(x)) for x in GRID])
    err = np.abs(got - want)
    bound = ABS_TOL + REL_TOL * np.abs(want)
    assert np.all(err <= bound), f"{name}: worst error {err.max():.3g} at x={GRID[err.argmax()]}"


def test_approximations_stay_close_to_exact_gelu() -> None:
    x = torch.from_numpy(GRID)
    exact = make_activation("gelu")(x)
    # Documented bounds: tanh form within 4.74e-4 of exact GELU, sigmoid form within 0.021.
    assert (make_activation("gelu_tanh")(x) - exact).abs().max() < 5e-4
    assert (make_activation("gelu_sigmoid")(x) - exact).abs().max() < 0.021


def test_stochastic_gelu_mean_converges_to_gelu() -> None:
    torch.manual_seed(0)
    module = StochasticGELU().train()
    x = torch.linspace(-3, 3, 25)
    n = 200_000
    samples = module(x.repeat(n, 1))
    # Each sample is x or 0: mask values are exactly Bernoulli.
    assert torch.all((samples == 0) | (samples == x))
    mean = samples.mean(dim=0)
    expected = torch.nn.functional.gelu(x)
    phi = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    std_err = x.abs() * torch.sqrt(phi * (1 - phi) / n)
    assert torch.all((mean - expected).abs() <= 5 * std_err + 1e-7)


def test_stochastic_gelu_eval_is_exact_gelu() -> None:
    x = torch.randn(1000)
    assert torch.equal(StochasticGELU().eval()(x), torch.nn.functional.gelu(x))


def test_unknown_activation_names_the_choices() -> None:
    with pytest.raises(UnknownActivationError, match=r"unknown activation 'swish'.*gelu_tanh"):
        make_activation("swish")


def test_count_gelu_layers() -> None:
    net = torch.nn.Sequential(make_activation("gelu"), make_activation("gelu_stochastic"))
    net.append(make_activation("gelu_sigmoid"))
    assert count_gelu_layers(net) == 2


def test_every_contract_activation_is_trainable() -> None:
    from contract.names import ACTIVATIONS as NAMES
    from models.activations import _FACTORIES, ACTIVATIONS

    assert list(ACTIVATIONS) == list(NAMES)
    assert set(_FACTORIES) == set(NAMES)
