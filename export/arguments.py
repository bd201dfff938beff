"""The ``export`` subcommand's options, kept free of torch so that ``--help`` is instant."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_QUEUE_DELAY_US = 0  # Triton's default; under load, batches form while one runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``export`` subcommand's options."""
    parser.add_argument("checkpoint", type=Path, help="checkpoint written by `train`")
    parser.add_argument("--name", required=True, help="model name in the repository")
    parser.add_argument(
        "--repository", type=Path, default=Path("model_repository"), help="model repository root"
    )
    parser.add_argument(
        "--version", type=int, default=None, help="version number (default: next free one)"
    )
    parser.add_argument(
        "--sign-key",
        type=Path,
        default=None,
        help="a PEM elliptic-curve private key: sign the version (<version>/model.sig, OpenSSF "
        "model signing; needs the [signing] extra)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULT_MAX_BATCH_SIZE,
        help=f"config.pbtxt max_batch_size (default: {DEFAULT_MAX_BATCH_SIZE})",
    )
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=DEFAULT_QUEUE_DELAY_US,
        help="config.pbtxt dynamic_batching max_queue_delay_microseconds "
        f"(default: {DEFAULT_QUEUE_DELAY_US})",
    )
