"""The default models: the README's table is what a fresh build produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.readme import block
from export.defaults import TABLE_BEGIN, TABLE_END, _layers, table

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_table() -> str:
    return block(README.read_text(), (TABLE_BEGIN, TABLE_END))


def test_layers_fold_runs() -> None:
    assert _layers([64, 128, 128, 128, 10]) == "64-3x128-10"
    assert _layers([64, 128, 64, 16, 64, 128, 64]) == "64-128-64-16-64-128-64"


def test_table_needs_the_models(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="gelu-serve models"):
        table(tmp_path)


@pytest.mark.slow
def test_readme_table_matches_a_fresh_build(tmp_path: Path) -> None:
    """Build the default models as `make models` does, with its progress, one line per epoch
    when not on a terminal, and compare the table it prints and the README's."""
    pytest.importorskip("torch", reason="training needs the [train] extra")
    repository = tmp_path / "repo"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "models", "--repository", str(repository),
         "--checkpoints", str(tmp_path / "checkpoints")],
        capture_output=True, text=True, timeout=600, cwd=README.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[1/3] digits-mlp" in out and "[3/3] digits-autoencoder" in out
    assert "1 torch thread(s)" in out
    assert "digits-mlp epoch 1/" in out and "train_loss=" in out
    assert "digits-autoencoder epoch 2/" in out
    assert out.endswith(readme_table() + "\n")
    assert table(repository) == readme_table()
