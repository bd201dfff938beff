"""gelu-serve's command line: ``gelu-serve {train,export,models,paper,serve,bench,tune} --help``.

Options are declared in light modules (no torch, onnx or web stack) and each subcommand's
implementation is imported only when it runs, so ``serve`` works in a serving-only install (no
torch), and ``--help`` and a mistaken option are answered at once.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: its help, where its options are declared, and what runs it."""

    help: str
    arguments: str  # "module:function" adding the options to a parser; no heavy imports
    handler: str  # "module:function" taking the parsed arguments


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing in one line as the subcommands do (argparse's own refusals
    print the usage first): ``gelu-serve train: error: argument --arch: invalid choice: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _resolve(target: str) -> Callable[..., object]:
    module, _, name = target.partition(":")
    function: Callable[..., object] = getattr(importlib.import_module(module), name)
    return function


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` subcommand's options; every other setting is a ``GELU_*`` variable."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes (default: GELU_WORKERS, else 1); each loads every model",
    )


def serve(args: argparse.Namespace) -> None:
    """Run the service; settings are checked before any worker starts."""
    import os

    from service.host import serve as run_server
    from service.settings import load_settings

    settings = load_settings()
    workers = args.workers or settings.workers
    if workers > 1 and settings.prometheus_multiproc_dir is None:
        # Each worker writes its samples here and /metrics sums them, whichever worker answers.
        directory = tempfile.mkdtemp(prefix="gelu-serve-metrics-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    run_server(args.host, args.port, workers, settings)


def health_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``health`` subcommand's options."""
    parser.add_argument("--port", type=int, default=8000, help="the local port (default: 8000)")
    parser.add_argument("--path", default="/v2/health/ready", help="default: /v2/health/ready")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default: 2)")


def health(args: argparse.Namespace) -> None:
    """Exit 0 when the service on this host answers 200 at ``--path``, else 1: a probe for
    Docker's HEALTHCHECK and Kubernetes' exec probes that works under TLS, mutual TLS and
    credentials. It reads the service's own settings: it speaks TLS when GELU_TLS_CERT_FILE is
    set, without verifying the certificate (it talks to 127.0.0.1, its own container or pod),
    presents GELU_TLS_PROBE_CERT_FILE if set, and sends a key of the ``health`` route class
    when GELU_RESTRICTED_API restricts it."""
    import http.client
    import ssl

    from service.auth import Restrictions
    from service.settings import load_settings

    settings = load_settings()
    restrictions = Restrictions.from_settings(settings)
    headers = restrictions.credential("health") if restrictions is not None else {}
    if settings.tls_cert_file is None:
        connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=args.timeout)
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if settings.tls_probe_cert_file is not None:
            context.load_cert_chain(settings.tls_probe_cert_file)
        connection = http.client.HTTPSConnection(
            "127.0.0.1", args.port, timeout=args.timeout, context=context
        )
    try:
        connection.request("GET", args.path, headers=headers)
        status = connection.getresponse().status
    except OSError as exc:
        print(f"gelu-serve health: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        connection.close()
    sys.exit(0 if status == 200 else 1)


SUBCOMMANDS = {
    "train": Subcommand(
        "train a GELU network and write a checkpoint",
        "models.arguments:add_arguments",
        "models.train:run",
    ),
    "export": Subcommand(
        "export a checkpoint to a validated ONNX model repository entry",
        "export.arguments:add_arguments",
        "export.onnx_export:run",
    ),
    "models": Subcommand(
        "train and export the default models missing from the repository, print their table",
        "export.defaults:add_arguments",
        "export.defaults:run",
    ),
    "paper": Subcommand(
        "rerun the GELU paper's classifier and autoencoder comparisons, with plots",
        "models.paper:add_arguments",
        "models.paper:run",
    ),
    "serve": Subcommand("serve the model repository over HTTP", "cli:serve_arguments", "cli:serve"),
    "health": Subcommand(
        "exit 0 when the local service is ready (a probe; TLS, mutual TLS and credentials as "
        "configured)",
        "cli:health_arguments",
        "cli:health",
    ),
    "bench": Subcommand(
        "benchmark the inference path against the HTTP and compute floors",
        "bench.arguments:add_arguments",
        "bench.command:report",
    ),
    "tune": Subcommand(
        "search one model's batching, instances and threads; write the best config.pbtxt "
        "within a p99 budget beside its own",
        "bench.arguments:add_tune_arguments",
        "bench.tune:run",
    ),
}


def main(argv: list[str] | None = None) -> None:
    """Parse the subcommand and run it; a user's mistake exits 2 with one line on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    parser = Parser(prog="gelu-serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, command in SUBCOMMANDS.items():
        _resolve(command.arguments)(
            sub.add_parser(name, help=command.help, description=command.help)
        )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        sys.exit(2)
    handler = _resolve(SUBCOMMANDS[args.command].handler)
    try:
        handler(args)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        # Our own errors (DataError, ConfigError, CheckpointError, RepositoryError, ExportError,
        # UnknownActivationError, SettingsError) all derive from these; the message says what
        # to do.
        print(f"gelu-serve {args.command}: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
