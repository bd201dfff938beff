"""The command line: --help for every subcommand, and one clear line for each bad input."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
# One option each subcommand's --help must list: its own, not argparse's.
OPTIONS = {
    "train": "--threads",
    "export": "--max-batch-size",
    "models": "--table",
    "paper": "--full",
    "serve": "--workers",
    "bench": "--concurrency",
}
NO_TORCH = "import sys; sys.modules['torch'] = None; import cli; cli.main(sys.argv[1:])"


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
    assert "{train,export,models,paper,serve,bench}" in result.stdout
    assert set(OPTIONS) == set(SUBCOMMANDS)


@pytest.mark.slow
def test_models_shows_progress_per_epoch_and_the_table(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="training needs the [train] extra")
    result = gelu_serve(
        "models", "--quick", "--repository", str(tmp_path / "repo"),
        "--checkpoints", str(tmp_path / "checkpoints"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[1/3] digits-mlp" in out and "[3/3] digits-autoencoder" in out
    assert "1 torch thread(s)" in out
    assert "digits-mlp epoch 1/2: train_loss=" in out
    assert "digits-autoencoder epoch 2/2:" in out
    assert "| `digits-mlp-tanh` | MLP 64-8x128-10 | gelu_tanh | digits | accuracy" in out


def _one_error_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


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
            (("train", "--activation", "swish", "--out", out), "unknown activation 'swish'"),
            (("train", "--arch", "rnn", "--out", out), "unknown architecture 'rnn'"),
            (("train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "no"),
              "--out", out), "does not exist"),
            (("export", str(corrupt), "--name", "m", "--repository", str(tmp_path / "repo")),
             "not a readable checkpoint"),
            (("train", "--out", str(checkpoints["mlp"])), "exists; pass --overwrite"),
            (("paper", "--activations", "gelu,swish", "--out", str(tmp_path)),
             "unknown activation 'swish'"),
            (("paper", "--epochs", "0", "--out", str(tmp_path)), "at least 1"),
        ]]  # fmt: skip
        for result, needle in refused:
            _one_error_line(result.result(), needle)
        assert exported.result().returncode == 0
    _one_error_line(gelu_serve(*export), "exists")
    assert not (tmp_path / "x.pt").exists()
