"""``gelu-serve serve``: one process, or workers that each accept their own connections."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest

from service.host import STOPPED
from tests.servers import listening, probed, refusal, tcp_connections, wait_until


def test_a_port_in_use_is_one_clear_error(model_repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"GELU_MODEL_REPOSITORY": str(model_repository)}
        done = refusal(env, ("--workers", "2"), port=port)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"cannot bind 127.0.0.1:{port}: Address already in use" in output
    assert "Traceback" not in output


@pytest.mark.slow  # real worker processes
def test_workers_share_a_burst_of_connections_and_stop_cleanly(model_repository: Path) -> None:
    """A burst of new connections reaches both workers (each has its own SO_REUSEPORT
    socket), and SIGTERM stops the service cleanly."""
    import psutil

    with probed(model_repository, None, {}, ("--workers", "2")) as (port, process):
        both = "both workers listening, not the first alone"
        wait_until(lambda: listening(process.pid, port) == 2, timeout=60, every=0.2, what=both)
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
    output = process.output  # type: ignore[attr-defined]
    assert process.returncode == 0, output
    assert output.count(STOPPED) == 2, output  # each worker's host stopped its faces and core
