"""One harness for tests that start a real ``gelu-serve serve``: ports, start, probe, wait."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], T | None], timeout: float = 30, every: float = 0.1, what: str = ""
) -> T:
    """``check()``'s first truthy value, polled until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        time.sleep(every)


def get(port: int, path: str, timeout: float = 5) -> tuple[int, bytes]:
    """A plaintext GET on loopback: its status and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def running(
    repository: Path, **env: str
) -> AbstractContextManager[tuple[int, subprocess.Popen[str]]]:
    """``gelu-serve serve`` on a free port, ready; stopped with SIGTERM afterwards (if still
    running), its output checked for tracebacks."""
    return probed(repository, None, env)


@contextmanager
def probed(
    repository: Path,
    probe: Callable[[int], int] | None,
    env: dict[str, str],
    args: tuple[str, ...] = (),
    command: Callable[[int], list[str]] | None = None,
) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``running``, ready when ``probe(port)`` answers 200 (None: a plaintext GET of
    readiness); ``command(port)`` the server's command line instead of ``gelu-serve serve``
    with ``args``."""
    port = free_port()
    environment = {
        **os.environ,
        "GELU_MODEL_REPOSITORY": str(repository),
        "GELU_WARMUP_RUNS": "1",
        "GELU_DRAIN_SECONDS": "0",
        "GELU_GRPC_PORT": "0",
        **env,
    }
    argv = command(port) if command else [sys.executable, "-m", "cli", "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*argv, *args],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_ready(port, process, probe)
        yield port, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        process.output = output  # type: ignore[attr-defined]  # for tests that read the logs
        assert "Traceback" not in output, output


def wait_ready(
    port: int, process: subprocess.Popen[str], probe: Callable[[int], int] | None = None
) -> None:
    """Until ``probe(port)`` answers 200; fails at once if the server exits."""
    probe = probe or (lambda port: get(port, "/v2/health/ready")[0])

    def ready() -> bool:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            return probe(port) == 200
        except OSError:
            return False

    wait_until(ready, timeout=60, every=0.2, what="the server did not become ready")


def rss_bytes(pid: int) -> int:
    """A process's resident memory, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")
