"""deploy/kserve/: the InferenceService, validated offline against KServe's own types (the
kserve SDK's models, generated from KServe's OpenAPI), and for what KServe needs of it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ISVC = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"


def kserve_check(document: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """``tests/deploy/kserve_types.py`` on ``document``, in its own process (never import
    kserve here: see that module)."""
    if importlib.util.find_spec("kserve") is None:
        pytest.skip("kserve missing: the [dev] extra installs it")
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(document))
    done = subprocess.run(
        [sys.executable, "-m", "tests.deploy.kserve_types", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_the_inference_service_is_valid_for_kserve(tmp_path: Path) -> None:
    isvc = yaml.safe_load(ISVC.read_text())
    assert kserve_check(isvc, tmp_path) == (0, "ok\n")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    (container,) = isvc["spec"]["predictor"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PROTOCOL"] == "v2"  # how KServe knows a custom predictor's protocol
    assert env["GELU_MODEL_REPOSITORY"] == "/mnt/models"  # where STORAGE_URI lands
    assert container["name"] == "kserve-container"
    assert container["ports"][0]["name"] == "http1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda i: i["spec"]["predictor"].update(container={}), "unknown field"),
        (lambda i: i["spec"]["predictor"].update(minReplicas="one"), "not of type int"),
        (lambda i: i["spec"]["predictor"]["containers"][0].pop("name"), "name"),
        (lambda i: i["spec"]["predictor"]["containers"][0]["ports"][0].update(port=8), "unknown"),
    ],
)
def test_a_planted_error_in_the_inference_service_is_caught(
    change, message: str, tmp_path: Path
) -> None:
    isvc = yaml.safe_load(ISVC.read_text())
    change(isvc)
    code, output = kserve_check(isvc, tmp_path)
    assert code == 1 and message in output, output
