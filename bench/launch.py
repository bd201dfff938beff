"""Launching what ``make bench`` measures: the service, the floors, the naive app and the peers
as real server processes, each pinned to its CPUs with every thread checked (``bench.proc``),
started in a rotating order and stopped with the run."""

from __future__ import annotations

import dataclasses
import http.client
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.arguments import ROOT
from bench.proc import cpu_list, pin_tree
from bench.results import SMALL
from bench.wrk import Request

SERVICE_APP = "service.rest.app:create_app"


# The servers' ports come from below the kernel's ephemeral range, where no client connection's
# local port (wrk's, another test's) can take one between its choice and the server's bind, and
# none is handed out twice in one process (the kernel may give a closed port 0 again).
LOWEST_PORT = 10_000
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port nothing listens on now, below the ephemeral range and new to this process."""
    try:
        ranges = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        first_ephemeral = int(ranges.split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768  # Linux's default
    while True:
        if first_ephemeral - LOWEST_PORT < 1000:  # no room below it: the kernel's choice
            port = 0
        else:
            port = LOWEST_PORT + secrets.randbelow(first_ephemeral - LOWEST_PORT)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it, its process, and the CPUs all its threads use."""

    url: str
    pid: int
    cpus: set[int]
    grpc: str | None = None  # host:port of its gRPC face, if it has one
    batches: bool = False  # the service: its /metrics counts the samples and runs of batches
    tls: ssl.SSLContext | None = None  # served over TLS: a context that trusts its certificate


def connection(port: int, tls: ssl.SSLContext | None, timeout: float = 2) -> Any:
    """An HTTP connection to a local server, over TLS with ``tls``."""
    if tls is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)


Scenario = tuple[str, Server, Request]  # a point's name, the server driven and the request


@contextmanager
def serve(
    command: list[str],
    env: dict[str, str],
    cpus: str,
    port: int,
    ready_path: str,
    settle: float,
    tls: ssl.SSLContext | None = None,
    root: Path = ROOT,
) -> Iterator[Server]:
    """``command`` on ``cpus`` with every thread pinned there, ready; SIGTERM on exit. It runs
    in ``root``: ``python -m`` imports that checkout's code.

    ``taskset`` pins the threads that exist at start; onnxruntime sets its thread pools'
    affinity itself, and servers start worker processes, so every thread of the process tree is
    pinned again once the server is ready (and checked before each point by ``measure``).
    """
    process = subprocess.Popen(
        ["taskset", "-c", cpus, *command], cwd=root, env={**os.environ, **env}
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}")
            conn = connection(port, tls)
            try:
                conn.request("GET", ready_path)
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            finally:
                # Left open, it would idle beside every point and, over TLS, hold up the
                # server's stop until its graceful shutdown gave up on it.
                conn.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command[0]} not ready")
            time.sleep(0.2)
        time.sleep(settle)  # let every worker finish its start-up
        pinned = cpu_list(cpus)
        pin_tree(process.pid, pinned)
        scheme = "https" if tls is not None else "http"
        yield Server(f"{scheme}://127.0.0.1:{port}", process.pid, pinned, tls=tls)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def server(
    app: str,
    env: dict[str, str],
    workers: int,
    cpus: str,
    ready_path: str,
    tls: ssl.SSLContext | None = None,
    root: Path = ROOT,
) -> Iterator[Server]:
    """A uvicorn process serving ``app`` from the checkout ``root`` (see ``serve``); the
    service itself runs as it is deployed, ``gelu-serve serve`` (uvicorn with the service's
    connection limits)."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "--factory", app, "--port", str(port),
        "--workers", str(workers), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    grpc_address = None
    if app == SERVICE_APP:
        command = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
        command += ["--workers", str(workers)]
        grpc_port = free_port()
        env = {**env, "GELU_GRPC_PORT": str(grpc_port)}
        grpc_address = f"127.0.0.1:{grpc_port}"
    with serve(command, env, cpus, port, ready_path, 0.5 * workers, tls, root) as started:
        yield dataclasses.replace(started, grpc=grpc_address, batches=app == SERVICE_APP)


def tls_setup(folder: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """A CA and a certificate for 127.0.0.1 made for the run (trustme, the [dev] extra):
    the service's GELU_TLS_* variables, and a client context that trusts it."""
    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, authority = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(authority))
    env = {"GELU_TLS_CERT_FILE": str(cert), "GELU_TLS_KEY_FILE": str(key)}
    return env, ssl.create_default_context(cafile=str(authority))


@contextmanager
def otlp_sink(port: int, cpus: str) -> Iterator[Server]:
    """``bench.otlp_sink`` on ``cpus`` (the client's): it answers the traced servers' exports
    while they are measured."""
    command = [sys.executable, "-m", "bench.otlp_sink", str(port)]
    with serve(command, {}, cpus, port, "/ready", settle=0) as started:
        yield started


@contextmanager
def floor_as_served(cpus: str, workers: int = 1) -> Iterator[Server]:
    """``bench.floor``'s HTTP floor with the service's own uvicorn protocol and options (and,
    with several workers, its own ``SO_REUSEPORT`` socket each, as the service's)."""
    port = free_port()
    command = [sys.executable, "-m", "bench.floor", "--http", str(port), str(workers)]
    with serve(command, {}, cpus, port, "/docs", settle=0.5 * workers) as started:
        yield started


@contextmanager
def grpc_floor(cpus: str) -> Iterator[Server]:
    """``bench.floor``'s gRPC floor on ``cpus``, answering (every thread pinned there)."""
    import grpc

    port = free_port()
    command = ["taskset", "-c", cpus, sys.executable, "-m", "bench.floor", str(port)]
    process = subprocess.Popen(command, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        pinned = cpu_list(cpus)
        pin_tree(process.pid, pinned)
        yield Server("", process.pid, pinned, address)
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def peers(model_file: Path, max_batch_size: int, cpus: str) -> Iterator[dict[str, Server]]:
    """MLServer and BentoML serving ``model_file`` on ``cpus``, by name."""
    from bench.peers.environments import bentoml_command, mlserver_command

    ml_port, bento_port = free_port(), free_port()
    side_ports = (free_port(), free_port())
    bento, bento_env = bentoml_command(model_file, bento_port, max_batch_size)
    with (
        mlserver_command(SMALL, model_file, ml_port, max_batch_size, side_ports) as (ml, ml_env),
        serve(ml, ml_env, cpus, ml_port, "/v2/health/ready", settle=1.0) as mlserver,
        serve(bento, bento_env, cpus, bento_port, "/readyz", settle=1.0) as bentoml,
    ):
        yield {"mlserver": mlserver, "bentoml": bentoml}


def ensure_models(repository: Path, large: bool) -> str:
    """Build the defaults (and the large model when its data is here); returns the large one."""
    from export.defaults import BENCH_MODEL, DEFAULT_MODELS, DefaultModel, build
    from models.data import FASHION_MNIST_DIR

    models: tuple[DefaultModel, ...] = DEFAULT_MODELS
    if large and not FASHION_MNIST_DIR.is_dir():
        print(
            f"{FASHION_MNIST_DIR} missing: the autoencoder stands in for the larger model "
            "(install Debian's dataset-fashion-mnist for the real one)"
        )
    elif large:
        models = (*DEFAULT_MODELS, BENCH_MODEL)
    build(repository, ROOT / "checkpoints", models)
    return BENCH_MODEL.name if BENCH_MODEL in models else "digits-autoencoder"


def start_order(count: int, round_index: int) -> list[int]:
    """Which of ``count`` servers pass ``round_index`` starts first, second, ...: each pass
    one later in a cycle, so that over the passes each server starts in each position alike.
    The two runs that started the service's servers afresh for each pass, always batching on,
    then off, then off again, read them slowest to fastest in that order at c=1 in both: on
    0.94x and 0.93x off, and off 0.94x the second batching-off server in both (V1, medians of
    five passes each, 2026-11-26). If the position a server starts in matters, no scenario
    always has the same one."""
    return [(round_index + i) % count for i in range(count)]


def started_in_turn(
    arguments: list[tuple[Any, ...]], round_index: int, stack: ExitStack
) -> list[Server]:
    """A server for each ``server`` arguments, started in pass ``round_index``'s order
    (``start_order``) and stopped with ``stack``; returned in the order given."""
    servers: dict[int, Server] = {}
    for i in start_order(len(arguments), round_index):
        servers[i] = stack.enter_context(server(*arguments[i]))
    return [servers[i] for i in range(len(arguments))]
