"""The HTTP face's fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.onnx_models import write_model


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classifier wide enough (a millisecond or so a run of 8) to build a queue behind it."""
    root = tmp_path_factory.mktemp("slow-repository")
    write_model(root, "slow", 1, hidden=1024, max_batch_size=8)
    return root
