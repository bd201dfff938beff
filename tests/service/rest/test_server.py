"""``gelu-serve serve``: one process, or workers that each accept their own connections."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.host import STOPPED
from tests.servers import ROOT, free_port


def start(repository: Path, port: int, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "GELU_MODEL_REPOSITORY": str(repository),
        "GELU_WARMUP_RUNS": "1",
        "GELU_DRAIN_SECONDS": "0",
        "GELU_GRPC_PORT": "0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_port_in_use_is_one_clear_error(model_repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start(model_repository, port, "--workers", "2")
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert f"cannot bind 127.0.0.1:{port}: Address already in use" in output
    assert "Traceback" not in output


def tcp_connections(process) -> list:
    """A process's TCP connections (psutil 6 renamed ``connections``; kserve pins psutil 5)."""
    method = getattr(process, "net_connections", None) or process.connections
    return method("tcp")


def listening(pid: int, port: int) -> int:
    """How many of ``pid``'s children listen on ``port``."""
    import psutil

    return sum(
        any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in tcp_connections(child))
        for child in psutil.Process(pid).children()
    )


@pytest.mark.slow  # real worker processes
def test_workers_share_a_burst_of_connections_and_stop_cleanly(model_repository: Path) -> None:
    """A burst of new connections reaches both workers (each has its own SO_REUSEPORT
    socket), and SIGTERM stops the service cleanly."""
    import psutil

    port = free_port()
    process = start(model_repository, port, "--workers", "2")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                probe = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                probe.request("GET", "/v2/health/ready")
                ready = probe.getresponse().status == 200
                probe.close()
                if ready and listening(process.pid, port) == 2:  # both workers, not the first
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.2)
        connections = [http.client.HTTPConnection("127.0.0.1", port) for _ in range(32)]
        for connection in connections:
            connection.request("GET", "/v2/health/live")
            assert connection.getresponse().read() == b'{"live":true}'
        held = {
            child.pid: sum(
                c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
                for c in tcp_connections(child)
            )
            for child in psutil.Process(process.pid).children()
        }
        busy = [count for count in held.values() if count]
        assert len(busy) == 2 and sum(busy) == 32, held
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert output.count(STOPPED) == 2, output  # each worker's host stopped its faces and core
