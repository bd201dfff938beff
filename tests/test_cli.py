"""The command line: --help for every subcommand, and one clear line for each bad input."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cli import SUBCOMMANDS
from tests.servers import refusal_alone

ROOT = Path(__file__).resolve().parents[1]
# One option each subcommand's --help must list: its own, not argparse's.
OPTIONS = {
    "train": "--threads",
    "export": "--max-batch-size",
    "models": "--table",
    "paper": "--full",
    "serve": "--workers",
    "health": "--path",
    "bench": "--concurrency",
}
RUN_CLI = "import cli; cli.main(sys.argv[1:])"
NO_TORCH = f"import sys; sys.modules['torch'] = None; {RUN_CLI}"
# Options are declared in light modules: a mistaken one is refused before any of these loads.
HEAVY = ("torch", "sklearn", "onnx", "onnxruntime", "fastapi", "grpc")
LIGHT = f"import sys; sys.modules.update(dict.fromkeys({HEAVY})); {RUN_CLI}"


def gelu_serve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_subcommand_has_help_without_torch(command: str) -> None:
    # torch made unimportable: --help must not need it.
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH, command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: gelu-serve " + command in result.stdout
    assert OPTIONS[command] in result.stdout


def test_no_subcommand_prints_usage_listing_every_subcommand() -> None:
    result = gelu_serve()
    assert result.returncode == 2
    assert "{train,export,models,paper,serve,health,bench}" in result.stdout
    assert set(OPTIONS) == set(SUBCOMMANDS)


def _one_error_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ("train", "--activation", "swish", "--out", "x.pt"),
            "--activation: invalid choice: 'swish'",
        ),
        (("train", "--arch", "rnn", "--out", "x.pt"), "--arch: invalid choice: 'rnn'"),
        (("train", "--epochs", "0", "--out", "x.pt"), "--epochs: must be at least 1, got 0"),
        (("train", "--batch-size", "x", "--out", "x.pt"), "expected a whole number, got 'x'"),
        (("train",), "the following arguments are required: --out"),
        (("paper", "--activations", "gelu,swish"), "unknown activation 'swish'; choose one of"),
        (("paper", "--lr-epochs", "0"), "--lr-epochs: must be at least 1"),
    ],
)
def test_mistaken_options_are_refused_before_anything_heavy_is_imported(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    # torch, onnx and the web stack made unimportable: the refusal is instant.
    result = subprocess.run(
        [sys.executable, "-c", LIGHT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    _one_error_line(result, needle)
    assert result.stderr.startswith(f"gelu-serve {args[0]}: error: ")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    out = str(tmp_path / "x.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"garbage")
    repo = tmp_path / "repo2"
    export = ("export", str(checkpoints["mlp"]), "--name", "m", "--repository", str(repo),
              "--version", "1")  # fmt: skip
    # independent commands, each seconds of imports: run at once
    with ThreadPoolExecutor(8) as pool:
        exported = pool.submit(gelu_serve, *export)
        refused = [(pool.submit(gelu_serve, *args), needle) for args, needle in [
            (("train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "no"),
              "--out", out), "does not exist"),
            (("export", str(corrupt), "--name", "m", "--repository", str(tmp_path / "repo")),
             "not a readable checkpoint"),
            (("train", "--out", str(checkpoints["mlp"])), "exists; pass --overwrite"),
        ]]  # fmt: skip
        for result, needle in refused:
            _one_error_line(result.result(), needle)
        assert exported.result().returncode == 0
    _one_error_line(gelu_serve(*export), "exists")
    assert not (tmp_path / "x.pt").exists()


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    result = refusal_alone(GELU_PROVIDERS="bogus", GELU_WARMUP_RUNS="-1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "GELU_PROVIDERS=bogus: unknown execution provider(s) ['bogus']" in lines[0]
    assert "GELU_WARMUP_RUNS=-1" in lines[0]
