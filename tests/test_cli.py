"""The command line: --help for every subcommand, one clear line for each bad input, and the
``health`` probe passing the credentials its service asks of ``health``."""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

import cli
from cli import SUBCOMMANDS
from tests.servers import probed, refusal_alone

ROOT = Path(__file__).resolve().parents[1]
# One option each subcommand's --help must list: its own, not argparse's.
OPTIONS = {
    "train": "--threads",
    "export": "--max-batch-size",
    "models": "--table",
    "paper": "--full",
    "serve": "--workers",
    "health": "--path",
    "bench": "--concurrency",
    "tune": "--p99-budget-ms",
}
RUN_CLI = "import cli; cli.main(sys.argv[1:])"
NO_TORCH = f"import sys; sys.modules['torch'] = None; {RUN_CLI}"
# Options are declared in light modules: a mistaken one is refused before any of these loads.
HEAVY = ("torch", "sklearn", "onnx", "onnxruntime", "fastapi", "grpc")
LIGHT = f"import sys; sys.modules.update(dict.fromkeys({HEAVY})); {RUN_CLI}"
# Credentials of the `health` probe's tests.
KEY = "a-long-enough-health-key"
TOKEN = "a-long-enough-control-token"


def gelu_serve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_subcommand_has_help_without_torch(command: str) -> None:
    # torch made unimportable: --help must not need it.
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH, command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: gelu-serve " + command in result.stdout
    assert OPTIONS[command] in result.stdout


def test_no_subcommand_prints_usage_listing_every_subcommand() -> None:
    result = gelu_serve()
    assert result.returncode == 2
    assert "{train,export,models,paper,serve,health,bench,tune}" in result.stdout
    assert set(OPTIONS) == set(SUBCOMMANDS)


def _one_error_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ("train", "--activation", "swish", "--out", "x.pt"),
            "--activation: invalid choice: 'swish'",
        ),
        (("train", "--arch", "rnn", "--out", "x.pt"), "--arch: invalid choice: 'rnn'"),
        (("train", "--epochs", "0", "--out", "x.pt"), "--epochs: must be at least 1, got 0"),
        (("train", "--batch-size", "x", "--out", "x.pt"), "expected a whole number, got 'x'"),
        (("train",), "the following arguments are required: --out"),
        (("paper", "--activations", "gelu,swish"), "unknown activation 'swish'; choose one of"),
        (("paper", "--lr-epochs", "0"), "--lr-epochs: must be at least 1"),
        (("tune", "digits-mlp"), "the following arguments are required: --p99-budget-ms"),
    ],
)
def test_mistaken_options_are_refused_before_anything_heavy_is_imported(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    # torch, onnx and the web stack made unimportable: the refusal is instant.
    result = subprocess.run(
        [sys.executable, "-c", LIGHT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    _one_error_line(result, needle)
    assert result.stderr.startswith(f"gelu-serve {args[0]}: error: ")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    out = str(tmp_path / "x.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"garbage")
    repo = tmp_path / "repo2"
    export = ("export", str(checkpoints["mlp"]), "--name", "m", "--repository", str(repo),
              "--version", "1")  # fmt: skip
    # independent commands, each seconds of imports: run at once
    with ThreadPoolExecutor(8) as pool:
        exported = pool.submit(gelu_serve, *export)
        refused = [(pool.submit(gelu_serve, *args), needle) for args, needle in [
            (("train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "no"),
              "--out", out), "does not exist"),
            (("export", str(corrupt), "--name", "m", "--repository", str(tmp_path / "repo")),
             "not a readable checkpoint"),
            (("train", "--out", str(checkpoints["mlp"])), "exists; pass --overwrite"),
        ]]  # fmt: skip
        for result, needle in refused:
            _one_error_line(result.result(), needle)
        assert exported.result().returncode == 0
    _one_error_line(gelu_serve(*export), "exists")
    assert not (tmp_path / "x.pt").exists()


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    result = refusal_alone(GELU_PROVIDERS="bogus", GELU_WARMUP_RUNS="-1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "GELU_PROVIDERS=bogus: unknown execution provider(s) ['bogus']" in lines[0]
    assert "GELU_WARMUP_RUNS=-1" in lines[0]


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
