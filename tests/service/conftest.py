"""The service's fixtures: settings over the test repository, a client of the real app with
its lifespan run (and one in explicit control mode), a private copy of the repository to
change, and a model slow enough to build a queue behind."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers import app_client, service_settings
from tests.onnx_models import write_model

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from service.settings import Settings


@pytest.fixture(scope="session")
def settings_factory(model_repository: Path) -> Callable[..., Settings]:
    """Settings over the test repository, with overrides (``service_settings``)."""

    def make(**overrides: Any) -> Settings:
        return service_settings(overrides.pop("model_repository", model_repository), **overrides)

    return make


@pytest.fixture(scope="module")
def client(settings_factory: Callable[..., Settings]) -> Iterator[TestClient]:
    """A TestClient over the real app with its lifespan run (models loaded and warmed)."""
    settings = settings_factory(max_body_bytes=1 << 20, max_activation_elements=100_000)
    with app_client(settings) as test_client:
        yield test_client


@pytest.fixture
def explicit(settings_factory: Callable[..., Settings]) -> Iterator[TestClient]:
    """A client of an app in explicit control mode, ``digits-mlp`` alone loaded at start."""
    settings = settings_factory(model_control_mode="explicit", load_models=["digits-mlp"])
    with app_client(settings) as test_client:
        yield test_client


@pytest.fixture
def repo(tmp_path: Path, model_repository: Path) -> Path:
    """A private copy of the test repository, free to change."""
    root = tmp_path / "repo"
    shutil.copytree(model_repository, root)
    return root


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classifier wide enough (a millisecond or so a run of 8) to build a queue behind it."""
    root = tmp_path_factory.mktemp("slow-repository")
    write_model(root, "slow", 1, hidden=1024, max_batch_size=8)
    return root
