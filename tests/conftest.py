"""The fixtures every folder shares: the event loop of ``pytest.mark.anyio`` tests, and the
model repositories.

``model_repository``: tiny models built with ``onnx.helper``, torch-free, for the service's
tests. ``trained_repository``: quick real checkpoints exported by ``export/``, for the export
and end-to-end tests (these need the [train] extra). Each folder's own fixtures are in its
``conftest.py`` (the service's settings, core and client in ``tests/service/``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training import train_quick


@pytest.fixture
def anyio_backend() -> str:
    """The event loop the service runs on (``pytest.mark.anyio`` tests): asyncio's."""
    return "asyncio"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One quick checkpoint per architecture (and the tanh MLP)."""
    pytest.importorskip("torch", reason="training needs the [train] extra")
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "mlp": train_quick(root / "mlp.pt", "--arch", "mlp", "--hidden", "32,32"),
        "mlp-tanh": train_quick(
            root / "mlp-tanh.pt", "--arch", "mlp", "--activation", "gelu_tanh", "--hidden", "32"
        ),
        "autoencoder": train_quick(root / "ae.pt", "--arch", "autoencoder", "--hidden", "32,8"),
        "cnn": train_quick(root / "cnn.pt", "--arch", "cnn", "--hidden", "4,8"),
    }


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Torch-free: a classifier with two versions, a tanh classifier, an autoencoder."""
    from tests.onnx_models import build_repository

    return build_repository(tmp_path_factory.mktemp("onnx_repository"))


@pytest.fixture(scope="session")
def trained_repository(
    tmp_path_factory: pytest.TempPathFactory, checkpoints: dict[str, Path]
) -> Path:
    """Exported from real checkpoints, laid out as ``model_repository``."""
    from export.onnx_export import export_checkpoint

    repo = tmp_path_factory.mktemp("model_repository")
    export_checkpoint(checkpoints["mlp"], repo, "digits-mlp")
    export_checkpoint(checkpoints["mlp"], repo, "digits-mlp")
    export_checkpoint(checkpoints["mlp-tanh"], repo, "digits-mlp-tanh")
    export_checkpoint(checkpoints["autoencoder"], repo, "digits-autoencoder")
    return repo
