"""gelu-serve's command line: ``gelu-serve {train,export,models,serve} --help``.

Each subcommand imports its package only when it runs, so ``serve`` works in a serving-only
install (no torch) and ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DefaultModel:
    """One model that ``make models`` builds when the repository lacks it."""

    name: str
    train_args: tuple[str, ...]


DEFAULT_MODELS = (
    DefaultModel("digits-mlp", ("--arch", "mlp", "--activation", "gelu")),
    DefaultModel("digits-mlp-tanh", ("--arch", "mlp", "--activation", "gelu_tanh")),
    DefaultModel(
        "digits-autoencoder", ("--arch", "autoencoder", "--activation", "gelu", "--epochs", "60")
    ),
)


def _train_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], object]:
    from models import train

    train.add_arguments(parser)
    return train.run


def _export_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], object]:
    from export import onnx_export

    onnx_export.add_arguments(parser)
    return onnx_export.run


def _models_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], object]:
    parser.add_argument(
        "--repository", type=Path, default=Path("model_repository"), help="model repository root"
    )
    parser.add_argument(
        "--checkpoints", type=Path, default=Path("checkpoints"), help="where checkpoints go"
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized training, for tests")
    return build_default_models


def build_default_models(args: argparse.Namespace) -> None:
    """Train and export each default model that the repository does not hold yet."""
    from export import onnx_export
    from export.repository import existing_versions
    from models import train

    for model in DEFAULT_MODELS:
        if existing_versions(args.repository / model.name):
            print(f"{model.name}: already in {args.repository}, skipped")
            continue
        checkpoint = args.checkpoints / f"{model.name}.pt"
        argv = [*model.train_args, "--out", str(checkpoint), "--overwrite", "--no-progress"]
        if args.quick:
            argv.append("--quick")
        parser = argparse.ArgumentParser()
        train.add_arguments(parser)
        train.run(parser.parse_args(argv))
        onnx_export.export_checkpoint(checkpoint, args.repository, model.name)


def _serve_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], object]:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes (default: GELU_WORKERS, else 1); each loads every model",
    )
    return serve


def serve(args: argparse.Namespace) -> None:
    """Run the service under uvicorn; every other setting comes from GELU_* variables."""
    import uvicorn

    workers = args.workers or int(os.environ.get("GELU_WORKERS", "1"))
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Each worker writes its samples here and /metrics sums them, whichever worker answers.
        directory = tempfile.mkdtemp(prefix="gelu-serve-metrics-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=workers,
        log_level=os.environ.get("GELU_LOG_LEVEL", "info").lower(),
        access_log=False,
    )


def _bench_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], object]:
    from bench import run

    run.add_arguments(parser)
    return run.report


SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Callable[..., object]]]] = {
    "train": ("train a GELU network and write a checkpoint", _train_parser),
    "export": ("export a checkpoint to a validated ONNX model repository entry", _export_parser),
    "models": ("train and export the default models missing from the repository", _models_parser),
    "serve": ("serve the model repository over HTTP", _serve_parser),
    "bench": ("benchmark the inference path against the HTTP and compute floors", _bench_parser),
}


def main(argv: list[str] | None = None) -> None:
    """Parse the subcommand and run it; a user's mistake exits 2 with one line on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gelu-serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (help_text, _) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    # Only the chosen subcommand's options are built, so its imports happen only when used.
    command = next((a for a in argv if a in SUBCOMMANDS), None)
    if command is None:
        parser.parse_args(argv)
        parser.print_help()
        sys.exit(2)
    help_text, build = SUBCOMMANDS[command]
    handler = build(sub.choices[command])
    args = parser.parse_args(argv)
    try:
        handler(args)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        # Our own errors (DataError, ConfigError, CheckpointError, RepositoryError, ExportError,
        # UnknownActivationError) all derive from these; the message says what to do.
        print(f"gelu-serve {command}: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
