"""The command line: --help for every subcommand, and one clear line for each bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli import SUBCOMMANDS


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
def test_every_subcommand_has_help(command: str) -> None:
    result = gelu_serve(command, "--help")
    assert result.returncode == 0
    assert "usage: gelu-serve " + command in result.stdout
    assert "--" in result.stdout  # its options are listed


def test_no_subcommand_prints_usage() -> None:
    result = gelu_serve()
    assert result.returncode == 2 and "train" in result.stdout


def _one_error_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    out = str(tmp_path / "x.pt")
    _one_error_line(gelu_serve("train", "--activation", "swish", "--out", out),
                    "unknown activation 'swish'")  # fmt: skip
    _one_error_line(gelu_serve("train", "--arch", "rnn", "--out", out),
                    "unknown architecture 'rnn'")  # fmt: skip
    _one_error_line(
        gelu_serve("train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "no"),
                   "--out", out),
        "does not exist",
    )  # fmt: skip
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"garbage")
    _one_error_line(gelu_serve("export", str(corrupt), "--name", "m", "--repository",
                               str(tmp_path / "repo")), "not a readable checkpoint")  # fmt: skip
    _one_error_line(
        gelu_serve("train", "--out", str(checkpoints["mlp"])), "exists; pass --overwrite"
    )
    repo = tmp_path / "repo2"
    assert gelu_serve("export", str(checkpoints["mlp"]), "--name", "m", "--repository", str(repo),
                      "--version", "1").returncode == 0  # fmt: skip
    _one_error_line(gelu_serve("export", str(checkpoints["mlp"]), "--name", "m", "--repository",
                               str(repo), "--version", "1"), "exists")  # fmt: skip
    assert not (tmp_path / "x.pt").exists()
