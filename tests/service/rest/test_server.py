"""``gelu-serve serve``: one process, or workers that each accept their own connections; a
stop fit for orchestrators (SIGTERM drains, no stalled upload or idle TLS connection holds it,
exit 0)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
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
        assert process.wait(timeout=300) == 0  # bounds the wait only
        # Relative to the limits: the drain and the graceful limit (2.5 s), not the upload's.
        assert time.monotonic() - began < float(env["GELU_BODY_TIMEOUT_SECONDS"]) / 10


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_graceful_stop_exits_0(model_repository: Path, signum: int) -> None:
    with running(model_repository) as (_, process):
        process.send_signal(signum)
        assert process.wait(timeout=20) == 0


@pytest.mark.slow
def test_an_idle_tls_connection_cannot_hold_shutdown(
    model_repository: Path, tmp_path: Path
) -> None:
    """Over TLS a stopping server's close of an idle keep-alive connection sends close_notify
    and waited for the client's, which a client between requests never sends: the stop took
    the whole graceful period. The client now gets the close_notify and the server exits well
    within that period, without its backstop."""
    trustme = pytest.importorskip("trustme")  # the [dev] extra
    ca, files = trustme.CA(), {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    issued = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(files["ca"]))
    files["cert"].write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(files["key"]))
    context = ssl.create_default_context(cafile=str(files["ca"]))
    graceful = 60.0
    env = {"GELU_TLS_CERT_FILE": str(files["cert"]), "GELU_TLS_KEY_FILE": str(files["key"]),
           "GELU_GRACEFUL_SHUTDOWN_SECONDS": str(graceful)}  # fmt: skip

    def live(port: int) -> tuple[int, ssl.SSLSocket]:
        """A GET of liveness over a kept-alive connection: the status and the connection."""
        sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=10),
            server_hostname="127.0.0.1",
            suppress_ragged_eofs=False,  # an end without close_notify raises
        )
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            answer += sock.recv(4096)
        return int(answer.split()[1]), sock

    def probe(port: int) -> int:
        status, sock = live(port)
        sock.close()
        return status

    with probed(model_repository, probe, env) as (port, process):
        status, idle = live(port)
        assert status == 200
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=graceful + 30) == 0
        took = time.monotonic() - began
        assert idle.recv(1) == b""  # close_notify, then the end
        idle.close()
    assert took < graceful / 4, took  # before: the graceful period, or the loop's 30 s
    assert "still open after" not in process.output, process.output  # type: ignore[attr-defined]
