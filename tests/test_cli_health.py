"""``gelu-serve health``: the probe passes the credentials its service asks of ``health``."""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import cli
from tests.servers import ROOT, probed

KEY = "a-long-enough-health-key"
TOKEN = "a-long-enough-control-token"


@contextmanager
def stub(required: tuple[str, str] | None) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A local server that answers 200 only to a request carrying ``required`` (name, value),
    as the service does for a restricted class; its port and the headers of each request."""
    seen: list[dict[str, str]] = []

    class Service(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            seen.append(headers)
            passes = required is None or headers.get(required[0]) == required[1]
            self.send_response(200 if passes else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def probe(port: int) -> int:
    """The probe's exit status, run in process with this environment's settings."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["health", "--port", str(port)])
    return int(exited.value.code or 0)


def test_a_restricted_health_class_gets_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"\n{KEY}\nanother-long-enough-key\n")
    groups = f"inference:x-api-key=x-{KEY};metrics,health:x-probe-key=file:{keys}"
    monkeypatch.setenv("GELU_RESTRICTED_API", groups)
    with stub(("x-probe-key", KEY)) as (port, seen):
        assert probe(port) == 0
    assert seen[0]["x-probe-key"] == KEY
    assert "x-api-key" not in seen[0]  # another class's key is not sent


def test_an_open_health_class_gets_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the control token nor another class's key goes to a class that is open."""
    monkeypatch.setenv("GELU_CONTROL_TOKEN", TOKEN)
    monkeypatch.setenv("GELU_RESTRICTED_API", f"inference:x-api-key={KEY}")
    with stub(None) as (port, seen):
        assert probe(port) == 0
    assert "authorization" not in seen[0] and "x-api-key" not in seen[0]


def test_a_key_the_service_would_refuse_fails_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GELU_RESTRICTED_API", f"health:x-api-key={KEY}")
    with stub(("x-api-key", "the-service-has-another-key")) as (port, _):
        assert probe(port) == 1


@pytest.mark.slow  # a real server
def test_the_probe_passes_a_service_whose_health_is_restricted(model_repository: Path) -> None:
    """README's "probes under TLS, mutual TLS and credentials": with every class restricted,
    the probe, given the service's settings, is answered 200; given another key, 401."""
    groups = {"GELU_RESTRICTED_API": f"health:x-api-key={KEY};inference,metadata:x-key=x-{KEY}"}

    def ready(port: int) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/v2/health/ready", headers={"x-api-key": KEY})
            return connection.getresponse().status
        finally:
            connection.close()

    def run_probe(port: int, env: dict[str, str]) -> int:
        return subprocess.run(
            [sys.executable, "-m", "cli", "health", "--port", str(port)],
            cwd=ROOT, env={**os.environ, **env}, capture_output=True, timeout=30,
        ).returncode  # fmt: skip

    with probed(model_repository, ready, groups) as (port, _):
        assert run_probe(port, groups) == 0
        assert run_probe(port, {"GELU_RESTRICTED_API": f"health:x-api-key=y-{KEY}"}) == 1
        assert run_probe(port, {"GELU_RESTRICTED_API": ""}) == 1
