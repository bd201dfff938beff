"""The composition root: one serving core, and its faces started beside it as peers.

``Host(settings)`` builds the core (``DataPlane``), model control over it (``ModelControl``),
the HTTP face over both (``service.rest``) and, when ``GELU_GRPC_PORT`` names a port, the gRPC
face over both (``service.grpc``); neither face imports the other. ``Host.serve`` starts the
core, then the gRPC face and the HTTP face (uvicorn, ``GracefulServer``) side by side. On
SIGTERM the core drains (readiness 503 on both faces, gRPC health NOT_SERVING) for
GELU_DRAIN_SECONDS while both still serve; then both faces stop together, each letting its
calls finish within GELU_GRACEFUL_SHUTDOWN_SECONDS, and last the core lets its versions finish.
SIGINT, or a second SIGTERM, skips what is left of the drain. A refusal to start (the core's, or
a face's port in use) is one log line, and the process exits non-zero.

Where others host the app (Ray Serve, which runs its lifespan and hosts gRPC through its own
proxy; ``TestClient``; ``uvicorn --factory``), the app's own lifespan starts and stops the core
(``service.rest.app.create_app``); ``gelu-serve serve`` runs it without.

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

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import StartupError
from service.grpc.server import GrpcServer
from service.rest.app import ServiceApp, create_app
from service.rest.server import GracefulServer, http_server
from service.settings import Settings, load_settings

logger = logging.getLogger("gelu_serve")
# The exit status of a host that refuses to start, as uvicorn's for an app that does.
STARTUP_FAILURE = 3
STOPPED = "shutdown complete: both faces and the core stopped"


class Host:
    """The core for ``settings``, model control over it, and the faces over both; ``run``
    serves them until SIGTERM or SIGINT."""

    def __init__(self, settings: Settings, core: DataPlane | None = None) -> None:
        self.settings = settings
        self.core = core if core is not None else DataPlane(settings)
        self.control = ModelControl.over(self.core)
        self.app: ServiceApp = create_app(core=self.core, control=self.control)
        self.grpc: GrpcServer | None = None  # built as ``serve`` starts, when GELU_GRPC_PORT
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()  # a stop was asked for
        self._hurry = asyncio.Event()  # ... and what is left of the drain is skipped

    def server(self, host: str, port: int) -> GracefulServer:
        """uvicorn serving the HTTP face on ``host:port``, to be run by ``serve``."""
        return http_server(self.app, host, port, self.settings)

    def run(self, host: str, port: int, sockets: list[socket.socket] | None = None) -> None:
        """``serve`` on uvicorn's event loop (``sockets``: the HTTP face's, already bound)
        until SIGTERM or SIGINT; a graceful stop returns, a refusal to start exits non-zero."""
        http = self.server(host, port)
        try:
            with asyncio.Runner(loop_factory=http.config.get_loop_factory()) as runner:
                runner.run(self.serve(http, sockets))
        except StartupError:  # logged by the core as the one line that says why
            sys.exit(STARTUP_FAILURE)

    async def serve(self, http: GracefulServer, sockets: list[socket.socket] | None = None) -> None:
        """Start the core, then the gRPC face and ``http`` side by side; after ``stop`` (SIGTERM
        or SIGINT in the main thread), drain, stop both faces together, then the core."""
        self._loop = asyncio.get_running_loop()
        with self._signals_handled():
            async with self.core.running():
                if self._stopping.is_set():  # stopped while the models loaded
                    return
                self.grpc = self._grpc_face()
                if self.grpc is not None:
                    await self.grpc.start()
                stopping = asyncio.create_task(self._stop_faces(http))
                try:
                    await http.serve(sockets)  # until _stop_faces tells it to exit
                finally:
                    self._hurry.set()  # the HTTP face stopped: nothing is left to drain for
                    self._stopping.set()
                    await stopping
        logger.info(STOPPED)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop serving as on ``signum``, from any thread: SIGTERM drains first; SIGINT, or a
        second call, skips what is left of the drain."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stop, signum)

    def _stop(self, signum: int) -> None:
        if self._stopping.is_set() or signum != signal.SIGTERM:
            self._hurry.set()
        self._stopping.set()

    @contextlib.contextmanager
    def _signals_handled(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only: a test calls ``stop`` itself
            return
        loop = asyncio.get_running_loop()
        handled = (signal.SIGTERM, signal.SIGINT)
        for signum in handled:
            loop.add_signal_handler(signum, self._stop, signum)
        try:
            yield
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)

    def _grpc_face(self) -> GrpcServer | None:
        """The gRPC face, bound (``StartupError`` for a port in use), when GELU_GRPC_PORT."""
        settings = self.settings
        if not settings.grpc_port:
            return None
        address = f"{settings.grpc_host or '127.0.0.1'}:{settings.grpc_port}"
        return GrpcServer(self.core, self.control, address, share_port=settings.workers > 1)

    async def _stop_faces(self, http: GracefulServer) -> None:
        """Once a stop is asked for: readiness 503 on both faces (the core drains), for
        GELU_DRAIN_SECONDS unless hurried; then both faces stop, side by side."""
        await self._stopping.wait()
        settings = self.settings
        self.core.drain()  # HTTP readiness 503, gRPC health NOT_SERVING (``on_readiness``)
        if settings.drain_seconds and http.started and not self._hurry.is_set():
            logger.info("SIGTERM: not ready; draining for %g s", settings.drain_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.drain_seconds):
                    await self._hurry.wait()
        http.should_exit = True  # uvicorn's graceful shutdown, in ``serve``
        if self.grpc is not None:
            await self.grpc.stop(settings.graceful_shutdown_seconds)


def serve(host: str, port: int, workers: int, settings: Settings) -> None:
    """Serve the model repository on ``host:port`` with ``workers`` processes until SIGTERM or
    SIGINT; a graceful stop exits 0. The gRPC face binds the same host unless GELU_GRPC_HOST
    says otherwise."""
    if workers == 1:
        Host(_bind_grpc_beside(settings, host)).run(host, port)
        return
    supervise(host, port, workers, _worker)


def _bind_grpc_beside(settings: Settings, host: str) -> Settings:
    return settings.model_copy(update={"grpc_host": settings.grpc_host or host})


def _worker(host: str, port: int, workers: int) -> None:
    """One worker process: its own socket on the shared port, one host on it."""
    sock = reuse_port_socket(host, port)
    settings = _bind_grpc_beside(load_settings(workers=workers), host)
    Host(settings).run(host, port, sockets=[sock])


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
            process.terminate()  # SIGTERM: its host drains, stops its faces, then exits
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
