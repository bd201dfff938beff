"""The Dockerfiles pass hadolint and the compose file validates against the compose spec.

Building and running the image for real is docker/e2e.sh, which CI runs after the tests.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / name)
    if not Path(path).exists():
        pytest.skip(f"{name} missing: the [dev] extra installs it")
    return path


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / dockerfile)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_file_follows_the_compose_spec() -> None:
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
         str(ROOT / "docker-compose.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_declares_what_deployments_need() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["gelu-serve"]["healthcheck"]["test"][0] == "CMD"
    assert any(v.endswith(":/models") for v in services["gelu-serve"]["volumes"])
    loadtest = services["loadtest"]
    assert loadtest["profiles"] == ["loadtest"]
    assert loadtest["depends_on"]["gelu-serve"]["condition"] == "service_healthy"
    assert any(a.startswith("--run-time=") for a in loadtest["command"])  # bounded
    gpu = services["gelu-serve-gpu"]
    assert gpu["profiles"] == ["gpu"]
    device = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_serving_image_stage_holds_no_training_stack() -> None:
    text = (ROOT / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime") :]
    assert "COPY --from=venv /opt/venv /opt/venv" in runtime
    assert "torch" not in runtime and "[cpu,train]" not in runtime
    assert "USER 10001" in runtime and "HEALTHCHECK" in runtime
    assert ".[gpu,signing]" in (ROOT / "Dockerfile.cuda").read_text()


def test_e2e_waits_for_the_hosts_own_shutdown_line() -> None:
    """docker/e2e.sh judges a clean stop by the line the host logs once both faces and the
    core have stopped: the same words as service.host's, or CI fails on a clean stop."""
    from service.host import STOPPED

    assert f'grep -q "{STOPPED}"' in (ROOT / "docker" / "e2e.sh").read_text()


def test_compose_publishes_on_loopback_unless_told() -> None:
    """TorchServe CVE-2024-35199 (its gRPC ports open on every interface by default; fixed by
    binding container ports to localhost): the image listens on 0.0.0.0 inside its network,
    so compose's defaults publish HTTP and gRPC on 127.0.0.1 alone, every service."""
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = [p for s in compose["services"].values() for p in s.get("ports", [])]
    assert published
    for port in published:
        default = port.split(":-", 1)[1].split("}", 1)[0] if ":-" in port else port
        assert default.startswith("127.0.0.1:"), port
