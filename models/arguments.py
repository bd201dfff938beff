"""The ``train`` subcommand's options, kept free of torch so that ``--help`` is instant and a
mistaken option is refused at once, before torch is imported; the option types ``paper`` shares."""

from __future__ import annotations

import argparse
from pathlib import Path

from contract.names import ACTIVATIONS, ARCHITECTURES

DEFAULT_HIDDEN = {"mlp": (128,) * 8, "autoencoder": (128, 64, 16), "cnn": (16, 32)}


def positive_int(text: str) -> int:
    """An option's whole number of at least 1 (epochs, seeds, batch sizes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def activation_list(text: str) -> tuple[str, ...]:
    """Comma-separated activation names, each one the contract knows."""
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in chosen:
        if name not in ACTIVATIONS:
            raise argparse.ArgumentTypeError(
                f"unknown activation {name!r}; choose one of: {', '.join(ACTIVATIONS)}"
            )
    if not chosen:
        raise argparse.ArgumentTypeError("name at least one activation")
    return chosen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``train`` subcommand's options."""
    parser.add_argument(
        "--arch", default="mlp", choices=ARCHITECTURES, help="the network (default: %(default)s)"
    )
    parser.add_argument(
        "--activation",
        default="gelu",
        choices=ACTIVATIONS,
        help="the hidden layers' activation (default: %(default)s)",
    )
    parser.add_argument(
        "--hidden",
        default=None,
        help="comma-separated layer sizes (mlp: units per hidden layer, default 8 x 128 as in "
        "the paper; autoencoder: encoder sizes, default 128,64,16; cnn: channels, default 16,32)",
    )
    parser.add_argument(
        "--dataset", default="digits", help="digits (bundled), fashion-mnist or mnist"
    )
    parser.add_argument("--data-dir", default=None, help="directory of IDX files (mnist-like)")
    parser.add_argument(
        "--epochs", type=positive_int, default=40, help="training epochs (default: 40)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="minibatch size (default: 32)"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument(
        "--label-smoothing", type=float, default=0.1, help="classifier label smoothing (0.1)"
    )
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout after activations")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (default 0: one thread unless a training step's work, "
        "parameters x batch size, is large enough for more to pay off)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 epochs on 400 samples: a smoke run for tests"
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress output (default: a bar on a terminal, else one line per epoch)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint file to write (.pt)")
