"""The one private hook (``service.rest.protocol`` subclasses uvicorn's ``HttpToolsProtocol``)
holds only on the uvicorn release it was tested with: the pin and the installed release are
checked here, and any other release serves with uvicorn's own protocol, warning."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest
import uvicorn

from service.rest import protocol
from service.rest.server import http_options
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_pyproject_pins_the_tested_uvicorn() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in dependencies if re.match(r"uvicorn\b", d)]
    assert pins == [f"uvicorn[standard]=={protocol.TESTED_UVICORN}"]


def test_the_installed_uvicorn_is_the_tested_one() -> None:
    assert uvicorn.__version__ == protocol.TESTED_UVICORN, (
        f"uvicorn {uvicorn.__version__} is installed, but service/rest/protocol.py subclasses "
        f"the private HttpToolsProtocol of {protocol.TESTED_UVICORN}: read that release's "
        "httptools_impl.py against it, rerun tests/service/rest/test_limits.py, then move the "
        "pin in pyproject.toml and TESTED_UVICORN together"
    )
    assert protocol.supported()


def test_the_tested_uvicorn_serves_the_guarded_protocol(tmp_path: Path) -> None:
    options = http_options(Settings(model_repository=tmp_path, max_connections=7))
    assert issubclass(options["http"], protocol.GuardedHttpProtocol)
    assert options["http"].limits.max_connections == 7
    assert "limit_concurrency" not in options


def test_another_uvicorn_serves_uvicorns_own_protocol_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(protocol, "TESTED_UVICORN", "0.0.0")
    with caplog.at_level(logging.WARNING, logger="gelu_serve"):
        options = http_options(Settings(model_repository=tmp_path, max_connections=7))
    assert options["http"] == "httptools"
    assert options["limit_concurrency"] == 7
    assert "tested with uvicorn 0.0.0" in caplog.text
    assert "no header or body timeouts" in caplog.text
