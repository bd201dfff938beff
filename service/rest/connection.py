"""What the HTTP face's connections may hold, and the pieces its protocol
(``service.rest.protocol``) reads and writes them with; public APIs only (asyncio, httptools).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from service.settings import Settings

REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    429: b"Too Many Requests",
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


class BodyOwner(Protocol):
    """What a ``BodyReader`` hands the body to, and the connection's events it passes on."""

    def body_read(self, body: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


# A body up to this size is joined to its head (a copy costs less than a vectored write's set-up).
JOIN_BYTES = 64 * 1024


class Pieces:
    """A request body's pieces as they arrive, in place of uvicorn's bytearray (its cycle's
    ``body``, which the protocol extends with ``+=``, measures with ``len`` and hands to the app
    as ``bytes(body)``). The bytearray copies each piece in and out again: two copies of every
    body, 4 MB each for a 1e6-value activation request. Here a piece is kept as it came, and
    handed on as it is when it is the only one, joined otherwise.

    Past ``MAX_PIECES`` the pieces are appended to the last one instead: a chunked body of
    one-byte chunks (the class of Triton's CVE-2025-23310/23311) would otherwise cost a
    ``bytes`` object, about 40 bytes, per byte received before the route reads it."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[bytes | bytearray] = []
        self.size = 0

    def __iadd__(self, piece: bytes) -> Pieces:
        pieces = self.pieces
        if len(pieces) < MAX_PIECES:
            pieces.append(piece)
        else:
            last = pieces[-1]
            if type(last) is not bytearray:
                last = pieces[-1] = bytearray(last)
            last += piece
        self.size += len(piece)
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        pieces = self.pieces
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # type: ignore[return-value]


# The most pieces a ``Pieces`` keeps apart.
MAX_PIECES = 32


# A body with at least this much left to arrive when its route first reads it is read by
# BodyReader (below it, the read's set-up costs more than the copies it saves).
DIRECT_BODY_BYTES = 64 * 1024
# BodyReader's buffer grows in parts as the body's bytes arrive: the first of FIRST_PART_BYTES,
# each next one as large as what has arrived so far, up to PART_BYTES. What it holds is then
# at most twice what was received plus FIRST_PART_BYTES, whatever the Content-Length promised.
FIRST_PART_BYTES = 64 * 1024
PART_BYTES = 4 << 20
# The buffers kept between bodies (``Spare``): the memory a process holds for them at most.
SPARE_BYTES = 32 << 20


class Spare:
    """Buffers kept between request bodies, at most ``limit`` bytes of them in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffers: list[bytearray] = []
        self.held = 0

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes: a kept one if one is large enough."""
        for i, buffer in enumerate(self.buffers):
            if len(buffer) >= size:
                self.held -= len(buffer)
                return self.buffers.pop(i)
        return bytearray(size)

    def give(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for a later body, if it fits within the limit."""
        if self.held + len(buffer) <= self.limit:
            self.buffers.append(buffer)
            self.held += len(buffer)


class BodyReader(asyncio.BufferedProtocol):
    """The rest of a request body, ``size`` bytes in all, read by the kernel straight into
    buffers, after ``unread`` (what the parser had of it). While the body arrives this is the
    transport's protocol (uvloop reads into the buffer a buffered protocol gives it); then the
    HTTP protocol is again (``body_read``, handed the body as ``bytes``: one copy of the whole).

    Through the parser, every piece of a large body is copied three times on the event loop:
    by uvloop, into a new ``bytes`` per read; by the parser, into another per body piece; and
    by the route, joining the pieces (stock uvicorn adds two, see ``Pieces``). The buffer ends
    where the body does, so a pipelined request after it is read by the parser.

    The buffer is taken in parts as bytes arrive (``FIRST_PART_BYTES``, ``PART_BYTES``), never
    for the whole Content-Length at once: a client that promises 64 MiB and sends nothing holds
    nothing (issue 62 item 1). The parts are kept for the next body (``Spare``): a new buffer
    costs a page fault per 4 KiB, each time.
    """

    __slots__ = ("filled", "http", "part", "parts", "size", "spare", "start", "used")

    def __init__(self, http: BodyOwner, size: int, unread: bytes, spare: Spare) -> None:
        self.http, self.size, self.spare = http, size, spare
        self.parts: list[bytearray] = []  # full, but for the last: ``part``
        self.part = bytearray()  # being filled, from ``used``
        self.used = 0
        self.start = unread  # what the parser had, first in the body
        self.filled = len(unread)  # of the body, with ``start``

    def get_buffer(self, sizehint: int) -> memoryview:
        part, used = self.part, self.used
        if used == len(part):  # full (or none yet): the next part, as bytes arrive
            wanted = min(max(self.filled, FIRST_PART_BYTES), PART_BYTES)
            part = self.part = self.spare.take(min(wanted, self.size - self.filled))
            self.parts.append(part)
            used = self.used = 0
        # Never past the body's end: what follows it is the next request's, for the parser.
        return memoryview(part)[used : used + self.size - self.filled]

    def buffer_updated(self, nbytes: int) -> None:
        self.used += nbytes
        self.filled += nbytes
        if self.filled == self.size:
            self.http.body_read(self._join())

    def _join(self) -> bytes:
        """The body as one ``bytes``; the parts are given back to the spare."""
        parts = self.parts  # all full but the last
        body = b"".join([self.start, *parts[:-1], memoryview(parts[-1])[: self.used]])
        self._give_back()
        return body

    def _give_back(self) -> None:
        for part in self.parts:
            self.spare.give(part)
        self.parts, self.part, self.used = [], bytearray(), 0

    # The connection's other events are the HTTP protocol's, but for the end of the client's
    # input: mid-body, its request can never complete, and the default, closing the
    # connection, is what the HTTP protocol would do (the loss then cancels the request).
    def connection_lost(self, exc: Exception | None) -> None:
        self._give_back()
        self.http.connection_lost(exc)

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()


class HeadWithBody:
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


async def sweep(connections: set[Any]) -> None:
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
