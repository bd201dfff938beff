"""Settings: every GELU_* variable, checked at start-up and documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings, SettingsError, load_settings


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


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("GELU_CONTROL_TOKEN", "", "at least 16 characters (it is 0)"),
        ("GELU_CONTROL_TOKEN", "x", "at least 16 characters (it is 1)"),
        ("GELU_CONTROL_TOKEN", "fifteen-chars!!", "at least 16 characters (it is 15)"),
        ("GELU_RESTRICTED_API", "inference:x-api-key=Zq", "a key of inference has 2 characters"),
        (
            "GELU_RESTRICTED_API",
            "logging,trace:x-admin=a-long-enough-admin-key|short-admin-key",
            "a key of logging, trace has 15 characters",
        ),
    ],
)
def test_a_short_credential_stops_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, needle: str
) -> None:
    """Issue 62 item 11: an empty or one-character control token was accepted. A token or key
    under 16 characters is one line naming the variable, and never shows the value."""
    from service.settings import SettingsError, load_settings

    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"{variable}: ") and needle in message, message
    assert "\n" not in message
    for secret in value.split("=")[-1].split("|"):
        assert len(secret) < 2 or secret not in message, secret


def test_credentials_of_16_characters_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import load_settings

    monkeypatch.setenv("GELU_CONTROL_TOKEN", "0123456789abcdef")
    monkeypatch.setenv("GELU_RESTRICTED_API", "inference:x-api-key=fedcba9876543210")
    settings = load_settings()
    assert settings.control_token is not None and settings.restricted_api is not None


def test_serve_refuses_a_short_token_in_one_line(tmp_path: Path) -> None:
    """What an operator sees: `gelu-serve serve` exits at once, one line naming the variable."""
    from tests.servers import refusal

    done = refusal({"GELU_CONTROL_TOKEN": "x", "GELU_MODEL_REPOSITORY": str(tmp_path)})
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "GELU_CONTROL_TOKEN" in lines[0] and "16" in lines[0], lines


def test_pinned_models_fit_the_count() -> None:
    with pytest.raises(SettingsError, match="GELU_PINNED_MODELS names 2 models, more than"):
        load_settings(model_control_mode="on_demand", pinned_models="a,b", max_loaded_models=1)


def test_load_settings_names_each_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GELU_LOG_LEVEL", "loud")
    monkeypatch.setenv("GELU_MAX_BODY_BYTES", "lots")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert "GELU_LOG_LEVEL=loud" in str(error.value)
    assert "GELU_MAX_BODY_BYTES=lots" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_bad_spinning_value_stops_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GELU_OP_THREAD_SPINNING", "sometimes")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("GELU_OP_THREAD_SPINNING=sometimes: ") and "boolean" in message
    monkeypatch.setenv("GELU_OP_THREAD_SPINNING", "true")
    assert load_settings().op_thread_spinning
    monkeypatch.delenv("GELU_OP_THREAD_SPINNING")
    assert not load_settings().op_thread_spinning  # off unless asked


def test_serve_refuses_a_bad_spinning_value_in_one_line(tmp_path: Path) -> None:
    """What an operator sees: `gelu-serve serve` exits before loading anything, one line
    naming the variable and its value."""
    from tests.servers import refusal

    done = refusal({"GELU_OP_THREAD_SPINNING": "sometimes", "GELU_MODEL_REPOSITORY": str(tmp_path)})
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "GELU_OP_THREAD_SPINNING=sometimes" in lines[0], lines
