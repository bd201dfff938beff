"""Quick real checkpoints, trained by the real entry point (needs the [train] extra)."""

from __future__ import annotations

import argparse
from pathlib import Path


def train_quick(out: Path, *args: str) -> Path:
    """Train a smoke-sized model with the real training entry point; the checkpoint's path."""
    from models import train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    train.run(parser.parse_args([*args, "--quick", "--no-progress", "--out", str(out)]))
    return out
