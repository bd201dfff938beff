"""HTTP/1.1 connections with limits (``GuardedHttpProtocol``). In process: the bodies, with
uvicorn's config and server state around the protocol, a recording transport, reads made as
uvloop makes them. Against a real ``gelu-serve serve`` over raw sockets (slow): the limits and
timeouts, bodies in pieces, clients that half-close or reset, and how answers are written. And
the one private hook held to the uvicorn release it was tested with."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import json
import logging
import os
import re
import select
import socket
import struct
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.server import ServerState

from service.rest import protocol
from service.rest.connection import (
    FIRST_PART_BYTES,
    MAX_PIECES,
    BodyReader,
    ConnectionLimits,
    Pieces,
)
from service.rest.protocol import GuardedHttpProtocol, guarded_protocol
from service.rest.server import http_options
from service.settings import Settings
from tests.helpers import DIGITS
from tests.servers import (
    ROOT,
    connect,
    get,
    read_all,
    request_bytes,
    running,
    status_and_error,
    wait_until,
)

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


CHUNKED = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX-Request-ID: sent\r\n\r\n"


def test_trailer_fields_never_become_the_requests_headers() -> None:
    """uvicorn appended a chunked body's trailer fields to the list the scope holds as the
    request's headers: a trailer ``Inference-Header-Content-Length``, ``Content-Encoding`` or
    ``X-Request-ID`` reached the app, after the checks made on the headers, as a header it
    read with the body. Now they are dropped: the app sees the headers that came before the
    body, whatever trailers follow it."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        seen.append(list(scope["headers"]))
        await answer(send, 204)

    async def main() -> None:
        protocol, transport = connected(app, ServerState())
        trailers = b"X-Request-ID: forged\r\nContent-Encoding: gzip\r\nX-Late: 1\r\n\r\n"
        protocol.data_received(CHUNKED + b"2\r\n{}\r\n0\r\n")
        protocol.data_received(trailers)
        protocol.data_received(CHUNKED + b"0\r\n" + trailers)  # all in one read too
        await settle()
        expected = [(b"transfer-encoding", b"chunked"), (b"x-request-id", b"sent")]
        assert seen == [expected, expected]
        assert transport.written.count(b"HTTP/1.1 204 ") == 2
        protocol.connection_lost(None)

    asyncio.run(main())


@pytest.mark.parametrize(
    "framing",
    [
        b"2\r\n{}\r\n0\r\n" + b"X-T: y\r\n" * 4000,  # trailer fields without end
        b"2\r\n{}\r\n0\r\nX-T: " + b"a" * 32000,  # one trailer field, never ended
        b"2;" + b"e" * 32000,  # one chunk extension, never ended
        (b"1;" + b"e" * 500 + b"\r\n \r\n") * 100,  # each chunk beyond its share
    ],
    ids=["trailer-fields", "one-trailer-field", "chunk-extension", "extensions-per-chunk"],
)
def test_chunked_framing_beyond_its_chunks_share_is_431(framing: bytes) -> None:
    """Node.js CVE-2024-22019 (a chunk extension without end, read for as long as the client
    sends it) and the trailer fields no limit counted (Triton CVE-2025-23310/23311's class):
    what a chunked body sends that is not body is held to GELU_MAX_HEADER_BYTES beyond
    FRAMING_PER_CHUNK bytes a chunk; past it, 431 and closed, read piece by piece."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await receive()

    async def main() -> None:
        protocol, transport = connected(app, ServerState())
        protocol.data_received(CHUNKED)
        for start in range(0, len(framing), 1000):
            protocol.data_received(framing[start : start + 1000])
            if transport.closed:
                break
        await settle()
        assert transport.written.startswith(b"HTTP/1.1 431 "), transport.written[:200]
        assert b"GELU_MAX_HEADER_BYTES" in transport.written and transport.closed
        protocol.connection_lost(None)

    asyncio.run(main())


def test_chunked_framing_within_its_share_is_read() -> None:
    """The bound counts what chunks need: 2,000 one-byte chunks (6 bytes of framing for each
    byte of body), a short extension on each, and a few trailer fields are a body, read whole."""
    received: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message["body"], message.get("more_body", False)
        received.append(body)
        await answer(send, 204)

    async def main() -> None:
        protocol, transport = connected(app, ServerState())
        chunks = b"".join(b"1;n=%d\r\n%c\r\n" % (i, 97 + i % 26) for i in range(2000))
        protocol.data_received(CHUNKED)
        for start in range(0, len(chunks), 1000):
            protocol.data_received(chunks[start : start + 1000])
            await asyncio.sleep(0)
        protocol.data_received(b"0\r\nX-A: 1\r\nX-B: 2\r\n\r\n")
        await settle()
        assert received == [bytes(97 + i % 26 for i in range(2000))]
        assert transport.written.startswith(b"HTTP/1.1 204 ") and not transport.closed
        protocol.connection_lost(None)

    asyncio.run(main())


# ---- against a real server, over raw sockets ---------------------------------------------------

SERVED_LIMITS = {
    "GELU_KEEP_ALIVE_SECONDS": "1",
    "GELU_HEADER_TIMEOUT_SECONDS": "1",
    "GELU_BODY_TIMEOUT_SECONDS": "1",
    "GELU_MAX_HEADER_BYTES": "4096",
    "GELU_MAX_HEADERS": "20",
    "GELU_MAX_CONNECTIONS": "40",
    "GELU_MAX_JSON_BYTES": "100000",
    "GELU_DRAIN_SECONDS": "0",
}


PREDICT = "/v1/models/digits-mlp:predict"
PREDICT_ROUTE = "/v1/models/{name}:predict"


PREDICT_BODY = json.dumps({"instances": [DIGITS[0].tolist()]}).encode()


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[int]:
    with running(model_repository, **SERVED_LIMITS) as (port, _):
        yield port


@pytest.mark.slow
def test_an_idle_connection_is_closed(server: int) -> None:
    """Closed without a word once GELU_KEEP_ALIVE_SECONDS (1 s) has passed, never before; the
    read's own timeout (10 s) bounds the wait."""
    with connect(server) as sock:
        began = time.monotonic()
        assert read_all(sock) == b""  # closed without a word: nothing was asked
        assert time.monotonic() - began > 0.5  # a load can only make it later


@pytest.mark.slow
def test_slow_headers_get_408(server: int) -> None:
    """A slowloris that keeps sending header bytes (one every 0.2 s, up to 150 of them) is
    answered 408 before it is done: the header timeout bounds all of them, not each byte."""
    header = b"X-Slow: " + b"1" * 140 + b"\r\n"
    sent = 0
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        try:
            for byte in header:
                if select.select([sock], [], [], 0.2)[0]:
                    break  # answered
                sock.sendall(bytes([byte]))
                sent += 1
        except OSError:
            pass  # closed on us, as it should be
        status, error = status_and_error(read_all(sock))
    assert status == 408
    assert "GELU_HEADER_TIMEOUT_SECONDS" in error
    assert sent < len(header), "answered only once the headers were done"


@pytest.mark.slow
@pytest.mark.parametrize("length", [400, 90_000])  # the larger one is read by BodyReader
def test_a_slow_body_gets_408(server: int, length: int) -> None:
    """Answered 408 and counted so: before, the close that follows the answer counted it as a
    client that left (499), and gRPC's own count of the same failure (408) did not match."""
    before = counted(server, "408")
    with connect(server) as sock:
        head = request_bytes("POST", PREDICT)[:-2]
        sock.sendall(head.replace(b"Length: 0", b"Length: %d" % length))
        sock.sendall(b"\r\n")
        try:
            for _ in range(20):
                sock.sendall(b"[0, ")  # 4 bytes every 0.2 s
                time.sleep(0.2)
        except OSError:
            pass
        status, error = status_and_error(read_all(sock))
    assert status == 408
    assert "GELU_BODY_TIMEOUT_SECONDS" in error
    assert counted(server, "408") == before + 1


def counted(port: int, code: str) -> float:
    """The server's count of predict requests answered ``code``, from its /metrics."""
    prefix = f'gelu_requests_total{{code="{code}",endpoint="{PREDICT_ROUTE}"'
    lines = [line for line in get(port, "/metrics")[1].decode().splitlines()
             if line.startswith(prefix)]  # fmt: skip
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ("X-Big: " + "a" * 8000 + "\r\n", "GELU_MAX_HEADER_BYTES"),
        ("".join(f"X-H{i}: 1\r\n" for i in range(30)), "GELU_MAX_HEADERS"),
    ],
    ids=["one-large-header", "many-headers"],
)
def test_header_limits_get_431(server: int, headers: str, needle: str) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes("GET", "/v2/health/live", headers=headers))
        status, error = status_and_error(read_all(sock))
    assert status == 431
    assert needle in error
    assert get(server, "/v2/health/live")[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize(("size", "status"), [(3600, 200), (4500, 431)])
def test_header_bytes_are_counted_across_pieces(server: int, size: int, status: int) -> None:
    # Headers of `size` bytes in two pieces, the second (1,500 bytes) completing them: 3,600
    # bytes are within the 4,096 of GELU_MAX_HEADER_BYTES, 4,500 are not, though neither
    # piece alone is above it, nor is the first while the headers are incomplete.
    line = request_bytes("GET", "/v2/health/live")[:-2]
    header = f"X-Big: {'a' * (size - len(line) - 11)}\r\n\r\n".encode()
    raw = line + header
    assert len(raw) == size
    with connect(server) as sock:
        sock.sendall(raw[:-1500])
        time.sleep(0.1)
        sock.sendall(raw[-1500:])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]


@pytest.mark.slow
def test_connections_beyond_the_limit_get_503(server: int) -> None:
    held = [connect(server) for _ in range(45)]
    try:
        refused = []
        for sock in held[-5:]:
            sock.settimeout(3)
            answer = read_all(sock)
            if answer:
                refused.append(answer)
        assert refused, "no connection beyond GELU_MAX_CONNECTIONS was refused"
        status, error = status_and_error(refused[0])
        assert status == 503
        assert b"retry-after: 1" in refused[0].lower()
        assert "too many open connections" in error
    finally:
        for sock in held:
            sock.close()
    # Once the server has seen them closed, a new connection is let in.
    wait_until(lambda: get(server, "/v2/health/live")[0] == 200, timeout=5, what="liveness")


@pytest.mark.slow
def test_a_half_closed_client_still_gets_its_answer(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes("POST", PREDICT, PREDICT_BODY))
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"predictions"' in answer


@pytest.mark.slow
@pytest.mark.parametrize("framing", ["content-length", "chunked", "chunked at once"])
def test_a_body_sent_in_pieces_is_read_whole(server: int, framing: str) -> None:
    """A body that reaches the server in several reads (the route reads it message by
    message), or in many chunks of one read (the protocol joins them into one message), gets
    the same answer as one sent at once."""
    pieces = [PREDICT_BODY[:7], PREDICT_BODY[7:150], PREDICT_BODY[150:]]
    with connect(server) as sock:
        if framing == "chunked at once":
            head = request_bytes("POST", PREDICT).replace(
                b"Content-Length: 0", b"Transfer-Encoding: chunked"
            )
            cut = range(0, len(PREDICT_BODY), 5)
            chunks = [PREDICT_BODY[i : i + 5] for i in cut]
            head += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
            pieces = []
        elif framing == "chunked":
            head = request_bytes("POST", PREDICT).replace(
                b"Content-Length: 0", b"Transfer-Encoding: chunked"
            )
            pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
        else:
            head = request_bytes("POST", PREDICT).replace(
                b"Length: 0", f"Length: {len(PREDICT_BODY)}".encode()
            )
        sock.sendall(head)
        for piece in pieces:
            time.sleep(0.05)
            sock.sendall(piece)
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
    with connect(server) as sock:
        sock.sendall(request_bytes("POST", PREDICT, PREDICT_BODY))
        sock.shutdown(socket.SHUT_WR)
        at_once = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.partition(b"\r\n\r\n")[2] == at_once.partition(b"\r\n\r\n")[2]


@pytest.mark.slow
@pytest.mark.parametrize("length", [1000, 90_000])  # the larger one is read by BodyReader
def test_a_client_that_half_closes_mid_body_is_let_go_at_once(server: int, length: int) -> None:
    """Its body can never complete: the connection closes now, not at the body timeout. Judged
    against a peer sent the same unfinished body at the same moment without the half-close:
    the half-closed one ends, without a word, before the peer is answered its 408."""
    head = request_bytes("POST", PREDICT).replace(b"Length: 0", b"Length: %d" % length)
    with connect(server) as sock, connect(server) as peer:
        for client in (peer, sock):
            client.sendall(head + b'{"instances": [[')
        sock.shutdown(socket.SHUT_WR)
        readable, _, _ = select.select([sock, peer], [], [], 60)
        assert readable == [sock]  # the peer waits for its body timeout
        assert read_all(sock) == b""
        status, error = status_and_error(read_all(peer))
    assert status == 408 and "GELU_BODY_TIMEOUT_SECONDS" in error


# 400 kB of float32: all but the first read of it is read by service.rest.connection.BodyReader.
LARGE = np.linspace(-5, 5, 100_000, dtype="<f4")


ACTIVATION = "/v1/activations/gelu"


def octet_request(body: bytes, headers: str = "") -> bytes:
    return request_bytes("POST", ACTIVATION, body, headers, "application/octet-stream")


def gelu_in_small_requests(port: int, x: np.ndarray) -> bytes:
    """GELU of ``x`` asked for 8,000 values (32 kB) at a time: bodies the parser reads."""
    answers = []
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    octet = {"Content-Type": "application/octet-stream"}
    for start in range(0, x.size, 8000):
        connection.request("POST", ACTIVATION, x[start : start + 8000].tobytes(), octet)
        response = connection.getresponse()
        assert response.status == 200
        answers.append(response.read())
    connection.close()
    return b"".join(answers)


@pytest.mark.slow
def test_a_large_body_in_pieces_is_read_whole_and_what_follows_it_is_parsed(server: int) -> None:
    """A large body is read apart from the parser; the request pipelined right after it, and
    the next large request on the connection, are still parsed and answered."""
    expected = gelu_in_small_requests(server, LARGE)
    request = octet_request(LARGE.tobytes())
    with connect(server) as sock:
        cuts = [0, len(request) - LARGE.nbytes + 1000, len(request) // 2, len(request)]
        for start, end in itertools.pairwise(cuts):
            time.sleep(0.05)
            tail = request_bytes("GET", "/v2/health/live") if end == len(request) else b""
            sock.sendall(request[start:end] + tail)
        rest = bytearray()
        head, body = read_response(sock, rest=rest)
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert body == expected
        head, body = read_response(sock, rest=rest)
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body) == {"live": True}
        sock.sendall(request)
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and body == expected


@pytest.mark.slow
def test_a_large_body_after_100_continue(server: int) -> None:
    request = octet_request(LARGE.tobytes(), "Expect: 100-continue\r\n")
    with connect(server) as sock:
        sock.sendall(request[: -LARGE.nbytes])
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(request[-LARGE.nbytes :])
        head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body == gelu_in_small_requests(server, LARGE)


@pytest.mark.slow
def test_a_large_body_refused_by_its_length_is_passed_over(server: int) -> None:
    """A JSON body above GELU_MAX_JSON_BYTES (100 kB here), within the body limit: 413 from its
    Content-Length, before it is read; it is read past, and the connection serves on."""
    body = b"[" + b"0, " * 60_000 + b"0]"
    with connect(server) as sock:
        sock.sendall(request_bytes("POST", PREDICT, body) + request_bytes("GET", "/v2/health/live"))
        rest = bytearray()
        head, answer = read_response(sock, rest=rest)
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert "GELU_MAX_JSON_BYTES" in json.loads(answer)["error"]
        head, answer = read_response(sock, rest=rest)
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(answer) == {"live": True}


@pytest.mark.slow
def test_malformed_http_gets_400_in_the_one_error_shape(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, error = status_and_error(read_all(sock))
    assert status == 400
    assert "invalid HTTP request" in error
    assert get(server, "/v2/health/live")[0] == 200


@pytest.mark.slow
def test_no_server_header(server: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
    connection.request("GET", "/v2/health/live")
    response = connection.getresponse()
    assert response.getheader("server") is None
    connection.close()


def read_response(
    sock: socket.socket, head_only: bool = False, rest: bytearray | None = None
) -> tuple[bytes, bytes]:
    """One response's head and body (by its Content-Length) from a kept-alive connection;
    with ``rest``, what was read beyond it is kept there, and read from there first."""

    def more() -> bytes:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        return chunk

    data = b""
    if rest is not None:
        data, rest[:] = bytes(rest), b""
    while b"\r\n\r\n" not in data:
        data += more()
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0 if head_only else int(head.lower().split(b"content-length: ")[1].split()[0])
    while len(body) < length:
        body += more()
    if rest is not None:
        rest[:], body = body[length:], body[:length]
    assert len(body) == length, (head, body)
    return head, body


@pytest.mark.slow
def test_heads_interim_answers_and_bodies_on_one_connection(server: int) -> None:
    # A response's head is written with its body (service.rest.protocol._HeadWithBody): a
    # HEAD answer, which has no body, a 100 Continue before the response, and the answers
    # after them on the same connection must each still arrive whole and in order.
    with connect(server) as sock:
        sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = read_response(sock, head_only=True)  # 405: the routes answer GET only
        assert head.startswith(b"HTTP/1.1 405 ") and b"content-length: " in head and body == b""
        expect = request_bytes("POST", PREDICT, PREDICT_BODY, "Expect: 100-continue\r\n")
        sock.sendall(expect[: -len(PREDICT_BODY)])  # the head; the body waits for the 100
        interim = sock.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(PREDICT_BODY)
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert len(json.loads(body)["predictions"]) == 1
        sock.sendall(request_bytes("GET", "/v2/health/live"))
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body) == {"live": True}


# ---- clients that go away ---------------------------------------------------------------------


def reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client that crashed or gave up."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.slow
def test_requests_of_clients_that_reset_are_not_run(slow_repository: Path) -> None:
    body = json.dumps({"instances": [DIGITS[0].tolist()] * 8}).encode()
    with running(slow_repository, GELU_INLINE_MAX_US="0") as (port, _):
        sent = 150
        sockets = [connect(port) for _ in range(sent)]
        for sock in sockets:
            sock.sendall(request_bytes("POST", "/v1/models/slow:predict", body))
        for sock in sockets:
            reset(sock)
        time.sleep(1.5)
        stats = json.loads(get(port, "/v2/models/slow/stats")[1])["model_stats"][0]
        ran = stats["inference_count"] // 8
        assert ran < sent / 2, f"{ran} of {sent} abandoned requests ran"
        metrics = get(port, "/metrics")[1].decode()
        assert 'code="499"' in metrics
        assert get(port, "/v2/health/live")[0] == 200


# ---- the uvicorn release the private hook was tested with -------------------------------------


def test_pyproject_pins_the_tested_uvicorn() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in dependencies if re.match(r"uvicorn\b", d)]
    assert pins == [f"uvicorn[standard]=={protocol.TESTED_UVICORN}"]


def test_the_installed_uvicorn_is_the_tested_one() -> None:
    assert uvicorn.__version__ == protocol.TESTED_UVICORN, (
        f"uvicorn {uvicorn.__version__} is installed, but service/rest/protocol.py subclasses "
        f"the private HttpToolsProtocol of {protocol.TESTED_UVICORN}: read that release's "
        "httptools_impl.py against it, rerun tests/service/rest/test_protocol.py with its slow "
        "tests, then move the "
        "pin in pyproject.toml and TESTED_UVICORN together"
    )
    assert protocol.supported()


def test_the_tested_uvicorn_serves_the_guarded_protocol(tmp_path: Path) -> None:
    options = http_options(Settings(model_repository=tmp_path, max_connections=7))
    assert issubclass(options["http"], protocol.GuardedHttpProtocol)
    assert options["http"].limits.max_connections == 7
    assert "limit_concurrency" not in options


def test_another_uvicorn_serves_uvicorns_own_protocol_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(protocol, "TESTED_UVICORN", "0.0.0")
    with caplog.at_level(logging.WARNING, logger="gelu_serve"):
        options = http_options(Settings(model_repository=tmp_path, max_connections=7))
    assert options["http"] == "httptools"
    assert options["limit_concurrency"] == 7
    assert "tested with uvicorn 0.0.0" in caplog.text
    assert "no header or body timeouts" in caplog.text
