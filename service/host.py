"""The composition root: one serving core, and its faces started beside it as peers.

``Host(settings)`` builds the core (``DataPlane``), the HTTP face over it (``service.rest``)
and, when ``GELU_GRPC_PORT`` names a port, the gRPC face (``service.grpc``). Its lifespan
starts the core, then the gRPC face; uvicorn runs it as the HTTP app's lifespan, so the HTTP
face accepts requests only once the core is ready, and on SIGTERM (after the drain) the faces
stop first, then the core lets its versions finish. ``gelu-serve serve``, the image and the Ray
deployment all build a ``Host``; neither face imports the other.

``serve`` runs a host per worker process. With several workers, uvicorn's own ``--workers``
shares one listening socket between them and each accepts whatever connections it wins; a
burst of new connections mostly lands on whichever worker woke first. Here each worker binds
its own socket to the same port with ``SO_REUSEPORT``, so the kernel spreads connections
evenly. The supervisor first claims the port with a bound, never-listening socket (a port in
use is one clear error before any worker starts), forwards SIGTERM and SIGINT to the workers
(each drains gracefully), and stops the whole service if a worker dies on its own: the
orchestrator (Docker's restart policy, Kubernetes) restarts it.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from service.dataplane import DataPlane
from service.grpc.server import GrpcServer
from service.rest.app import ServiceApp, create_app
from service.rest.server import GracefulServer, http_server
from service.settings import Settings, load_settings

logger = logging.getLogger("gelu_serve")


class Host:
    """The core for ``settings`` and its faces; ``lifespan`` starts and stops them in order."""

    def __init__(self, settings: Settings, core: DataPlane | None = None) -> None:
        self.settings = settings
        self.core = core if core is not None else DataPlane(settings)
        self.grpc: GrpcServer | None = None
        self.app: ServiceApp = create_app(core=self.core, lifespan=self.lifespan)

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """The core started, then the gRPC face; on leaving, the gRPC face lets its calls
        finish within GELU_GRACEFUL_SHUTDOWN_SECONDS, then the core stops."""
        settings = self.settings
        async with self.core.running():
            if settings.grpc_port:
                address = f"{settings.grpc_host or '127.0.0.1'}:{settings.grpc_port}"
                self.grpc = GrpcServer(self.core, address, share_port=settings.workers > 1)
                await self.grpc.start()
            try:
                yield
            finally:
                if self.grpc is not None:
                    await self.grpc.stop(settings.graceful_shutdown_seconds)

    def server(self, host: str, port: int) -> GracefulServer:
        """uvicorn serving the HTTP face on ``host:port``, with this host's lifespan."""
        return http_server(self.app, host, port, self.settings, self.core.drain)


def serve(host: str, port: int, workers: int, settings: Settings) -> None:
    """Serve the model repository on ``host:port`` with ``workers`` processes until SIGTERM or
    SIGINT; a graceful stop exits 0. The gRPC face binds the same host unless GELU_GRPC_HOST
    says otherwise."""
    if workers == 1:
        Host(_bind_grpc_beside(settings, host)).server(host, port).run()
        return
    supervise(host, port, workers, _worker)


def _bind_grpc_beside(settings: Settings, host: str) -> Settings:
    return settings.model_copy(update={"grpc_host": settings.grpc_host or host})


def _worker(host: str, port: int, workers: int) -> None:
    """One worker process: its own socket on the shared port, one host on it."""
    sock = reuse_port_socket(host, port)
    settings = _bind_grpc_beside(load_settings(workers=workers), host)
    Host(settings).server(host, port).run(sockets=[sock])


def supervise(host: str, port: int, workers: int, worker: Callable[[str, int, int], None]) -> None:
    """Run ``worker(host, port, workers)`` in ``workers`` spawned processes, each serving on
    its own ``reuse_port_socket(host, port)``, until SIGTERM or SIGINT (forwarded to them as
    SIGTERM) or until one dies (then the rest are stopped and this exits non-zero)."""
    try:
        claim = reuse_port_socket(host, port)
    except OSError as exc:
        sys.exit(f"cannot bind {host}:{port}: {exc.strerror}")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=worker, args=(host, port, workers), name=f"worker-{i}")
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
