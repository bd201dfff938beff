"""Triton's model repository layout, written atomically.

    model_repository/<model>/config.pbtxt
    model_repository/<model>/<version>/model.onnx

A new version beside an old one keeps both; an existing version is never overwritten.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from contract.names import CONFIG_FILENAME, MODEL_FILENAME

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RepositoryError(ValueError):
    """A repository target that cannot be written (bad name, existing version, conflict)."""


def check_model_name(name: str) -> None:
    """Refuse names that are not safe as one directory and one URL path segment."""
    if not _NAME_RE.match(name):
        raise RepositoryError(
            f"invalid model name {name!r}: use letters, digits, '.', '_' and '-' only"
        )


def existing_versions(model_dir: Path) -> list[int]:
    """Numeric version directories under ``model_dir``, sorted."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def write_version(
    repository: Path,
    name: str,
    version: int | None,
    config_text: str,
    write_model: Callable[[Path], None],
) -> Path:
    """Write one version of a model; returns the path of its ``model.onnx``.

    ``write_model(path)`` writes and validates the ONNX file in a staging directory; only when it
    returns is the version moved into place, so a failure leaves nothing half-written.
    """
    check_model_name(name)
    model_dir = repository / name
    config_path = model_dir / CONFIG_FILENAME
    if config_path.exists() and config_path.read_text() != config_text:
        raise RepositoryError(
            f"{config_path} exists and describes a different model (inputs, outputs or "
            "batching differ); export under another name or remove that model"
        )
    if version is None:
        version = (existing_versions(model_dir) or [0])[-1] + 1
    if version < 1:
        raise RepositoryError(f"version must be a positive integer, got {version}")
    version_dir = model_dir / str(version)
    if version_dir.exists():
        raise RepositoryError(
            f"{version_dir} exists; choose another --version or leave it out for the next one"
        )

    repository.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{name}-", dir=repository))
    try:
        (staging / str(version)).mkdir()
        write_model(staging / str(version) / MODEL_FILENAME)
        (staging / CONFIG_FILENAME).write_text(config_text)
        model_dir.mkdir(exist_ok=True)
        os.replace(staging / str(version), version_dir)
        if not config_path.exists():
            os.replace(staging / CONFIG_FILENAME, config_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return version_dir / MODEL_FILENAME
