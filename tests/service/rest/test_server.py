"""``gelu-serve serve``: one process, or workers that each accept their own connections; a
stop fit for orchestrators (SIGTERM drains, no stalled upload holds it, exit 0)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from service.host import STOPPED
from tests.helpers import DIGITS
from tests.servers import (
    connect,
    get,
    listening,
    probed,
    refusal,
    request_bytes,
    running,
    tcp_connections,
    wait_until,
)

PREDICT = "/v1/models/digits-mlp:predict"
PREDICT_BODY = json.dumps({"instances": [DIGITS[0].tolist()]}).encode()


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


@pytest.mark.slow
def test_sigterm_drains_with_no_failure_among_accepted_requests(model_repository: Path) -> None:
    """Under load, SIGTERM: readiness turns 503 at once while requests are still served;
    after the drain new connections are refused; every request sent before the signal
    succeeds; the process exits 0."""
    env = {"GELU_DRAIN_SECONDS": "1.5", "GELU_GRACEFUL_SHUTDOWN_SECONDS": "5"}
    with running(model_repository, **env) as (port, process):
        signalled = threading.Event()
        before: list[int | str] = []  # outcomes of requests sent before the signal
        stop = threading.Event()

        def client() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            while not stop.is_set():
                sent_before = not signalled.is_set()
                try:
                    connection.request("POST", PREDICT, PREDICT_BODY)
                    response = connection.getresponse()
                    response.read()
                    outcome: int | str = response.status
                except (OSError, http.client.HTTPException) as exc:
                    outcome = type(exc).__name__
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    if signalled.is_set():
                        time.sleep(0.05)
                if sent_before:
                    before.append(outcome)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        signalled.set()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert get(port, "/v2/health/ready")[0] == 503  # at once, while still serving
        assert get(port, "/v2/health/live")[0] == 200
        code = process.wait(timeout=15)
        stop.set()
        for thread in threads:
            thread.join()
        assert code == 0
        assert len(before) > 50
        failed = [o for o in before if o != 200]
        assert not failed, f"{len(failed)} of {len(before)} accepted requests failed: {failed[:5]}"
        with pytest.raises(OSError):
            get(port, "/v2/health/live", timeout=2)


@pytest.mark.slow
def test_a_stalled_upload_cannot_hold_shutdown(model_repository: Path) -> None:
    env = {
        "GELU_BODY_TIMEOUT_SECONDS": "600",
        "GELU_DRAIN_SECONDS": "0.5",
        "GELU_GRACEFUL_SHUTDOWN_SECONDS": "2",
    }
    with running(model_repository, **env) as (port, process), connect(port) as sock:
        head = request_bytes("POST", PREDICT).replace(b"Length: 0", b"Length: 1000")
        sock.sendall(head + b'{"instances": [[')  # then nothing more
        time.sleep(0.3)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - began < 6  # the drain and the graceful limit, with slack


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_graceful_stop_exits_0(model_repository: Path, signum: int) -> None:
    with running(model_repository) as (_, process):
        process.send_signal(signum)
        assert process.wait(timeout=20) == 0
