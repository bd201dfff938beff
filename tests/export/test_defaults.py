"""The default models: the README's table is what a fresh build produces."""

from __future__ import annotations

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
    """Build the default models exactly as `make models` does and compare the README's table."""
    pytest.importorskip("torch", reason="training needs the [train] extra")
    from export.defaults import DEFAULT_MODELS, build

    build(tmp_path / "repo", tmp_path / "checkpoints", DEFAULT_MODELS)
    assert table(tmp_path / "repo") == readme_table()
