"""One harness for every test that starts a server: ``gelu-serve serve`` in a process of its
own (``running``, ``probed``, ``serving``, ``grpc_server``), one that must refuse to start
(``refusal``, ``refusal_alone``), a host on a thread of the test's process (``on_thread``);
free ports, the probes (``get``, ``post``; raw HTTP over a socket of ``connect``) and waiting
(``wait_until``, ``wait_ready``)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from service.grpc.inference_pb2_grpc import GRPCInferenceServiceStub

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], T | None],
    timeout: float = 30,
    every: float = 0.1,
    what: str = "",
    detail: Callable[[], str] | None = None,
) -> T:
    """``check()``'s first truthy value, polled until ``timeout`` seconds have passed; else a
    failure naming ``what``, with ``detail()`` after it (a server's log, say) if given."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"not within {timeout} s: {what or check}"
            raise AssertionError(f"{message}; {detail()}" if detail else message)
        time.sleep(every)


def get(port: int, path: str, timeout: float = 5) -> tuple[int, bytes]:
    """A plaintext GET on loopback: its status and body."""
    return _request(port, "GET", path, None, {}, timeout)


def post(
    port: int,
    path: str,
    body: bytes = b"{}",
    headers: Mapping[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, bytes]:
    """A plaintext POST on loopback (JSON unless ``headers`` say otherwise): status and body."""
    given = {"Content-Type": "application/json", **(headers or {})}
    return _request(port, "POST", path, body, given, timeout)


def _request(
    port: int, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def connect(port: int) -> socket.socket:
    """A raw TCP connection to loopback ``port``, for requests written byte by byte."""
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_and_error(answer: bytes) -> tuple[int, str]:
    """The status of a raw HTTP answer, and its error body's message."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: str = "",
    content_type: str = "application/json",
) -> bytes:
    """An HTTP/1.1 request, as raw bytes, with ``headers`` (whole lines) after the length."""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


def listening(pid: int, port: int) -> int:
    """How many of ``pid``'s children listen on ``port`` (each worker of a server with its own
    SO_REUSEPORT socket, say)."""
    import psutil

    return sum(
        any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in tcp_connections(child))
        for child in psutil.Process(pid).children()
    )


def tcp_connections(process: Any) -> list:
    """A ``psutil.Process``'s TCP connections (psutil 6 renamed ``connections``; kserve pins
    psutil 5)."""
    method = getattr(process, "net_connections", None) or process.connections
    return method("tcp")


def environment(repository: Path | None, env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with the harness's defaults for a server over
    ``repository`` (one warm-up run, no drain, no gRPC face) and ``env`` over them."""
    defaults = {"GELU_WARMUP_RUNS": "1", "GELU_DRAIN_SECONDS": "0", "GELU_GRPC_PORT": "0"}
    if repository is not None:
        defaults["GELU_MODEL_REPOSITORY"] = str(repository)
    inherited = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return {**inherited, **defaults, **env}


def serve_command(port: int, *args: str) -> list[str]:
    """``gelu-serve serve`` on ``port``, as this interpreter runs it."""
    return [sys.executable, "-m", "cli", "serve", "--port", str(port), *args]


class Server(subprocess.Popen[str]):
    """A server's process whose output, standard error included, goes to a file: a pipe that
    nobody reads fills at 64 KiB, and the server's next write then blocks it (grpcio's core
    writes one line per call it refuses; a flood of such calls stalled its handshakes)."""

    def __init__(self, command: list[str], env: Mapping[str, str]) -> None:
        # Appending: the server writes at the end whatever this side has read.
        self.log = tempfile.TemporaryFile("a+", encoding="utf-8", errors="replace")  # noqa: SIM115  # closed by stop()
        super().__init__(command, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def text(self) -> str:
        """What the server has written so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self, timeout: float = 60) -> str:
        """SIGTERM (if still running), the wait for its exit, and all it wrote."""
        if self.poll() is None:
            self.send_signal(signal.SIGTERM)
        self.wait(timeout)
        output = self.text()
        self.log.close()
        return output


def start(
    repository: Path, port: int, env: Mapping[str, str], args: tuple[str, ...] = ()
) -> Server:
    """``gelu-serve serve`` on ``port`` over ``repository``, started (not waited for)."""
    return Server(serve_command(port, *args), environment(repository, env))


def refusal(
    env: Mapping[str, str],
    args: tuple[str, ...] = (),
    port: int = 0,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``gelu-serve serve`` with ``args`` on ``port``, expected to refuse to start, run to its
    end: ``env`` over ``environ`` (by default this process's environment as ``environment``
    makes it, without a repository)."""
    given = environment(None, {}) if environ is None else dict(environ)
    return subprocess.run(
        serve_command(port, *args), cwd=ROOT, env={**given, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def refusal_alone(**env: str) -> subprocess.CompletedProcess[str]:
    """``refusal`` in an environment of ``env`` alone, no variable of the test's own process:
    PATH, and PYTHONPATH with the checkout first, then what this interpreter was given (a GPU
    host's packages)."""
    given = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(ROOT), given] if given else [str(ROOT)])
    return refusal(env, environ={"PATH": os.environ["PATH"], "PYTHONPATH": path})


def running(
    repository: Path, **env: str
) -> AbstractContextManager[tuple[int, subprocess.Popen[str]]]:
    """``gelu-serve serve`` on a free port, ready; stopped with SIGTERM afterwards (if still
    running), its output checked for tracebacks."""
    return probed(repository, None, env)


@contextmanager
def serving(repository: Path, *args: str, **env: str) -> Iterator[int]:
    """``running`` with ``args``, yielding its port, and stopped cleanly: the host logged that
    it stopped both faces and the core (once per worker), and the process exited 0."""
    with probed(repository, None, env, args, clean_stop=True) as (port, _):
        yield port


@contextmanager
def probed(
    repository: Path,
    probe: Callable[[int], int] | None,
    env: Mapping[str, str],
    args: tuple[str, ...] = (),
    command: Callable[[int], list[str]] | None = None,
    clean_stop: bool = False,
) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``running``, ready when ``probe(port)`` answers 200 (None: a plaintext GET of
    readiness); ``command(port)`` the server's command line instead of ``gelu-serve serve``
    with ``args``; with ``clean_stop``, its stop checked as ``serving`` checks it. The output
    is on the process's ``output`` afterwards."""
    port = free_port()
    if command is None:
        process = start(repository, port, env, args)
    else:
        process = Server(command(port), environment(repository, env))
    try:
        wait_ready(port, process, probe)
        yield port, process
    finally:
        output = process.stop()
        process.output = output  # type: ignore[attr-defined]  # for tests that read the logs
        assert "Traceback" not in output, output
    if clean_stop:
        from service.host import STOPPED

        assert process.returncode == 0, output
        assert STOPPED in output, output


def wait_ready(
    port: int,
    server: subprocess.Popen[str] | threading.Thread,
    probe: Callable[[int], int] | None = None,
) -> None:
    """Until ``probe(port)`` answers 200 (None: a plaintext GET of readiness); fails at once
    if the server's process exits, or its thread ends."""
    check = probe or (lambda port: get(port, "/v2/health/ready")[0])

    def ready() -> bool:
        if isinstance(server, threading.Thread):
            assert server.is_alive(), "the server's thread ended while starting"
        else:
            assert server.poll() is None, server.text() if isinstance(server, Server) else ""
        try:
            return check(port) == 200
        except OSError:
            return False

    wait_until(ready, timeout=60, every=0.2, what="the server did not become ready")


def on_thread(
    run: Callable[[], object], port: int, probe: Callable[[int], int] | None = None
) -> threading.Thread:
    """``run()``, a server of ``port``, on a thread of this process, once ready (signals reach
    only the main thread: the test stops it through the server's own means)."""
    thread = threading.Thread(target=run)
    thread.start()
    wait_ready(port, thread, probe)
    return thread


@dataclass
class ServedFaces:
    """``gelu-serve serve`` with both faces: where each listens, and its process."""

    http_port: int
    grpc_port: int
    process: subprocess.Popen[str]

    @property
    def address(self) -> str:
        """The gRPC face's address, as a channel takes it."""
        return f"127.0.0.1:{self.grpc_port}"

    def stub(self) -> GRPCInferenceServiceStub:
        """A stub of the inference service on a channel of its own."""
        import grpc

        from service.grpc import inference_pb2_grpc as pb_grpc

        return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.address))

    def http_post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """A POST to the HTTP face: status and body."""
        return post(self.http_port, path, body, headers)


@contextmanager
def grpc_server(repository: Path, **env: str) -> Iterator[ServedFaces]:
    """``running`` with the gRPC face on a free port too, and a body limit (1 MiB, also the
    gRPC face's message limit) that a client can go past."""
    grpc_port = free_port()
    settings = {"GELU_GRPC_PORT": str(grpc_port), "GELU_MAX_BODY_BYTES": str(1 << 20), **env}
    with running(repository, **settings) as (port, process):
        yield ServedFaces(port, grpc_port, process)


def rss_bytes(pid: int) -> int:
    """A process's resident memory, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def answers(port: int, data: bytes) -> list[tuple[int, bytes]]:
    """Every answer to ``data`` written on one connection, until the server closes it: each
    status and body."""
    with connect(port) as sock:
        sock.sendall(data)
        received = read_all(sock)
    found = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(v) for k, _, v in (h.partition(b":") for h in lines[1:])
                      if k.strip().lower() == b"content-length")  # fmt: skip
        found.append((int(lines[0].split()[1]), rest[:length]))
        received = rest[length:]
    return found


def request_counts(port: int) -> dict[tuple[str, str], float]:
    """The server's ``gelu_requests_total`` by endpoint and code, read from ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = get(port, "/metrics")[1].decode()
    return {
        (sample.labels["endpoint"], sample.labels["code"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gelu_requests"
        for sample in family.samples
        if sample.name == "gelu_requests_total"
    }
