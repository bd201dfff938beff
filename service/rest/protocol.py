"""HTTP/1.1 connections with limits: uvicorn's httptools protocol, guarded against clients that
hold connections, headers or bodies without end.

uvicorn bounds none of these itself: a new connection that never sends a request stays open
(its keep-alive timer starts only after a first response), a request may trickle its headers
or body forever, and header size and count are unlimited. ``GuardedHttpProtocol`` adds, each
from a ``GELU_*`` setting (``ConnectionLimits``):

- at most ``max_connections`` open connections per process (one more: 503 and closed);
- an idle connection, new or between requests, closed after ``keep_alive_seconds``;
- a request's headers complete within ``header_timeout_seconds`` of its first byte, its body
  within ``body_timeout_seconds`` of its headers (else 408 and closed);
- at most ``max_header_bytes`` of request line and headers and ``max_headers`` fields (431).

It also settles what a lost connection means for its request. A client that half-closes
(sends its whole request, then shuts its write side) still gets its answer. A connection that is
lost (reset, or closed by a timeout above) cancels its request's task, so work queued for a
client that has gone is dropped instead of run; the scope's ``CLIENT_GONE`` key tells the app
that this cancellation is not a shutdown's.

Savings on every request: a response's head goes out with its body's first write
(``_HeadWithBody``), and a request body's pieces are handed on as they came (``_Pieces``). A
large body framed by Content-Length is read by the kernel straight into the ``bytes`` the app is
handed (``_BodyReader``), not copied piece by piece by the event loop, the parser and the route.
"""

from __future__ import annotations

import asyncio
import ctypes
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service import codecs
from service.rest.middleware import CLIENT_GONE
from service.settings import Settings

REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold, from the settings of the same names."""

    max_connections: int
    keep_alive_seconds: float
    header_timeout_seconds: float
    body_timeout_seconds: float
    max_header_bytes: int
    max_headers: int
    max_body_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        """The limits ``settings`` name."""
        return cls(
            max_connections=settings.max_connections,
            keep_alive_seconds=settings.keep_alive_seconds,
            header_timeout_seconds=settings.header_timeout_seconds,
            body_timeout_seconds=settings.body_timeout_seconds,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            max_body_bytes=settings.max_body_bytes,
        )


class _Refusal(Exception):
    """Raised in a parser callback to refuse the request with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``limits``; see the module's docstring. Build the
    class for a set of limits with ``guarded_protocol``."""

    limits: ConnectionLimits
    sweeper: asyncio.Task[None] | None = None  # one per server (class), see _sweep

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # When the current phase (headers, body) must be over, in loop time; checked by the
        # sweeper (per-request timers cost more than the checks: see ``_sweep``).
        self._deadline: float | None = None
        self._deadline_phase: tuple[float, str, str] = (0.0, "", "")
        self._reading_headers = False
        self._unparsed_bytes = 0  # received while the headers are incomplete
        self._chunk_bytes = 0  # in the data being parsed
        self._task: asyncio.Task[None] | None = None  # the current request's
        # Whether _read_rest_of_body is still to decide, once per request, who reads the rest
        # of its body: set by the request's headers, cleared by the decision or the request's end.
        self._body_undecided = False
        self._body_bytes = 0  # of the current request's body, parsed so far
        self._writer: _HeadWithBody | None = None  # what the current request's answer goes to

    # ---- connection ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "too many open connections; try again shortly", retry_after=1)
            return
        # uvicorn arms its keep-alive timer only after a response: a connection that never
        # sends a request would stay open. Its first byte disarms this (data_received).
        self.timeout_keep_alive_task = self.loop.call_later(
            self.limits.keep_alive_seconds, self.timeout_keep_alive_handler
        )
        cls = type(self)
        if cls.sweeper is None or cls.sweeper.done():
            cls.sweeper = self.loop.create_task(_sweep(self.connections))

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """A half-close: with a whole request received and not yet answered, keep the
        transport to answer it, then close; otherwise (idle, or a body that can now never
        arrive) let the transport close, which cancels the request."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            cycle.keep_alive = False
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline = None
        cycle, task = self.cycle, self._task
        gone = cycle is not None and not cycle.response_complete
        super().connection_lost(exc)
        if gone and task is not None and not task.done():
            assert cycle is not None
            cycle.scope[CLIENT_GONE] = True  # type: ignore[literal-required]
            task.cancel()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self._chunk_bytes = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, _Refusal):
                self._refuse(refusal.status, refusal.message)
            else:
                raise
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            self._refuse(400, f"invalid HTTP request: {exc}")
            return
        if self._reading_headers:  # the parser holds what it has not finished: bound it
            self._unparsed_bytes += len(data)
            if self._unparsed_bytes > self.limits.max_header_bytes:
                self._refuse(431, self._header_limit_message())
        elif self._body_undecided and not self.pipeline:
            self._body_undecided = False
            self._read_rest_of_body()

    def _read_rest_of_body(self) -> None:
        """Have the rest of a large body framed by Content-Length read into the ``bytes`` the
        app will be handed, after what the app has not read yet of it (``_BodyReader``); the
        app then gets the body in one message. A smaller, chunked or over-limit body stays
        with the parser (an over-limit one is refused by the app, by its Content-Length)."""
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)  # digits: the parser has checked them
            elif name == b"transfer-encoding":
                return
        cycle: Any = self.cycle
        if length is None or length > self.limits.max_body_bytes or cycle.response_complete:
            return
        rest = length - self._body_bytes
        if rest < DIRECT_BODY_BYTES:
            return
        unread = bytes(cycle.body)
        try:
            body, storage = _unfilled_bytes(len(unread) + rest)
        except MemoryError:  # not now: the parser reads it as it comes
            return
        storage[: len(unread)] = unread
        cycle.body = bytearray()
        cycle.message_event.clear()  # nothing to read until the body is whole
        self.transport.set_protocol(_BodyReader(self, body, storage, len(unread)))

    def body_read(self, body: bytes) -> None:
        """The ``_BodyReader`` has read the whole body: hand it to the app as the request's
        last message, and parse the next request with a new parser (this one is still inside
        the body it did not see)."""
        self.transport.set_protocol(self)
        cycle: Any = self.cycle
        if not cycle.response_complete:
            pieces = cycle.body = _Pieces()
            pieces += body
        self.parser = self._new_parser()
        self.on_message_complete()

    def _new_parser(self) -> httptools.HttpRequestParser:
        parser = httptools.HttpRequestParser(self)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        return parser

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # As uvicorn's, keeping the task: a lost connection cancels it.
        writer = self._writer
        if writer is None:
            writer = self._writer = _HeadWithBody(self.transport)
        writer.answer(cycle)
        cycle.transport = writer
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._task = task

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()  # a response without a body write (HEAD) has its head held
        super().on_response_complete()

    # ---- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._unparsed_bytes = 0
        self._body_bytes = 0
        self._arm(self.limits.header_timeout_seconds, "headers", "GELU_HEADER_TIMEOUT_SECONDS")

    def on_headers_complete(self) -> None:
        # Counted once the headers are parsed, not per header (a Python call per header costs
        # more than this pass); a flood of header bytes is bounded earlier, in data_received.
        limits, headers = self.limits, self.headers
        if len(headers) > limits.max_headers:
            raise _Refusal(431, f"more than {limits.max_headers} headers (GELU_MAX_HEADERS)")
        # The headers came in the data received since they began: when that is within the
        # limit, so are they, and they need not be summed (a small request's usual case).
        if self._unparsed_bytes + self._chunk_bytes > limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in headers)
            if size > limits.max_header_bytes:
                raise _Refusal(431, self._header_limit_message())
        self._reading_headers = False
        self._body_undecided = True
        self._arm(limits.body_timeout_seconds, "body", "GELU_BODY_TIMEOUT_SECONDS")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle.body) is not _Pieces:  # uvicorn's bytearray: a new cycle, or after a read
            cycle.body = _Pieces()
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._deadline = None
        self._body_undecided = False
        super().on_message_complete()

    # ---- refusals ------------------------------------------------------------------------------

    def _arm(self, seconds: float, what: str, variable: str) -> None:
        self._deadline = self.loop.time() + seconds
        self._deadline_phase = (seconds, what, variable)  # the message is built if it is needed

    def check_deadline(self, now: float) -> None:
        """Refuse the request (408) if its current phase is past its deadline."""
        if self._deadline is not None and now > self._deadline:
            seconds, what, variable = self._deadline_phase
            self._refuse(
                408, f"the request's {what} did not arrive within {seconds:g} s ({variable})"
            )

    def _header_limit_message(self) -> str:
        return (
            f"request line and headers above {self.limits.max_header_bytes} bytes "
            "(GELU_MAX_HEADER_BYTES)"
        )

    def _refuse(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Answer ``status`` with the one error body (unless a response has started), then
        close the connection."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            body = codecs.dumps({"error": message})
            lines = [
                b"HTTP/1.1 %d %s" % (status, REASONS[status]),
                b"content-type: application/json",
                b"content-length: %d" % len(body),
                b"connection: close",
            ]
            if retry_after is not None:
                lines.append(b"retry-after: %d" % retry_after)
            self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self.transport.close()


# A body up to this size is joined to its head (a copy costs less than a vectored write's set-up).
JOIN_BYTES = 64 * 1024


class _Pieces:
    """A request body's pieces as they arrive, in place of uvicorn's bytearray (its cycle's
    ``body``, which the protocol extends with ``+=``, measures with ``len`` and hands to the app
    as ``bytes(body)``). The bytearray copies each piece in and out again: two copies of every
    body, 4 MB each for a 1e6-value activation request. Here a piece is kept as it came, and
    handed on as it is when it is the only one, joined otherwise."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def __iadd__(self, piece: bytes) -> _Pieces:
        self.pieces.append(piece)
        self.size += len(piece)
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        pieces = self.pieces
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


# A body with at least this much left to arrive after its headers' read is read by _BodyReader
# (below it, the read's set-up costs more than the copies it saves).
DIRECT_BODY_BYTES = 64 * 1024

# The C API's own way to fill a bytes object (as socket.recv does): create it uninitialised,
# write into its buffer, and only then hand it to anyone. Its documentation allows modifying
# that buffer exactly then: https://docs.python.org/3/c-api/bytes.html#c.PyBytes_AsString
_new_bytes = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
    ("PyBytes_FromStringAndSize", ctypes.pythonapi)
)
_bytes_buffer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
    ("PyBytes_AsString", ctypes.pythonapi)
)


def _unfilled_bytes(size: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``size`` uninitialised bytes and a writable view of them. Keep the
    ``bytes`` referenced while the view is used, and hand it on only once it is filled."""
    body: bytes = _new_bytes(None, size)
    storage = (ctypes.c_char * size).from_address(_bytes_buffer(body))
    return body, memoryview(storage).cast("B")


class _BodyReader(asyncio.BufferedProtocol):
    """The rest of a request body, read by the kernel straight into the ``bytes`` the app will
    be handed (``storage`` is its buffer), from ``filled`` on. While the body arrives this is
    the transport's protocol (uvloop reads into the buffer a buffered protocol gives it); then
    the HTTP protocol is again (``body_read``).

    The kernel's copy is then the only one. Through the parser, every piece of a large body is
    copied three more times, all on the event loop: by uvloop, into a new ``bytes`` per read;
    by the parser, into another per body piece; and by the route, joining the pieces (stock
    uvicorn adds two, see ``_Pieces``). The storage ends where the body does, so a pipelined
    request after it is read by the parser.
    """

    __slots__ = ("body", "filled", "http", "storage")

    def __init__(
        self, http: GuardedHttpProtocol, body: bytes, storage: memoryview, filled: int
    ) -> None:
        self.http = http
        self.body = body  # keeps the storage alive
        self.storage = storage
        self.filled = filled

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.storage[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.body):
            self.http.body_read(self.body)

    # The connection's other events are the HTTP protocol's, but for the end of the client's
    # input: mid-body, its request can never complete, and the default, closing the
    # connection, is what the HTTP protocol would do (the loss then cancels the request).
    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()


class _HeadWithBody:
    """The transport a connection's responses are written to: a response's head (status line
    and headers) is held until its body's first write and goes out with it, in one write.

    uvicorn writes them apart, as two send(2) system calls and two TCP segments; a small
    response then costs one of each instead. Any other write (``100 Continue`` before a
    response starts) passes through, and the head is written by itself if the response
    completes without a body write (HEAD) or the connection closes first.
    """

    __slots__ = ("cycle", "head_due", "held", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.cycle: Any = None  # the request-response cycle being answered
        self.head_due = False  # its head is not written yet
        self.held: bytes | None = None

    def answer(self, cycle: Any) -> None:
        """Write ``cycle``'s response from now on (the connection's cycles run one at a time)."""
        self.flush()
        self.cycle, self.head_due = cycle, True

    def write(self, data: bytes) -> None:
        if self.head_due and self.cycle.response_started:
            # uvicorn marks the response started, then writes its head: this is it.
            self.head_due, self.held = False, data
            return
        held = self.held
        if held is None:
            self.transport.write(data)
        elif len(data) <= JOIN_BYTES:
            self.held = None
            self.transport.write(held + data)
        else:  # a large body is not copied to join it: one vectored write of both
            self.held = None
            self.transport.writelines((held, data))

    def flush(self) -> None:
        """Write a held head now."""
        held = self.held
        if held is not None:
            self.held = None
            self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


SWEEP_SECONDS = 0.25


async def _sweep(connections: set[Any]) -> None:
    """Every SWEEP_SECONDS, refuse the requests past their header or body deadline; ends when
    no connection is left (the next one starts it again).

    One task checking every connection replaces a timer per request phase: arming and
    cancelling two uvloop timers per request cost about 3 µs, a few percent of a small model's
    request; the deadlines are then kept to within SWEEP_SECONDS, ample for timeouts of seconds.
    """
    loop = asyncio.get_running_loop()
    while connections:
        await asyncio.sleep(SWEEP_SECONDS)
        now = loop.time()
        for connection in list(connections):
            connection.check_deadline(now)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn builds per connection, with ``limits``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})
