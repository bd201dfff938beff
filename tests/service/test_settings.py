"""Settings: every GELU_* variable, checked at start-up and documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GELU_PROVIDERS", "CUDA, cpu")
    monkeypatch.setenv("GELU_STRICT_PROVIDERS", "true")
    monkeypatch.setenv("GELU_MODEL_REPOSITORY", "/srv/models")
    settings = Settings()
    assert settings.providers == ["cuda", "cpu"]
    assert settings.ort_providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert settings.strict_providers and settings.model_repository == Path("/srv/models")
    monkeypatch.setenv("GELU_PROVIDERS", "gpu")
    with pytest.raises(ValidationError, match=r"unknown execution provider\(s\) \['gpu'\]"):
        Settings()
    monkeypatch.setenv("GELU_PROVIDERS", "cpu")
    monkeypatch.setenv("GELU_MAX_BODY_BYTES", "-1")
    with pytest.raises(ValidationError, match="max_body_bytes"):
        Settings()


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in Settings.model_fields:
        assert f"`{Settings.variable(name)}`" in readme, name
