"""Connection limits and timeouts, against a real ``gelu-serve serve`` with raw sockets."""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import DIGITS
from tests.servers import get, running, wait_until

pytestmark = pytest.mark.slow  # real server processes; the connection's parts: test_connection.py

LIMITS = {
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
PREDICT_BODY = json.dumps({"instances": [DIGITS[0].tolist()]}).encode()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: str = "",
    content_type: str = "application/json",
) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[int]:
    with running(model_repository, **LIMITS) as (port, _):
        yield port


def test_an_idle_connection_is_closed(server: int) -> None:
    with connect(server) as sock:
        began = time.monotonic()
        assert read_all(sock) == b""  # closed without a word: nothing was asked
        assert 0.5 < time.monotonic() - began < 5


def test_slow_headers_get_408(server: int) -> None:
    with connect(server) as sock:
        began = time.monotonic()
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        try:
            for byte in b"X-Slow: 1234567890\r\n":  # slowloris: a byte every 0.2 s
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass  # closed on us, as it should be
        status, error = status_and_error(read_all(sock))
    assert status == 408
    assert "GELU_HEADER_TIMEOUT_SECONDS" in error
    assert time.monotonic() - began < 4


@pytest.mark.parametrize("length", [400, 90_000])  # the larger one is read by BodyReader
def test_a_slow_body_gets_408(server: int, length: int) -> None:
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


def test_a_half_closed_client_still_gets_its_answer(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes("POST", PREDICT, PREDICT_BODY))
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"predictions"' in answer


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


@pytest.mark.parametrize("length", [1000, 90_000])  # the larger one is read by BodyReader
def test_a_client_that_half_closes_mid_body_is_let_go_at_once(server: int, length: int) -> None:
    """Its body can never complete: the connection closes now, not at the body timeout."""
    with connect(server) as sock:
        head = request_bytes("POST", PREDICT).replace(b"Length: 0", b"Length: %d" % length)
        sock.sendall(head + b'{"instances": [[')
        sock.shutdown(socket.SHUT_WR)
        began = time.monotonic()
        assert read_all(sock) == b""
        assert time.monotonic() - began < 0.5  # GELU_BODY_TIMEOUT_SECONDS is 1 here


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


def test_a_large_body_after_100_continue(server: int) -> None:
    request = octet_request(LARGE.tobytes(), "Expect: 100-continue\r\n")
    with connect(server) as sock:
        sock.sendall(request[: -LARGE.nbytes])
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(request[-LARGE.nbytes :])
        head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body == gelu_in_small_requests(server, LARGE)


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


def test_malformed_http_gets_400_in_the_one_error_shape(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, error = status_and_error(read_all(sock))
    assert status == 400
    assert "invalid HTTP request" in error
    assert get(server, "/v2/health/live")[0] == 200


def test_no_server_header(server: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
    connection.request("GET", "/v2/health/live")
    response = connection.getresponse()
    assert response.getheader("server") is None
    connection.close()


# ---- clients that go away -------------------------------------------------------------------


def reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client that crashed or gave up."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


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


# ---- JSON bodies cost, bounded --------------------------------------------------------------


def test_large_json_bodies_do_not_stall_liveness_or_memory(model_repository: Path) -> None:
    """Four JSON bodies at the JSON limit at once: liveness keeps answering within 1 s, RSS
    grows by less than 400 MiB, and a body above the limit is refused before it is read."""
    import psutil

    limit = 8 << 20
    values = b"0.123456789," * (limit // 12 - 10)
    body = b'{"data": [' + values + b"0.5]}"
    assert len(body) <= limit
    with running(model_repository, GELU_MAX_JSON_BYTES=str(limit)) as (port, process):
        rss_before = psutil.Process(process.pid).memory_info().rss
        results: list[int] = []

        def post() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("POST", "/v1/activations/gelu", body)
            results.append(connection.getresponse().status)
            connection.close()

        threads = [threading.Thread(target=post) for _ in range(4)]
        for thread in threads:
            thread.start()
        worst, peak = 0.0, 0
        while any(t.is_alive() for t in threads):
            began = time.monotonic()
            assert get(port, "/v2/health/live", timeout=10)[0] == 200
            worst = max(worst, time.monotonic() - began)
            peak = max(peak, psutil.Process(process.pid).memory_info().rss)
            time.sleep(0.05)
        for thread in threads:
            thread.join()
        assert results == [200] * 4, results
        print(f"liveness worst {worst:.3f} s, RSS +{(peak - rss_before) >> 20} MiB")
        assert worst < 1.0, f"liveness took {worst:.2f} s"
        assert peak - rss_before < 400 << 20, f"RSS grew {(peak - rss_before) >> 20} MiB"

        # Above the limit: refused by its Content-Length, before the body is sent.
        with connect(port) as sock:
            head = request_bytes("POST", "/v1/activations/gelu", headers="Connection: close\r\n")
            sock.sendall(head.replace(b"Length: 0", f"Length: {limit + 1}".encode()))
            status, error = status_and_error(read_all(sock))
        assert status == 413
        assert "GELU_MAX_JSON_BYTES" in error


# ---- shutdown fit for orchestrators ---------------------------------------------------------


def test_sigterm_drains_with_no_failure_among_accepted_requests(model_repository: Path) -> None:
    """Under load, SIGTERM: readiness turns 503 at once while requests are still served;
    after the drain new connections are refused; every request sent before the signal
    succeeds; the process exits 0."""
    env = {"GELU_DRAIN_SECONDS": "1.5", "GELU_GRACEFUL_SHUTDOWN_SECONDS": "5"}
    with running(model_repository, **env) as (port, process):
        signalled = threading.Event()
        before: list[int | str] = []  # outcomes of requests sent before the signal
        stop = threading.Event()

        def client() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            while not stop.is_set():
                sent_before = not signalled.is_set()
                try:
                    connection.request("POST", PREDICT, PREDICT_BODY)
                    response = connection.getresponse()
                    response.read()
                    outcome: int | str = response.status
                except (OSError, http.client.HTTPException) as exc:
                    outcome = type(exc).__name__
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    if signalled.is_set():
                        time.sleep(0.05)
                if sent_before:
                    before.append(outcome)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        signalled.set()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert get(port, "/v2/health/ready")[0] == 503  # at once, while still serving
        assert get(port, "/v2/health/live")[0] == 200
        code = process.wait(timeout=15)
        stop.set()
        for thread in threads:
            thread.join()
        assert code == 0
        assert len(before) > 50
        failed = [o for o in before if o != 200]
        assert not failed, f"{len(failed)} of {len(before)} accepted requests failed: {failed[:5]}"
        with pytest.raises(OSError):
            get(port, "/v2/health/live", timeout=2)


def test_a_stalled_upload_cannot_hold_shutdown(model_repository: Path) -> None:
    env = {
        "GELU_BODY_TIMEOUT_SECONDS": "600",
        "GELU_DRAIN_SECONDS": "0.5",
        "GELU_GRACEFUL_SHUTDOWN_SECONDS": "2",
    }
    with running(model_repository, **env) as (port, process), connect(port) as sock:
        head = request_bytes("POST", PREDICT).replace(b"Length: 0", b"Length: 1000")
        sock.sendall(head + b'{"instances": [[')  # then nothing more
        time.sleep(0.3)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - began < 6  # the drain and the graceful limit, with slack


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_graceful_stop_exits_0(model_repository: Path, signum: int) -> None:
    with running(model_repository) as (_, process):
        process.send_signal(signum)
        assert process.wait(timeout=20) == 0


# ---- how answers are written ------------------------------------------------------------------


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
