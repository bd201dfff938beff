"""The serving install never needs torch, and the service never imports it or ``models``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_serving_dependencies_hold_no_training_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serving = project["dependencies"] + project["optional-dependencies"]["cpu"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in serving}
    assert names.isdisjoint({"torch", "scikit-learn", "onnxscript", "tqdm"})
    assert "onnxruntime" in names
    assert project["optional-dependencies"]["gpu"][0].startswith("onnxruntime-gpu")
    assert any(d.startswith("torch==2.13.0") for d in project["optional-dependencies"]["train"])


def test_service_runs_with_torch_and_models_unimportable(model_repository: Path) -> None:
    script = f"""
import sys
sys.modules["torch"] = None  # any import of torch now raises ImportError
sys.modules["models"] = None
from fastapi.testclient import TestClient
from service.rest.app import create_app
from service.settings import Settings
with TestClient(create_app(Settings(model_repository={str(model_repository)!r}))) as client:
    response = client.post("/v1/models/digits-mlp:predict", json={{"instances": [[0.5] * 64]}})
    assert response.status_code == 200, response.text
    assert client.post("/v1/activations/gelu", json={{"data": [1.0]}}).status_code == 200
print("served")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "served" in result.stdout
