"""Running the HTTP face on uvicorn: its options, and a server that stops as orchestrators
expect (``GracefulServer``). The host (``service.host``) gives it the app and runs it beside the
gRPC face, one per worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from service.rest.connection import ConnectionLimits
from service.settings import Settings
from service.tls import TlsFiles

logger = logging.getLogger("gelu_serve")

# How long an idle TLS connection closed at shutdown waits for its client's close_notify:
# clients between requests do not read, so they never answer it (see GracefulServer).
TLS_CLOSE_GRACE_SECONDS = 0.5


def http_options(settings: Settings) -> dict[str, Any]:
    """How the service's uvicorn serves HTTP: its protocol with the connection limits of
    ``settings`` (``service.rest.protocol``), no WebSockets, no access log or Server header.
    On a uvicorn other than the tested one, uvicorn's own protocol with its public limits."""
    return {
        **_protocol(settings),
        "ws": "none",
        "access_log": False,
        # The service logs no client address and decides nothing by one: uvicorn's rewriting
        # of them from X-Forwarded-* (a middleware around every request) is not needed.
        "proxy_headers": False,
        "server_header": False,
        "timeout_keep_alive": max(1, round(settings.keep_alive_seconds)),
        # uvicorn's own lines go to the root logger's handler, in GELU_LOG_FORMAT (one JSON
        # object per line when json) and as /v2/logging changes it, not in its own format.
        "log_config": None,
    }


def _protocol(settings: Settings) -> dict[str, Any]:
    try:
        from service.rest import protocol
    except ImportError as exc:  # a uvicorn whose private module moved
        reason = f"its protocol module cannot be imported ({exc})"
    else:
        if protocol.supported():
            limits = ConnectionLimits.from_settings(settings)
            return {"http": protocol.guarded_protocol(limits)}
        reason = f"the service was tested with uvicorn {protocol.TESTED_UVICORN}"
    logger.warning(
        "uvicorn %s: %s; serving with uvicorn's own protocol: at most GELU_MAX_CONNECTIONS "
        "connections and requests, GELU_KEEP_ALIVE_SECONDS, and no header or body timeouts "
        "or header limits (install the pinned uvicorn for them)",
        uvicorn.__version__,
        reason,
    )
    return {"http": "httptools", "limit_concurrency": settings.max_connections}


def http_server(app: Any, host: str, port: int, settings: Settings) -> GracefulServer:
    """A uvicorn server of ``app`` on ``host:port`` with the service's connection limits, run
    by the host (``service.host``), which starts and stops the core: the app's lifespan is off."""
    tls = TlsFiles.from_settings(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_level=settings.log_level,
        # A backstop: GracefulServer closes what is left at graceful_shutdown_seconds.
        timeout_graceful_shutdown=round(settings.graceful_shutdown_seconds) + 2,
        **http_options(settings),
        **(tls.uvicorn_options() if tls else {}),
        # uvicorn's --loop takes "module:factory": this one bounds TLS handshakes.
        loop=f"{__name__}:{HandshakeBoundedLoop.__name__}" if tls else "auto",
    )
    server = GracefulServer(config, settings.graceful_shutdown_seconds)
    server.tls = tls
    server.handshake_timeout = settings.header_timeout_seconds
    return server


try:  # uvicorn[standard] brings uvloop; plain asyncio where it cannot be installed
    from uvloop import Loop as _BaseLoop
except ImportError:  # pragma: no cover
    from asyncio import SelectorEventLoop as _BaseLoop  # type: ignore[assignment]


class HandshakeBoundedLoop(_BaseLoop):
    """uvicorn's event loop (uvloop), whose TLS servers time a stalled handshake out after
    ``handshake_timeout`` seconds. uvicorn passes no ``ssl_handshake_timeout`` to
    ``create_server``, so a client that stalls its handshake would hold a connection for the
    loop's default, 60 s. ``GracefulServer`` sets the bound before uvicorn creates its servers.
    """

    handshake_timeout: float | None = None

    async def create_server(  # type: ignore[override]  # forwards every overload as given
        self, *args: Any, **kwargs: Any
    ) -> asyncio.AbstractServer:
        if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
            kwargs["ssl_handshake_timeout"] = self.handshake_timeout
        return await super().create_server(*args, **kwargs)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, stopping as an orchestrator expects, run by the host.

    The host decides when it stops (``should_exit``, after SIGTERM's drain: ``service.host``)
    and handles the signals itself, so this server installs no handlers and never raises a
    signal again (uvicorn's does after a graceful stop: exit status 143 or 130, which
    orchestrators read as a crash). Stopping, uvicorn's graceful shutdown stops accepting
    connections and lets in-flight and queued requests finish within ``graceful_seconds``;
    connections still open then are closed (their requests cancelled as a departed client's,
    quietly). Replaced TLS certificate files are read again while serving.

    uvicorn closes the connections idle at shutdown at once; over TLS a close sends
    close_notify and then waits for the client's (the loop's ``ssl_shutdown_timeout``, 30 s)
    before the connection counts as gone, and a client between requests is not reading, so an
    idle keep-alive connection held the stop for the whole graceful period. Those connections
    are aborted ``TLS_CLOSE_GRACE_SECONDS`` after their close_notify went out (RFC 8446 6.1
    lets the closing side not wait for the reply); none of them has a response still being
    written.
    """

    def __init__(self, config: uvicorn.Config, graceful_seconds: float) -> None:
        super().__init__(config)
        self._graceful_seconds = graceful_seconds
        self.tls: TlsFiles | None = None  # read again when replaced, while serving
        self.handshake_timeout: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.tls is not None and self.config.ssl is not None:
            self.tls.serve_with(self.config.ssl)  # uvicorn's, from the files: TLS 1.2 and up
            loop = asyncio.get_running_loop()
            if isinstance(loop, HandshakeBoundedLoop):
                loop.handshake_timeout = self.handshake_timeout
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        closing = loop.call_later(self._graceful_seconds, self._close_connections)
        # Before uvicorn's shutdown closes them (no await in between: no request can start).
        idle = [c for c in self.server_state.connections if _idle(c)] if self.config.is_ssl else []
        aborting = loop.call_later(TLS_CLOSE_GRACE_SECONDS, self._abort, idle)
        try:
            await super().shutdown(sockets)
        finally:
            closing.cancel()
            aborting.cancel()

    def _abort(self, idle: list[Any]) -> None:
        """Abort those of ``idle`` (closed with close_notify at shutdown) still open."""
        for connection in idle:
            if connection in self.server_state.connections:
                connection.transport.abort()

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
            transport = connection.transport
            # A TLS connection already closing waits for its client's close_notify: abort.
            transport.abort() if transport.is_closing() else transport.close()

    async def on_tick(self, counter: int) -> bool:
        # uvicorn ticks every 0.1 s: replaced certificate files are looked for every second.
        if self.tls is not None and self.config.ssl is not None and counter % 10 == 0:
            self.tls.reload()
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """None: the host that runs this server handles SIGTERM and SIGINT."""
        yield


def _idle(connection: Any) -> bool:
    """Whether ``connection`` is between requests, as uvicorn's shutdown tells (it closes these
    at once), with nothing of its last response held back for a slow reader."""
    cycle, flow = getattr(connection, "cycle", None), getattr(connection, "flow", None)
    idle = cycle is None or cycle.response_complete
    return bool(idle and not (flow is not None and flow.write_paused))
