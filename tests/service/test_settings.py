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


ROOT = Path(__file__).resolve().parents[2]


def test_the_settings_page_is_generated_from_settings() -> None:
    from contract.readme import block
    from service.settings import REFERENCE_BLOCK, reference

    page = (ROOT / "docs" / "settings.md").read_text()
    assert block(page, REFERENCE_BLOCK) == reference(), "run `make settings-doc`"
    for name in Settings.model_fields:
        assert f"`{Settings.variable(name)}`" in page, name


def test_the_readmes_settings_defaults_are_the_codes() -> None:
    import re

    from service.settings import reference

    generated = dict(re.findall(r"^\| (`[A-Z_]+`) \| (`[^`]*`) \|", reference(), flags=re.M))
    quoted = re.findall(r"^\| (`GELU_[A-Z_]+`) \| (`[^`]*`) \|", (ROOT / "README.md").read_text(),
                        flags=re.M)  # fmt: skip
    assert len(quoted) >= 5
    for variable, default in quoted:
        assert generated[variable] == default, variable
