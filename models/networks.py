"""Small, configurable networks after the GELU paper's experiments.

- ``mlp``: a classifier of fully connected layers (the paper's MNIST classifier: 8 x 128).
- ``autoencoder``: an encoder of shrinking layers and its mirror as decoder (the paper's is
  1000-500-250-30), sigmoid output for inputs in [0, 1].
- ``cnn``: a small convolutional classifier.

A network is rebuilt from a ``NetworkConfig`` alone, which the checkpoint stores as a dict.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from contract.names import ARCHITECTURES, CLASSIFICATION, RECONSTRUCTION
from models.activations import make_activation

TASKS = {"mlp": CLASSIFICATION, "cnn": CLASSIFICATION, "autoencoder": RECONSTRUCTION}


class ConfigError(ValueError):
    """A model configuration that cannot be built."""


@dataclass(frozen=True)
class NetworkConfig:
    """Everything needed to rebuild a network, and to describe it to a client."""

    arch: str
    activation: str
    input_shape: tuple[int, ...]
    hidden: tuple[int, ...]
    num_classes: int = 0
    label_names: tuple[str, ...] = ()
    # How a raw sample becomes the model's input: input = raw / divide_by.
    normalisation: dict[str, float] = field(default_factory=lambda: {"divide_by": 1.0})
    dropout: float = 0.0

    @property
    def task(self) -> str:
        return TASKS[self.arch]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkConfig:
        """Rebuild a config from ``to_dict``'s output, refusing unknown or missing keys."""
        try:
            config = cls(
                **{
                    **data,
                    "input_shape": tuple(data["input_shape"]),
                    "hidden": tuple(data["hidden"]),
                    "label_names": tuple(data.get("label_names", ())),
                }
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"invalid model config: {exc}") from None
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ConfigError`` with a clear message when the config cannot be built."""
        if self.arch not in ARCHITECTURES:
            raise ConfigError(
                f"unknown architecture {self.arch!r}; choose one of: {', '.join(ARCHITECTURES)}"
            )
        make_activation(self.activation)  # raises UnknownActivationError
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ConfigError(f"hidden sizes must be positive, got {list(self.hidden)}")
        if self.task == CLASSIFICATION:
            if self.num_classes < 2:
                raise ConfigError("a classifier needs num_classes >= 2")
            if self.label_names and len(self.label_names) != self.num_classes:
                raise ConfigError(
                    f"{len(self.label_names)} label names for {self.num_classes} classes"
                )
        if self.arch == "cnn" and len(self.input_shape) != 3:
            raise ConfigError(f"cnn needs an input shape (C, H, W), got {self.input_shape}")


def _mlp_stack(sizes: list[int], activation: str, dropout: float) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [nn.Linear(n_in, n_out), make_activation(activation)]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return layers


class MLPClassifier(nn.Module):
    """Flatten, hidden layers of Linear + activation, then a Linear to the class logits."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        n_in = math.prod(config.input_shape)
        sizes = [n_in, *config.hidden]
        self.net = nn.Sequential(
            nn.Flatten(),
            *_mlp_stack(sizes, config.activation, config.dropout),
            nn.Linear(sizes[-1], config.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Autoencoder(nn.Module):
    """Encoder input -> hidden[0] -> ... -> hidden[-1], decoder its mirror, sigmoid output."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.input_shape = config.input_shape
        n_in = math.prod(config.input_shape)
        sizes = [n_in, *config.hidden]
        # No activation on the code layer: a linear bottleneck, as in the paper.
        encoder = _mlp_stack(sizes, config.activation, 0.0)[:-1]
        decoder = _mlp_stack(sizes[::-1], config.activation, 0.0)[:-1]
        self.encoder = nn.Sequential(nn.Flatten(), *encoder)
        self.decoder = nn.Sequential(*decoder, nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decoder(self.encoder(x))
        return out.reshape(x.shape)


class CNNClassifier(nn.Module):
    """Conv + activation blocks (channels from ``hidden``), global average pool, Linear."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        channels = [config.input_shape[0], *config.hidden]
        blocks: list[nn.Module] = []
        for c_in, c_out in itertools.pairwise(channels):
            blocks += [nn.Conv2d(c_in, c_out, 3, padding=1), make_activation(config.activation)]
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(channels[-1], config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.features(x).mean(dim=(2, 3))
        out: torch.Tensor = self.head(pooled)
        return out


def build_model(config: NetworkConfig) -> nn.Module:
    """Build the network that ``config`` describes (fresh weights)."""
    config.validate()
    if config.arch == "mlp":
        return MLPClassifier(config)
    if config.arch == "autoencoder":
        return Autoencoder(config)
    return CNNClassifier(config)
