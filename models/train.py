"""Train a GELU network and write a self-describing checkpoint.

Shape after pytorch/examples ``mnist/main.py``: ``train()``, ``evaluate()``, ``main()``. The
checkpoint stores the model's full config (nanoGPT's ``model_args``) so that export rebuilds the
network from the checkpoint alone.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from models.arguments import DEFAULT_HIDDEN, add_arguments
from models.data import Dataset, load_dataset
from models.networks import NetworkConfig, build_model

CHECKPOINT_FORMAT = "gelu-serve/checkpoint-v1"
# Below this much work per training step (parameters x batch size), one torch thread is faster
# than two on a 2-core machine and does not collapse when anything else runs: the default
# networks sit at 1e6-4e6, the 784-3x2048-10 benchmark model at 3e8 (2.4x faster on 2 threads).
# Measured with one training step timed at 1 and 2 threads; see docs/models.md.
SINGLE_THREAD_WORK = 50_000_000


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or not one of ours."""


@dataclass(frozen=True)
class TrainOptions:
    """Optimisation settings; ``seed`` makes a run repeatable bit for bit on one machine."""

    epochs: int = 40
    batch_size: int = 32
    lr: float = 1e-3
    # Smoothing keeps logits small (|logit| ~5 instead of ~100 on digits), which also keeps
    # float32 ONNX/PyTorch parity within 1e-5 and calibrates the probabilities.
    label_smoothing: float = 0.1
    val_fraction: float = 0.2
    seed: int = 0
    progress: bool = True
    threads: int = 0  # torch intra-op threads; 0 picks by the size of the network
    cores: int = 0  # the most threads a pick may give (0: every core this process may use)
    label: str = "train"  # names the model in progress output


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation split into (train, validation) indices."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * val_fraction))
    return order[n_val:], order[:n_val]


def _loss_fn(config: NetworkConfig, label_smoothing: float = 0.0) -> nn.Module:
    if config.task == "classification":
        return nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return nn.MSELoss()


def _batch_loss(
    model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(x)
    loss: torch.Tensor = loss_fn(out, y if task == "classification" else x)
    return loss, out


@torch.no_grad()
def evaluate(
    model: nn.Module, config: NetworkConfig, images: torch.Tensor, labels: torch.Tensor
) -> dict[str, float]:
    """Loss and accuracy (classifier) or mean squared reconstruction error (autoencoder)."""
    model.eval()
    loss, out = _batch_loss(model, _loss_fn(config), images, labels, config.task)
    if config.task == "classification":
        accuracy = (out.argmax(dim=1) == labels).float().mean().item()
        return {"loss": loss.item(), "accuracy": accuracy}
    return {"loss": loss.item(), "mse": loss.item()}


def pick_threads(requested: int, parameters: int, batch_size: int, cores: int = 0) -> int:
    """torch intra-op threads for training: ``requested``, or by the work per step, up to
    ``cores`` (0: every core this process may use)."""
    if requested > 0:
        return requested
    if parameters * batch_size < SINGLE_THREAD_WORK:
        return 1
    return cores or len(os.sched_getaffinity(0))


def train(
    config: NetworkConfig, data: Dataset, options: TrainOptions
) -> tuple[nn.Module, list[dict[str, float]], dict[str, float]]:
    """Train from a fresh seeded init; returns the model, per-epoch history, final metrics.

    Progress: a bar when stderr is a terminal, and one line per epoch (flushed, so it shows in
    logs and pipes too) unless ``options.progress`` is false.
    """
    torch.manual_seed(options.seed)
    torch.use_deterministic_algorithms(True)
    model = build_model(config)
    parameters = sum(p.numel() for p in model.parameters())
    threads = pick_threads(options.threads, parameters, options.batch_size, options.cores)
    torch.set_num_threads(threads)
    if options.progress:
        print(
            f"{options.label}: {config.arch}/{config.activation}, {parameters:,} parameters, "
            f"{options.epochs} epochs on {data.name}, {threads} torch thread(s)",
            flush=True,
        )
    images = torch.from_numpy(data.images.reshape(-1, *config.input_shape))
    labels = torch.from_numpy(data.labels)
    train_idx, val_idx = split_indices(len(images), options.val_fraction, options.seed)
    x_train, y_train = images[train_idx], labels[train_idx]
    x_val, y_val = images[val_idx], labels[val_idx]

    optimiser = torch.optim.Adam(model.parameters(), lr=options.lr)
    loss_fn = _loss_fn(config, options.label_smoothing)
    generator = torch.Generator().manual_seed(options.seed)
    history: list[dict[str, float]] = []
    epochs = tqdm(
        range(1, options.epochs + 1),
        desc=options.label,
        unit="epoch",
        disable=not (options.progress and sys.stderr.isatty()),
    )
    for epoch in epochs:
        model.train()
        total, seen = 0.0, 0
        for batch in torch.randperm(len(x_train), generator=generator).split(options.batch_size):
            loss, _ = _batch_loss(model, loss_fn, x_train[batch], y_train[batch], config.task)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
            seen += len(batch)
        val = evaluate(model, config, x_val, y_val)
        row = {"epoch": float(epoch), "train_loss": total / seen}
        row.update({f"val_{k}": v for k, v in val.items()})
        history.append(row)
        epochs.set_postfix({k: round(v, 4) for k, v in row.items() if k != "epoch"})
        if options.progress:
            values = " ".join(f"{k}={v:.4f}" for k, v in row.items() if k != "epoch")
            tqdm.write(f"{options.label} epoch {epoch}/{options.epochs}: {values}")
            sys.stdout.flush()
    model.eval()
    metrics = {k: v for k, v in history[-1].items() if k != "epoch"}
    return model, history, metrics


def save_checkpoint(
    path: Path,
    model: nn.Module,
    config: NetworkConfig,
    metrics: dict[str, float],
    history: list[dict[str, float]],
    extra: dict[str, Any],
) -> None:
    """Write the checkpoint atomically: a crash never leaves a half-written file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model_config": config.to_dict(),
        "state_dict": model.state_dict(),
        "metrics": metrics,
        "history": history,
        **extra,
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], nn.Module, NetworkConfig]:
    """Load a checkpoint and rebuild its network in eval mode; ``CheckpointError`` if bad."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint: {reason}") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a gelu-serve checkpoint ({CHECKPOINT_FORMAT})")
    config = NetworkConfig.from_dict(payload["model_config"])
    model = build_model(config)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(f"{path}: weights do not match its model config: {first}") from None
    model.eval()
    return payload, model, config


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _parse_hidden(text: str | None, arch: str) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_HIDDEN.get(arch, (128,))
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--hidden must be comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace, cores: int = 0) -> Path:
    """Train as ``args`` say and write the checkpoint; returns its path. ``cores`` bounds the
    threads picked for a large network (0: every core), for trainings run side by side."""
    out: Path = args.out
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite or choose another --out")
    data = load_dataset(args.dataset, args.data_dir)
    if args.quick:
        data = Dataset(
            data.name, data.images[:400], data.labels[:400], data.label_names, data.divide_by
        )
    classifier = args.arch != "autoencoder"
    config = NetworkConfig(
        arch=args.arch,
        activation=args.activation,
        input_shape=data.sample_shape if args.arch == "cnn" else (int(np.prod(data.sample_shape)),),
        hidden=_parse_hidden(args.hidden, args.arch),
        num_classes=len(data.label_names) if classifier else 0,
        label_names=data.label_names if classifier else (),
        normalisation={"divide_by": data.divide_by},
        dropout=args.dropout,
    )
    config.validate()
    options = TrainOptions(
        epochs=2 if args.quick else args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        label_smoothing=args.label_smoothing,
        seed=args.seed,
        progress=not args.no_progress,
        threads=args.threads,
        cores=cores,
        label=args.out.stem,
    )
    model, history, metrics = train(config, data, options)
    extra = {"dataset": data.name, "seed": args.seed, "epochs": options.epochs}
    save_checkpoint(out, model, config, metrics, history, extra)
    summary = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
    print(f"wrote {out}: {config.arch}/{config.activation} on {data.name}: {summary}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``python -m models.train``."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
