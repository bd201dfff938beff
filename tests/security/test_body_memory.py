"""Memory a client can make the HTTP face hold with a request body: promised lengths,
chunked framing, compression. One real server for the module; memory asserted by its RSS."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.servers import get, rss_bytes, running

pytestmark = pytest.mark.slow  # a real server process

MIB = 1 << 20
KEY = "battery-inference-key-0123456789"
TOKEN = "battery-control-token-0123456789"
ENV = {
    "GELU_MAX_BODY_BYTES": str(128 * MIB),  # a 64 MiB body is within the limit
    "GELU_MAX_JSON_BYTES": str(MIB),
    "GELU_RESTRICTED_API": f"inference:x-api-key={KEY}",
    "GELU_CONTROL_TOKEN": TOKEN,
    "GELU_BODY_TIMEOUT_SECONDS": "20",
    "GELU_MAX_CONNECTIONS": "200",
}
ACTIVATION = "/v1/activations/gelu"
INFER = "/v2/models/digits-mlp/infer"
PROMISED = 64 * MIB
CONNECTIONS = 16
# What 16 promises of 64 MiB may add to the server's memory at most: 1/16 of what they promise.
GROWTH = 64 * MIB


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[tuple[int, int]]:
    """The port and process id of a server with a 128 MiB body limit and credentials."""
    with running(model_repository, **ENV) as (port, process):
        yield port, process.pid


def head(path: str, headers: dict[str, str], framing: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        framing,
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def binary(**more: str) -> dict[str, str]:
    return {"Content-Type": "application/octet-stream", **more}


def most_growth(pid: int, during: Callable[[], None], seconds: float = 2.0) -> int:
    """The most the server's RSS grows above its level before ``during()`` runs, watched for
    ``seconds`` after it (the server may take a while to act on what was sent)."""
    before = rss_bytes(pid)
    during()
    most, until = rss_bytes(pid), time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)
        most = max(most, rss_bytes(pid))
    return most - before


def still_serves(port: int) -> None:
    """The server answers a real inference after the attack."""
    x = np.linspace(-3, 3, 8, dtype="<f4")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        body = x.tobytes()
        framing = f"Content-Length: {len(body)}"
        sock.sendall(head(ACTIVATION, binary(**{"x-api-key": KEY}), framing) + body)
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert get(port, "/v2/health/ready")[0] == 200


def read_answer(sock: socket.socket) -> bytes:
    """One response (the server answers with Content-Length), or what came before it closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in top.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return top + b"\r\n\r\n" + body


def promise(server: tuple[int, int], requests: list[bytes]) -> tuple[int, list[bytes]]:
    """Each request's head sent on a connection of its own, no body after it: the RSS growth
    while they are held, and what each connection was answered meanwhile (b"" for none)."""
    port, pid = server
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in requests]
    try:

        def send() -> None:
            for sock, request in zip(sockets, requests, strict=True):
                sock.sendall(request)

        growth = most_growth(pid, send)
        answers = []
        for sock in sockets:  # an answer has come by now, if there is one
            sock.settimeout(0.05)
            try:
                answers.append(read_answer(sock))
            except TimeoutError:
                answers.append(b"")
    finally:
        for sock in sockets:
            sock.close()
    return growth, answers


def test_promised_bodies_cost_nothing(server: tuple[int, int]) -> None:
    """Issue 62 item 1, "memory from a promise": 16 connections whose headers promise
    ``Content-Length: 67108864`` (within the limit, with the route's credentials) and send no
    body. On 0cc1e33 each zero-filled a 64 MiB buffer at once: RSS grew by 1 GiB."""
    framing = f"Content-Length: {PROMISED}"
    request = head(ACTIVATION, binary(**{"x-api-key": KEY}), framing)
    growth, answers = promise(server, [request] * CONNECTIONS)
    assert growth < GROWTH, f"RSS grew by {growth / MIB:.0f} MiB"
    assert answers == [b""] * CONNECTIONS  # waiting for their bodies
    still_serves(server[0])


def test_promised_bodies_without_credentials_cost_nothing(server: tuple[int, int]) -> None:
    """Issue 62 item 1, before any credential check: the same promises to a route restricted
    by GELU_RESTRICTED_API, and to one restricted by GELU_CONTROL_TOKEN, without the key or
    token, are refused (401) and hold no memory for their bodies."""
    framing = f"Content-Length: {PROMISED}"
    inference = head(ACTIVATION, binary(), framing)
    control = head("/v2/repository/models/digits-mlp/load", binary(), framing)
    growth, answers = promise(server, [inference, control] * (CONNECTIONS // 2))
    assert growth < GROWTH, f"RSS grew by {growth / MIB:.0f} MiB"
    assert all(answer.startswith(b"HTTP/1.1 401 ") for answer in answers), answers
    still_serves(server[0])


def test_chunk_headers_promising_huge_chunks_cost_nothing(server: tuple[int, int]) -> None:
    """Triton CVE-2025-23310/23311 (chunked bodies): chunk-size lines promising 64 MiB each,
    on 16 connections, hold no memory for the promise; one above 2**64 is a 400; a size line
    padded to 8 KiB with zeros costs no more than its bytes (past GELU_MAX_HEADER_BYTES, 431:
    ``test_chunk_extensions_and_trailer_fields_are_bounded``)."""
    framing = "Transfer-Encoding: chunked"
    promised = head(ACTIVATION, binary(**{"x-api-key": KEY}), framing) + b"%x\r\n" % PROMISED
    padded = head(ACTIVATION, binary(**{"x-api-key": KEY}), framing) + b"0" * 8192 + b"4\r\n"
    growth, answers = promise(server, [promised] * (CONNECTIONS - 1) + [padded])
    assert growth < GROWTH, f"RSS grew by {growth / MIB:.0f} MiB"
    assert answers == [b""] * CONNECTIONS, answers  # waiting for the chunks
    overflow = head(ACTIVATION, binary(**{"x-api-key": KEY}), framing) + b"f" * 20 + b"\r\n"
    with socket.create_connection(("127.0.0.1", server[0]), timeout=10) as sock:
        sock.sendall(overflow)
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    still_serves(server[0])


def unread_bytes(port: int) -> int:
    """What the server has yet to read from its established connections on ``port``: their
    receive queues, from the kernel's socket table."""
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)  # the column names
            for row in rows:
                fields = row.split()
                local, state, queues = fields[1], fields[3], fields[4]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    unread += int(queues.split(":")[1], 16)
    return unread


def test_many_tiny_chunks_stay_bounded(server: tuple[int, int]) -> None:
    """Triton CVE-2025-23310/23311 (a body of many chunks): 16 connections each sending
    200,000 one-byte chunks (1.2 MB of framing for 200 kB of body), never ending, to a JSON
    route: memory stays within a few bytes per chunk the server read (a ``bytes`` object per
    chunk is about 40) and the server serves on.

    Judged by counts, not by time: the server's memory is watched until it has read every
    byte sent (none left in its sockets' receive queues) or refused the rest; on a loaded
    machine that takes long enough for GELU_BODY_TIMEOUT_SECONDS to end some connections first
    (408 and closed), so the bound follows the chunks sent, as many as it can have read."""
    port, pid = server
    framing = "Transfer-Encoding: chunked"
    chunk, count = b"1\r\n \r\n", 200_000
    request = head(INFER, {"Content-Type": "application/json", "x-api-key": KEY}, framing)
    # Generous: the waits below are bounded by it, never judged by it.
    sockets = [
        socket.create_connection(("127.0.0.1", port), timeout=300) for _ in range(CONNECTIONS)
    ]
    sent = [0] * CONNECTIONS

    def send(index: int) -> None:
        sock, chunks = sockets[index], memoryview(chunk * count)
        try:
            sock.sendall(request)
            for start in range(0, len(chunks), 65536):
                sock.sendall(chunks[start : start + 65536])
                sent[index] += len(chunks[start : start + 65536])
        except OSError:
            pass  # refused at the body timeout and closed: what it read is bounded by sent

    threads = [threading.Thread(target=send, args=(i,)) for i in range(CONNECTIONS)]
    before = most = rss_bytes(pid)
    try:
        for thread in threads:
            thread.start()
        until = time.monotonic() + 600
        while any(t.is_alive() for t in threads) or unread_bytes(port):
            most = max(most, rss_bytes(pid))
            assert time.monotonic() < until, "the server did not read what was sent"
            time.sleep(0.05)
        most = max(most, rss_bytes(pid))
    finally:
        for sock in sockets:
            sock.close()
        for thread in threads:
            thread.join()
    growth, read = most - before, sum(sent) // len(chunk)
    print(f"RSS +{growth / MIB:.1f} MiB for at most {read:,} chunks read")
    assert read > 0
    # A byte per chunk for the bodies themselves, one more and 2 MiB of slack; a bytes object
    # kept per chunk is about 40.
    assert growth < 2 * MIB + 2 * read, f"RSS grew by {growth / MIB:.1f} MiB, {read:,} chunks"
    still_serves(port)


def test_a_never_ending_chunked_body_is_cut_at_its_limit(server: tuple[int, int]) -> None:
    """Triton CVE-2025-23310/23311 (a chunked body without end): a JSON body of 64 KiB chunks
    that never ends is answered 413 once past GELU_MAX_JSON_BYTES (1 MiB here), and the
    server's memory does not follow what the client sends after it."""
    port, pid = server
    framing = "Transfer-Encoding: chunked"
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(INFER, {"Content-Type": "application/json", "x-api-key": KEY}, framing))
        answered = threading.Event()
        answer: list[bytes] = []

        def read() -> None:
            answer.append(read_answer(sock))
            answered.set()

        reader = threading.Thread(target=read)
        reader.start()

        def flood() -> None:
            sent = 0
            while not answered.is_set() and sent < 64 * MIB:
                try:
                    sock.sendall(chunk * 16)
                except OSError:
                    break
                sent += 16 * 65536

        growth = most_growth(pid, flood, seconds=0.5)
        reader.join(timeout=20)
    assert answer and answer[0].startswith(b"HTTP/1.1 413 "), answer
    assert "GELU_MAX_JSON_BYTES" in json.loads(answer[0].partition(b"\r\n\r\n")[2])["error"]
    assert growth < GROWTH, f"RSS grew by {growth / MIB:.0f} MiB"
    still_serves(port)


# What a chunked body may send that is not body, each sent for as long as the server reads it:
# trailer fields, one trailer field without end, one chunk extension without end.
FRAMING_FLOODS = {
    "trailer-fields": (b"2\r\n{}\r\n0\r\n", b"X-Trailer: y\r\n" * 4096),
    "one-trailer-field": (b"2\r\n{}\r\n0\r\nX-Trailer: ", b"a" * 65536),
    "chunk-extension": (b"2;ext=", b"e" * 65536),
}


@pytest.mark.parametrize("flood", FRAMING_FLOODS, ids=list(FRAMING_FLOODS))
def test_chunk_extensions_and_trailer_fields_are_bounded(
    server: tuple[int, int], flood: str
) -> None:
    """Triton CVE-2025-23310/23311's class (what chunked framing costs) and Node.js
    CVE-2024-22019 (chunk extensions read without end): 16 MiB of trailer fields grew the
    server by 336 MiB (uvicorn kept each field), a trailer field or an extension that never
    ends was read until the body timeout. Now what is not body is held to
    GELU_MAX_HEADER_BYTES beyond 64 bytes a chunk: 431, and the server's memory stays put."""
    port, pid = server
    start, filler = FRAMING_FLOODS[flood]
    request = head(INFER, {"Content-Type": "application/json", "x-api-key": KEY},
                   "Transfer-Encoding: chunked")  # fmt: skip
    answer: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request + start)
        reader = threading.Thread(target=lambda: answer.append(read_answer(sock)))
        reader.start()

        def flood_it() -> None:
            with contextlib.suppress(OSError):  # closed by the server: the point
                for _ in range(16 * MIB // len(filler)):
                    sock.sendall(filler)

        growth = most_growth(pid, flood_it, seconds=0.5)
        reader.join(timeout=20)
    assert answer and answer[0].startswith(b"HTTP/1.1 431 "), answer
    assert "GELU_MAX_HEADER_BYTES" in json.loads(answer[0].partition(b"\r\n\r\n")[2])["error"]
    assert growth < 8 * MIB, f"RSS grew by {growth / MIB:.1f} MiB"
    still_serves(port)


def test_trailer_fields_are_not_headers(server: tuple[int, int]) -> None:
    """Request smuggling by trailer: uvicorn added a chunked body's trailer fields to the
    request's headers, which the route read with the body, after its checks. A trailer
    ``Inference-Header-Content-Length`` made a JSON route decode the body as binary (200), and a
    trailer ``X-Request-ID`` became the request's id. Both are ignored now."""
    port, _ = server
    tensor = {"name": "input", "shape": [1, 64], "datatype": "FP32",
              "parameters": {"binary_data_size": 256}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]}).encode()
    body = header + bytes(256)
    request = head(INFER, binary(**{"x-api-key": KEY}), "Transfer-Encoding: chunked")
    trailers = b"Inference-Header-Content-Length: %d\r\nX-Request-ID: forged\r\n" % len(header)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailers))
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"malformed JSON" in answer and b"forged" not in answer, answer[:300]
    still_serves(port)


def gzip_of_zeros(mib: int) -> bytes:
    """A gzip stream of ``mib`` MiB of zeros, made in a few milliseconds: a fully flushed
    deflate segment of 1 MiB repeated (its trailer's checksum is never reached: the server
    stops at its limit)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = deflate.compress(bytes(MIB)) + deflate.flush(zlib.Z_FULL_FLUSH)
    segment = deflate.compress(bytes(MIB)) + deflate.flush(zlib.Z_FULL_FLUSH)
    return first + segment * (mib - 1) + deflate.flush()


def test_a_gzip_bomb_is_413_and_the_server_serves_on(server: tuple[int, int]) -> None:
    """Issue 62 item 11 and the decompression-bomb class: 256 KiB of gzip that inflates to
    256 MiB, above the 128 MiB limit, is 413 (inflated off the event loop, stopping at the
    limit), and the server answers the next request."""
    port, _ = server
    bomb = gzip_of_zeros(256)
    headers = binary(**{"x-api-key": KEY, "Content-Encoding": "gzip"})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head(ACTIVATION, headers, f"Content-Length: {len(bomb)}") + bomb)
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert "decompresses to more than" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    still_serves(port)
