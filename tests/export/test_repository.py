"""export.repository: a version is written whole or not at all, and never over another."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from export.onnx_export import ExportError, export_checkpoint
from export.repository import RepositoryError


@pytest.mark.slow  # training
def test_existing_version_is_refused_and_nothing_half_written(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    export_checkpoint(checkpoints["mlp"], tmp_path, "m", version=3)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(RepositoryError, match="exists; choose another --version"):
        export_checkpoint(checkpoints["mlp"], tmp_path, "m", version=3)
    with pytest.raises(RepositoryError, match="describes a different model"):
        export_checkpoint(checkpoints["autoencoder"], tmp_path, "m")
    with pytest.raises(RepositoryError, match="invalid model name"):
        export_checkpoint(checkpoints["mlp"], tmp_path, "../escape")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert export_checkpoint(checkpoints["mlp"], tmp_path, "m").parent.name == "4"


@pytest.mark.slow  # training
def test_failed_validation_leaves_nothing(
    tmp_path: Path, checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import export.onnx_export as onnx_export

    def fail(*args: object) -> float:
        raise ExportError("parity failed")

    monkeypatch.setattr(onnx_export, "check_parity", fail)
    with pytest.raises(ExportError):
        export_checkpoint(checkpoints["mlp"], tmp_path, "m")
    assert list(tmp_path.iterdir()) == []
