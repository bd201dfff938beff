"""The HTTP protocol's bodies, in process: uvicorn's config and server state around
``GuardedHttpProtocol``, a recording transport, reads made as uvloop makes them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from service.rest.connection import (
    FIRST_PART_BYTES,
    MAX_PIECES,
    BodyReader,
    ConnectionLimits,
    Pieces,
)
from service.rest.protocol import GuardedHttpProtocol, guarded_protocol

App = Callable[[Any, Any, Any], Awaitable[None]]
LIMITS = ConnectionLimits(4, 5.0, 5.0, 5.0, 8192, 100, 128 << 20)
PROMISE = b"POST / HTTP/1.1\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"


class FakeTransport:
    """What ``GuardedHttpProtocol`` uses of uvloop's transport, recording writes and which
    protocol the connection's reads go to."""

    def __init__(self) -> None:
        self.protocol: Any = None
        self.written = b""
        self.closed = False
        self.paused = False

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def write(self, data: bytes) -> None:
        self.written += data

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else None

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def connected(app: App, state: ServerState) -> tuple[GuardedHttpProtocol, FakeTransport]:
    """A new connection to ``app``, on the running loop."""
    config = Config(app=app, lifespan="off", log_level="warning")
    config.load()
    protocol = guarded_protocol(LIMITS)(
        config=config, server_state=state, app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = FakeTransport()
    transport.protocol = protocol
    protocol.connection_made(cast(asyncio.Transport, transport))
    return protocol, transport


def read_into(reader: BodyReader, data: bytes) -> None:
    """``data`` received, as uvloop reads for a buffered protocol."""
    while data:
        buffer = reader.get_buffer(-1)
        n = min(len(buffer), len(data), 65536)
        buffer[:n] = data[:n]
        reader.buffer_updated(n)
        data = data[n:]


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def answer(send: Any, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_promised_body_holds_nothing_until_its_route_reads_it() -> None:
    """Issue 62 item 1: headers promising 64 MiB and no body. Nothing is buffered for it
    before the route asks (its credentials and limit come first), and when it asks, the
    buffer grows with the bytes that arrive, not with the promise."""
    asked = asyncio.Event
    received: list[Any] = []

    async def main() -> None:
        go = asked()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await go.wait()  # the route's checks, before it reads
            try:
                received.append(await receive())
            except asyncio.CancelledError:
                received.append("cancelled")

        protocol, transport = connected(app, ServerState())
        protocol.data_received(PROMISE % (64 << 20))
        await settle()
        assert transport.protocol is protocol  # no reader, no buffer: the route has not asked
        go.set()
        await settle()
        reader = transport.protocol
        assert isinstance(reader, BodyReader)
        assert reader.parts == []  # asked, but nothing has arrived
        read_into(reader, os.urandom(1000))
        assert sum(len(part) for part in reader.parts) <= FIRST_PART_BYTES
        reader.connection_lost(ConnectionResetError())
        await settle()
        assert received == ["cancelled"]  # the loss cancels the request

    asyncio.run(main())


def test_a_body_its_route_refuses_is_never_buffered() -> None:
    """A route that answers without reading (401 for missing credentials, 413 by
    Content-Length) gives its body no buffer: the parser reads past it, and the connection
    serves the request after it."""

    async def main() -> None:
        statuses = [401, 204]

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await answer(send, statuses.pop(0))

        protocol, transport = connected(app, ServerState())
        protocol.data_received(PROMISE % 300_000 + os.urandom(1000))
        await settle()
        assert transport.protocol is protocol
        assert transport.written.startswith(b"HTTP/1.1 401 ")
        protocol.data_received(os.urandom(299_000) + b"GET / HTTP/1.1\r\n\r\n")
        await settle()
        assert transport.protocol is protocol and not transport.closed
        assert transport.written.count(b"HTTP/1.1 204 ") == 1 and statuses == []
        protocol.connection_lost(None)

    asyncio.run(main())


def test_the_body_reader_hands_the_app_the_whole_body() -> None:
    """Reads as uvloop makes them for a buffered protocol: the app gets the whole body in one
    message, as ``bytes`` made once from the parts the reads went into, what the parser had at
    its start; the parts grow with what arrived (at most twice it, plus the first part) and are
    kept for the next body; the connection's reads go to the HTTP protocol again after it."""
    received: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        received.append(await receive())
        await answer(send, 204)

    async def main() -> None:
        protocol, transport = connected(app, ServerState())
        body = os.urandom(3_000_000)
        protocol.data_received(PROMISE % len(body) + body[:1000])
        await settle()
        reader = transport.protocol
        assert isinstance(reader, BodyReader)
        for start in range(1000, len(body), 65536):
            read_into(reader, body[start : start + 65536])
            held = sum(len(part) for part in reader.parts)
            assert held <= 2 * reader.filled + FIRST_PART_BYTES or transport.protocol is protocol
        assert transport.protocol is protocol
        protocol.data_received(b"GET / HTTP/1.1\r\n\r\n")  # the next request, by the parser
        await settle()
        assert received[0] == {"type": "http.request", "body": body, "more_body": False}
        assert type(received[0]["body"]) is bytes
        assert received[1] == {"type": "http.request", "body": b"", "more_body": False}
        assert transport.written.count(b"HTTP/1.1 204 ") == 2
        kept = protocol.spare.buffers
        assert kept and protocol.spare.held == sum(len(part) for part in kept) < len(body) * 2
        protocol.connection_lost(None)

    asyncio.run(main())


def test_a_connection_lost_mid_body_cancels_its_request() -> None:
    received: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            received.append(await receive())
        except asyncio.CancelledError:
            received.append("cancelled")

    async def main() -> None:
        state = ServerState()
        protocol, transport = connected(app, state)
        protocol.data_received(PROMISE % 300_000 + b"x" * 1000)
        await settle()
        assert isinstance(transport.protocol, BodyReader) and protocol in state.connections
        transport.protocol.connection_lost(ConnectionResetError())
        await settle()
        assert protocol not in state.connections and received == ["cancelled"]

    asyncio.run(main())


def test_a_body_in_many_pieces_keeps_few_objects() -> None:
    """Triton CVE-2025-23310/23311's class: a chunked body of one-byte chunks is kept in at
    most MAX_PIECES objects, not one per chunk, and read back whole."""
    body = Pieces()
    for i in range(10_000):
        body += bytes([i % 251])
    assert len(body.pieces) <= MAX_PIECES and len(body) == 10_000
    assert bytes(body) == bytes(i % 251 for i in range(10_000))
    one = os.urandom(1 << 20)
    single = Pieces()
    single += one
    assert bytes(single) is one  # one piece: handed on without a copy


def test_a_pipelined_body_waits_for_its_own_route() -> None:
    """A request pipelined behind one still being answered: its body is not given a reader
    while the first request's route reads again or answers, only when its own route reads."""
    received: list[Any] = []

    async def main() -> None:
        go = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            received.append(await receive())
            if len(received) == 1:  # it listens for a disconnect meanwhile, as Starlette's do
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(receive(), 0.05)
                await go.wait()
            await answer(send, 204)

        protocol, transport = connected(app, ServerState())
        body = os.urandom(300_000)
        small = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
        protocol.data_received(small + PROMISE % len(body) + body[:1000])
        await settle()
        assert received == [{"type": "http.request", "body": b"{}", "more_body": False}]
        await asyncio.sleep(0.1)
        assert transport.protocol is protocol and protocol.pipeline
        go.set()
        await settle()
        reader = transport.protocol
        assert isinstance(reader, BodyReader) and reader.filled == 1000
        read_into(reader, body[1000:])
        await settle()
        assert received[1] == {"type": "http.request", "body": body, "more_body": False}
        assert transport.written.count(b"HTTP/1.1 204 ") == 2
        protocol.connection_lost(None)

    asyncio.run(main())
