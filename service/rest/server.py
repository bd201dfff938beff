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

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from service.rest.app import create_app
from service.rest.protocol import ConnectionLimits, guarded_protocol
from service.settings import Settings, load_settings

logger = logging.getLogger("gelu_serve")


def serve(host: str, port: int, workers: int, settings: Settings) -> None:
    """Serve the model repository on ``host:port`` with ``workers`` processes until SIGTERM or
    SIGINT; a graceful stop exits 0."""
    if workers == 1:
        server(host, port, settings).run()
        return
    supervise(host, port, workers, _worker)


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


def _worker(host: str, port: int, workers: int) -> None:
    """One worker process: its own socket on the shared port, one server on it."""
    sock = reuse_port_socket(host, port)
    server(host, port, load_settings(workers=workers)).run(sockets=[sock])


def http_options(settings: Settings) -> dict[str, Any]:
    """How the service's uvicorn serves HTTP: its protocol with the connection limits of
    ``settings`` (``service.rest.protocol``), no WebSockets, no access log or Server header."""
    return {
        "http": guarded_protocol(ConnectionLimits.from_settings(settings)),
        "ws": "none",
        "access_log": False,
        # The service logs no client address and decides nothing by one: uvicorn's rewriting
        # of them from X-Forwarded-* (a middleware around every request) is not needed.
        "proxy_headers": False,
        "server_header": False,
        "timeout_keep_alive": max(1, round(settings.keep_alive_seconds)),
    }


def server(host: str, port: int, settings: Settings) -> GracefulServer:
    """A uvicorn server of the app for ``settings``, with the service's connection limits; its
    gRPC face binds the same host unless GELU_GRPC_HOST says otherwise."""
    app = create_app(settings.model_copy(update={"grpc_host": settings.grpc_host or host}))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level,
        # A backstop: GracefulServer closes what is left at graceful_shutdown_seconds.
        timeout_graceful_shutdown=round(settings.graceful_shutdown_seconds) + 2,
        **http_options(settings),
    )
    return GracefulServer(
        config,
        app.state.dataplane.drain,
        settings.drain_seconds,
        settings.graceful_shutdown_seconds,
    )


class GracefulServer(uvicorn.Server):
    """uvicorn's server, stopping as an orchestrator expects.

    SIGTERM first drains: readiness turns 503 at once (``drain``) while requests are still
    served, for ``drain_seconds``, so load balancers and Kubernetes endpoints stop sending;
    then uvicorn's graceful shutdown stops accepting connections, lets in-flight and queued
    requests finish within ``graceful_seconds``, and connections still open then are closed
    (their requests cancelled as a departed client's, quietly). SIGINT, or a second SIGTERM,
    skips what is left of the drain. The process then exits 0: uvicorn re-raises the signal
    after a graceful stop (exit status 143 or 130), which orchestrators read as a crash.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Callable[[], None],
        drain_seconds: float,
        graceful_seconds: float,
    ) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_seconds = drain_seconds
        self._graceful_seconds = graceful_seconds
        self._drain_until: float | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        closing = loop.call_later(self._graceful_seconds, self._close_connections)
        try:
            await super().shutdown(sockets)
        finally:
            closing.cancel()

    def _close_connections(self) -> None:
        connections = list(self.server_state.connections)
        if connections:
            logger.warning(
                "graceful shutdown: %d connection(s) still open after %g s "
                "(GELU_GRACEFUL_SHUTDOWN_SECONDS): closing them",
                len(connections),
                self._graceful_seconds,
            )
        for connection in connections:
            connection.transport.close()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        draining = self._drain_until is not None
        if sig == signal.SIGTERM and not draining and self._drain_seconds and self.started:
            self._drain_until = time.monotonic() + self._drain_seconds
            self._drain()
            logger.info("SIGTERM: not ready; draining for %g s", self._drain_seconds)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            return True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, without raising the captured signal again once stopped."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
