"""The GELU paper's comparisons (Hendrycks & Gimpel, section 3.1 and 3.2), rerun here.

``gelu-serve paper`` (``make paper``):

- **Classifier**: the paper's fully connected network, 8 layers of 128 units, batch 128, Adam,
  on Fashion-MNIST's official train/test split (MNIST with ``--dataset mnist --data-dir``),
  GELU against ReLU and ELU (``--activations`` adds SiLU or the approximations), without and
  with dropout 0.5. The learning rate is chosen per activation and setting from a small grid
  by validation loss on the last 10,000 training images (a short run, one seed); then every
  seed trains on the other 50,000, and the median training log-loss curve and the test accuracy
  are reported, as the paper reports medians.
- **Autoencoder**: the paper's deep autoencoder shrunk to what two cores train in minutes
  (784-256-128-30 with a linear code, the decoder mirrored, a sigmoid output; the paper's is
  1000-500-250-30), batch 64, Adam, mean squared reconstruction error, learning rate chosen
  the same way.

Runs are spread over a pool of processes, one torch thread each. Results go to
``<out>/results.json``, the plots to ``<out>/*.png`` and the table to ``<out>/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from contract.readme import replace_block
from models.arguments import activation_list, positive_int

PAPER_ACTIVATIONS = ("gelu", "relu", "elu")
VALIDATION = 10_000  # held out of the training images for the learning-rate choice


@dataclass(frozen=True)
class Budget:
    """How much to train: the default fits in about 15 minutes on two cores."""

    epochs: int = 10
    seeds: int = 3
    lr_grid: tuple[float, ...] = (1e-3, 1e-4)
    lr_epochs: int = 2
    autoencoder_epochs: int = 5
    autoencoder_seeds: int = 2


FULL = Budget(
    epochs=50,
    seeds=5,
    lr_grid=(1e-3, 1e-4, 1e-5),
    lr_epochs=5,
    autoencoder_epochs=50,
    autoencoder_seeds=3,
)


@dataclass(frozen=True)
class Job:
    """One training run."""

    experiment: str  # "classifier" or "autoencoder"
    activation: str
    dropout: float
    lr: float
    seed: int
    epochs: int
    selecting: bool  # a learning-rate trial: validate on the held-out images
    dataset: str
    data_dir: str | None
    hidden: tuple[int, ...] = field(default=())


def _network(job: Job, shape: tuple[int, ...], classes: int) -> Any:
    from models.networks import NetworkConfig

    if job.experiment == "classifier":
        hidden = job.hidden or (128,) * 8
        return NetworkConfig("mlp", job.activation, shape, hidden, classes, dropout=job.dropout)
    return NetworkConfig("autoencoder", job.activation, shape, job.hidden or (256, 128, 30))


def run_job(job: Job) -> dict[str, Any]:
    """Train one network; the per-epoch training loss and the held-out (or test) metrics."""
    import torch

    from models.data import load_split
    from models.networks import build_model
    from models.train import _batch_loss, _loss_fn, evaluate

    torch.set_num_threads(1)
    torch.manual_seed(job.seed)
    train, test = load_split(job.dataset, job.data_dir)
    images, labels = torch.from_numpy(train.images), torch.from_numpy(train.labels)
    held_out = min(VALIDATION, len(images) // 5)
    if job.selecting:
        x_train, y_train = images[:-held_out], labels[:-held_out]
        x_eval, y_eval = images[-held_out:], labels[-held_out:]
    else:
        x_train, y_train = images[:-held_out], labels[:-held_out]
        x_eval, y_eval = torch.from_numpy(test.images), torch.from_numpy(test.labels)
    config = _network(job, train.sample_shape, len(train.label_names))
    model = build_model(config)
    optimiser = torch.optim.Adam(model.parameters(), lr=job.lr)
    loss_fn = _loss_fn(config)
    batch_size = 128 if job.experiment == "classifier" else 64
    generator = torch.Generator().manual_seed(job.seed)
    curve = []
    started = time.process_time()
    for _ in range(job.epochs):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(x_train), generator=generator).split(batch_size):
            loss, _ = _batch_loss(model, loss_fn, x_train[batch], y_train[batch], config.task)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        curve.append(total / len(x_train))
    metrics = evaluate(model, config, x_eval, y_eval)
    return {
        "job": asdict(job),
        "train_loss": curve,
        "eval": metrics,
        "cpu_seconds": time.process_time() - started,
    }


def _settings(experiment: str) -> tuple[float, ...]:
    return (0.0, 0.5) if experiment == "classifier" else (0.0,)


def run_study(
    budget: Budget,
    activations: tuple[str, ...],
    dataset: str,
    data_dir: str | None,
    workers: int,
    hidden: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, Any]:
    """Choose each learning rate, then train every seed; the results as plain data."""
    hidden = hidden or {}
    epochs = {"classifier": budget.epochs, "autoencoder": budget.autoencoder_epochs}
    seeds = {"classifier": budget.seeds, "autoencoder": budget.autoencoder_seeds}
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        trials = [
            Job(
                experiment,
                a,
                dropout,
                lr,
                0,
                budget.lr_epochs,
                True,
                hidden=hidden.get(experiment, ()),
                dataset=dataset,
                data_dir=data_dir,
            )
            for experiment in ("classifier", "autoencoder")
            for a in activations
            for dropout in _settings(experiment)
            for lr in budget.lr_grid
        ]
        best: dict[tuple[str, str, float], tuple[float, float]] = {}  # key -> (loss, lr)
        trial_results = list(pool.map(run_job, trials))
        for job, result in zip(trials, trial_results, strict=True):
            key = (job.experiment, job.activation, job.dropout)
            loss = float(result["eval"]["loss"])
            if key not in best or loss < best[key][0]:
                best[key] = (loss, job.lr)
        chosen = {key: lr for key, (_, lr) in best.items()}
        runs = [
            Job(
                e,
                a,
                d,
                chosen[e, a, d],
                seed,
                epochs[e],
                False,
                dataset,
                data_dir,
                hidden.get(e, ()),
            )
            for (e, a, d) in chosen
            for seed in range(seeds[e])
        ]
        run_results = list(pool.map(run_job, runs))
    return {
        "budget": asdict(budget),
        "dataset": dataset,
        "activations": list(activations),
        "workers": workers,
        "wall_seconds": time.monotonic() - started,
        "trials": trial_results,
        "runs": run_results,
    }


def summarise(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per experiment, setting and activation: medians over seeds."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for run in study["runs"]:
        job = run["job"]
        groups.setdefault((job["experiment"], job["dropout"], job["activation"]), []).append(run)
    rows = []
    for (experiment, dropout, activation), runs in groups.items():
        curves = np.array([r["train_loss"] for r in runs])
        metric = "accuracy" if experiment == "classifier" else "mse"
        rows.append(
            {
                "experiment": experiment,
                "dropout": dropout,
                "activation": activation,
                "lr": runs[0]["job"]["lr"],
                "seeds": len(runs),
                "median_curve": np.median(curves, axis=0).tolist(),
                "final_train_loss": float(np.median(curves[:, -1])),
                "test_loss": statistics.median(r["eval"]["loss"] for r in runs),
                f"test_{metric}": statistics.median(r["eval"][metric] for r in runs),
            }
        )
    return rows


def orderings(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per setting: the activations by median final training loss, and whether GELU is lowest."""
    settings: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        settings.setdefault(setting_name(row), []).append(row)
    result = {}
    for name, group in settings.items():
        ranked = sorted(group, key=lambda r: r["final_train_loss"])
        by_test = sorted(group, key=lambda r: r["test_loss"])
        result[name] = {
            "by_train_loss": [r["activation"] for r in ranked],
            "gelu_lowest_train_loss": ranked[0]["activation"] == "gelu",
            "by_test_loss": [r["activation"] for r in by_test],
            "gelu_lowest_test_loss": by_test[0]["activation"] == "gelu",
        }
    return result


def setting_name(row: dict[str, Any]) -> str:
    if row["experiment"] == "autoencoder":
        return "autoencoder"
    return "classifier, dropout 0.5" if row["dropout"] else "classifier, no dropout"


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """The paper's figures: median training log loss per epoch, one line per activation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for experiment, settings in (("classifier", (0.0, 0.5)), ("autoencoder", (0.0,))):
        fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4), squeeze=False)
        for ax, dropout in zip(axes[0], settings, strict=True):
            for row in rows:
                if row["experiment"] == experiment and row["dropout"] == dropout:
                    epochs = range(1, len(row["median_curve"]) + 1)
                    ax.plot(
                        epochs, row["median_curve"], label=f"{row['activation']} (lr {row['lr']:g})"
                    )
            ax.set_xlabel("epoch")
            ax.set_ylabel("training log loss" if experiment == "classifier" else "training MSE")
            ax.set_yscale("log")
            ax.set_title(setting_name({"experiment": experiment, "dropout": dropout}))
            ax.legend()
        fig.tight_layout()
        path = out / f"{experiment}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def table(study: dict[str, Any], rows: list[dict[str, Any]], command: str) -> str:
    """``docs/paper/README.md``: the command, the budget, the medians and the orderings."""
    budget = study["budget"]
    lines = [
        "# The GELU paper's comparisons, rerun",
        "",
        f"Command: `{command}` ({study['dataset']}, {study['workers']} worker processes, "
        f"{study['wall_seconds'] / 60:.1f} minutes wall). Generated by `models/paper.py`.",
        "",
        f"Classifier: 784-8x128-10, batch 128, Adam, {budget['epochs']} epochs, seeds "
        f"0-{budget['seeds'] - 1}. Autoencoder: 784-256-128-30 mirrored, batch 64, Adam, "
        f"{budget['autoencoder_epochs']} epochs, seeds 0-{budget['autoencoder_seeds'] - 1}. "
        f"Learning rate per row from {', '.join(f'{lr:g}' for lr in budget['lr_grid'])} by "
        f"validation loss after {budget['lr_epochs']} epochs (seed 0, 10,000 held-out training "
        "images). Training is on the other 50,000; test figures are on the official test set.",
        "",
        "| setting | activation | lr | median final training loss | median test loss "
        "| median test accuracy / MSE |",
        "|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (setting_name(r), r["final_train_loss"])):
        metric = row.get("test_accuracy", row.get("test_mse"))
        lines.append(
            f"| {setting_name(row)} | {row['activation']} | {row['lr']:g} | "
            f"{row['final_train_loss']:.4f} | {row['test_loss']:.4f} | {metric:.4f} |"
        )
    lines += ["", "Does the paper's ordering (GELU lowest) reproduce?", ""]
    for name, order in orderings(rows).items():
        train_yes = "yes" if order["gelu_lowest_train_loss"] else "no"
        test_yes = "yes" if order["gelu_lowest_test_loss"] else "no"
        lines.append(
            f"- {name}: training loss {' < '.join(order['by_train_loss'])} ({train_yes}); "
            f"test loss {' < '.join(order['by_test_loss'])} ({test_yes})."
        )
    lines += ["", "![classifier](classifier.png)", "", "![autoencoder](autoencoder.png)", ""]
    return "\n".join(lines)


README = Path(__file__).resolve().parent.parent / "docs" / "models.md"  # its summary block
README_BLOCK = ("<!-- paper: generated by make paper -->\n", "<!-- /paper -->\n")


def readme_block(study: dict[str, Any]) -> str:
    """The README's summary of a study: medians per setting and whether GELU came first."""
    budget = study["budget"]
    lines = [
        f"`{study['command']}`: {study['dataset']}, classifier {budget['epochs']} epochs x "
        f"{budget['seeds']} seeds, autoencoder {budget['autoencoder_epochs']} epochs x "
        f"{budget['autoencoder_seeds']} seeds, {study['wall_seconds'] / 60:.1f} minutes on "
        f"{study['workers']} processes.",
        "",
        "| setting | median final training loss | GELU lowest? | median test accuracy / MSE |",
        "|---|---|---|---|",
    ]
    rows = study["summary"]
    for name, order in study["orderings"].items():
        group = {r["activation"]: r for r in rows if setting_name(r) == name}
        losses = ", ".join(
            f"{a} {group[a]['final_train_loss']:.4f}" for a in order["by_train_loss"]
        )
        metric = "test_accuracy" if name.startswith("classifier") else "test_mse"
        tests = ", ".join(f"{a} {group[a][metric]:.4f}" for a in group)
        first = "yes" if order["gelu_lowest_train_loss"] else "no"
        lines.append(f"| {name} | {losses} | {first} | {tests} |")
    return README_BLOCK[0] + "\n".join(lines) + "\n" + README_BLOCK[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="docs/paper", help="where results, plots and table go")
    parser.add_argument(
        "--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist", "digits")
    )
    parser.add_argument("--data-dir", default=None, help="IDX files (required for mnist)")
    parser.add_argument("--full", action="store_true", help="the paper's 50 epochs and 5 seeds")
    parser.add_argument(
        "--epochs", type=positive_int, help="classifier epochs (overrides the budget)"
    )
    parser.add_argument(
        "--seeds", type=positive_int, help="classifier seeds (overrides the budget)"
    )
    parser.add_argument("--autoencoder-epochs", type=positive_int, help="autoencoder epochs")
    parser.add_argument("--lr-epochs", type=positive_int, help="epochs per learning-rate trial")
    parser.add_argument(
        "--activations",
        type=activation_list,
        default=",".join(PAPER_ACTIVATIONS),
        help="comma-separated (default: gelu,relu,elu; also silu, gelu_tanh, gelu_sigmoid)",
    )
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")


def run(args: argparse.Namespace) -> Path:
    budget = FULL if args.full else Budget()
    overrides = {
        "epochs": args.epochs,
        "seeds": args.seeds,
        "autoencoder_epochs": args.autoencoder_epochs,
        "lr_epochs": args.lr_epochs,
    }
    budget = replace(budget, **{k: v for k, v in overrides.items() if v is not None})
    activations: tuple[str, ...] = args.activations  # checked by add_arguments' types
    workers = args.workers or len(os.sched_getaffinity(0))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = (
        "gelu-serve paper " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["paper"]
        else "gelu-serve paper"
    )
    study = run_study(budget, activations, args.dataset, args.data_dir, workers)
    rows = summarise(study)
    study["summary"] = rows
    study["orderings"] = orderings(rows)
    study["command"] = command.strip()
    (out / "results.json").write_text(json.dumps(study, indent=1) + "\n")
    plot(rows, out)
    (out / "README.md").write_text(table(study, rows, study["command"]))
    if out.resolve() == README.parent / "paper":
        README.write_text(replace_block(README.read_text(), README_BLOCK, readme_block(study)))
    print((out / "README.md").read_text())
    return out
