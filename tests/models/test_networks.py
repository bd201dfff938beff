"""models.networks: every architecture with every activation, the paper's MLP, and the configs
refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from models.networks import NetworkConfig, build_model  # noqa: E402


@pytest.mark.parametrize("arch", ["mlp", "autoencoder", "cnn"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "gelu_sigmoid", "relu"])
def test_every_architecture_takes_every_activation(arch: str, activation: str) -> None:
    config = NetworkConfig(
        arch=arch,
        activation=activation,
        input_shape=(1, 8, 8) if arch == "cnn" else (64,),
        hidden=(8, 4),
        num_classes=0 if arch == "autoencoder" else 10,
    )
    x = torch.rand(3, *config.input_shape)
    out = build_model(config)(x)
    assert out.shape == ((3, 64) if arch == "autoencoder" else (3, 10))


def test_paper_mlp_shape() -> None:
    config = NetworkConfig("mlp", "gelu", (784,), (128,) * 8, 10)
    linears = [m for m in build_model(config).modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 128)] + [(128, 128)] * 7 + [
        (128, 10)
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"arch": "transformer"}, "unknown architecture 'transformer'"),
        ({"activation": "swish"}, "unknown activation 'swish'"),
        ({"hidden": (0,)}, "hidden sizes must be positive"),
        ({"num_classes": 1}, "num_classes >= 2"),
        ({"label_names": ("a",)}, "1 label names for 10 classes"),
        ({"arch": "cnn"}, r"cnn needs an input shape \(C, H, W\)"),
    ],
)
def test_bad_configs_are_refused(changes: dict, message: str) -> None:
    base = {"arch": "mlp", "activation": "gelu", "input_shape": (64,), "hidden": (8,),
            "num_classes": 10}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        NetworkConfig(**{**base, **changes}).validate()
