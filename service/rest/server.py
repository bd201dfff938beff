"""Running the HTTP face: ``gelu-serve serve``, in one process or several.

With several workers, uvicorn's own ``--workers`` shares one listening socket between them and
each accepts whatever connections it wins; a burst of new connections (a load balancer's pool,
a load test) mostly lands on whichever worker woke first, and the others idle. Here each worker
binds its own socket to the same port with ``SO_REUSEPORT``, so the kernel spreads connections
across the workers evenly. The supervisor first claims the port with a bound, never-listening
socket (so a port already in use is one clear error before any worker starts), forwards
SIGTERM and SIGINT to the workers (each drains gracefully), and stops the whole service if a
worker dies on its own: the orchestrator (Docker's restart policy, Kubernetes) restarts it.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import sys
import threading

import uvicorn

APP = "service.rest.app:create_app"
logger = logging.getLogger("gelu_serve")


def serve(host: str, port: int, workers: int, log_level: str) -> None:
    """Serve ``APP`` on ``host:port`` with ``workers`` processes until SIGTERM or SIGINT."""
    if workers == 1:
        uvicorn.run(APP, factory=True, host=host, port=port, log_level=log_level, access_log=False)
        return
    try:
        claim = reuse_port_socket(host, port)
    except OSError as exc:
        sys.exit(f"cannot bind {host}:{port}: {exc.strerror}")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker, args=(host, port, log_level), name=f"worker-{i}")
        for i in range(workers)
    ]
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    for process in processes:
        process.start()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    died = None
    while not stopping.wait(0.5):
        died = next((p for p in processes if not p.is_alive()), None)
        if died is not None:
            logger.error("%s exited with %s: stopping the service", died.name, died.exitcode)
            break
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: uvicorn finishes in-flight requests, then exits
    for process in processes:
        process.join()
    claim.close()
    if died is not None:
        sys.exit(died.exitcode if died.exitcode and died.exitcode > 0 else 1)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (not listening yet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _worker(host: str, port: int, log_level: str) -> None:
    """One worker process: its own socket on the shared port, one uvicorn server on it."""
    sock = reuse_port_socket(host, port)
    config = uvicorn.Config(
        APP, factory=True, host=host, port=port, log_level=log_level, access_log=False
    )
    uvicorn.Server(config).run(sockets=[sock])
