"""Start-up refusals: one clear line naming the variable or file at fault, no traceback."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from service.rest.app import create_app
from service.settings import SettingsError, load_settings
from tests.servers import ROOT, refusal

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _path() -> str:
    """The checkout first, then what this interpreter was given (a GPU host's packages)."""
    given = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(ROOT), given] if given else [str(ROOT)])


def serve(**env: str) -> subprocess.CompletedProcess[str]:
    """`gelu-serve serve` on a free port, in an environment of ``env`` alone (no variable of
    the test's own process); it is expected to refuse before serving."""
    return refusal(env, environ={"PATH": os.environ["PATH"], "PYTHONPATH": _path()})


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], needle: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if needle in line]
    assert len(errors) == 1, output


@pytest.mark.slow
def test_missing_repository_is_one_line(tmp_path: Path) -> None:
    result = serve(GELU_MODEL_REPOSITORY=str(tmp_path / "nowhere"))
    assert_one_line_refusal(result, "GELU_MODEL_REPOSITORY")
    assert "does not exist" in result.stderr


@pytest.mark.slow
def test_strict_provider_refusal_is_one_line(model_repository: Path) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: nothing to refuse")
    result = serve(
        GELU_MODEL_REPOSITORY=str(model_repository),
        GELU_PROVIDERS="cuda,cpu",
        GELU_STRICT_PROVIDERS="true",
    )
    assert_one_line_refusal(result, "GELU_STRICT_PROVIDERS=true")


@pytest.mark.slow
def test_traceback_only_at_debug_level(tmp_path: Path) -> None:
    result = serve(GELU_MODEL_REPOSITORY=str(tmp_path / "nowhere"), GELU_LOG_LEVEL="debug")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "StartupError" in result.stderr


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    result = serve(GELU_PROVIDERS="bogus", GELU_WARMUP_RUNS="-1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "GELU_PROVIDERS=bogus: unknown execution provider(s) ['bogus']" in lines[0]
    assert "GELU_WARMUP_RUNS=-1" in lines[0]


def test_load_settings_names_each_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GELU_LOG_LEVEL", "loud")
    monkeypatch.setenv("GELU_MAX_BODY_BYTES", "lots")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert "GELU_LOG_LEVEL=loud" in str(error.value)
    assert "GELU_MAX_BODY_BYTES=lots" in str(error.value)
    assert "\n" not in str(error.value)


def test_provider_fallback_is_logged_once(settings_factory, caplog) -> None:
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA: no fallback to observe")
    caplog.set_level(logging.WARNING, logger="gelu_serve")
    settings = settings_factory(providers=["cuda", "tensorrt", "cpu"])
    with TestClient(create_app(settings)) as client:
        assert client.get("/v2/health/ready").status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    # Four model versions and fourteen activation graphs, but one line per provider.
    assert len(warnings) == 2, warnings
    assert "CUDAExecutionProvider unavailable" in warnings[0]
    assert "TensorrtExecutionProvider unavailable" in warnings[1]
