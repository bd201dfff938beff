"""Request bodies within their limits (JSON's bounded in what it costs, slow against a real
server), and compressed ones decoded off the event loop, bombs stopped at the limit."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
import time
import zlib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from service.errors import BadInputError, PayloadTooLargeError
from service.rest.body import INLINE_DECODE_BYTES, BodyLimits, decompress
from service.rest.middleware import BODY_TIMED
from tests.helpers import DIGITS, assert_error, service_settings
from tests.servers import connect, get, read_all, request_bytes, running, status_and_error

V1 = "/v1/models/digits-mlp:predict"
ROW = DIGITS[0].tolist()

# 64 KiB of gzip that inflates to 64 MiB: small enough to have been inflated on the loop whole.
BOMB = gzip.compress(bytes(64 << 20), 9)
assert len(BOMB) <= INLINE_DECODE_BYTES


def test_a_step_inflates_no_more_than_it_is_given() -> None:
    small = gzip.compress(b"x" * 1000)
    assert decompress(b"gzip", small, 1 << 20, "body", INLINE_DECODE_BYTES) == b"x" * 1000
    assert decompress(b"gzip", BOMB, 128 << 20, "body", INLINE_DECODE_BYTES) is None
    exact = gzip.compress(b"y" * INLINE_DECODE_BYTES)
    assert decompress(b"gzip", exact, 1 << 20, "body", INLINE_DECODE_BYTES) == b"y" * (64 << 10)


@pytest.mark.parametrize("step", [None, INLINE_DECODE_BYTES])
def test_decompression_stops_at_the_limit_and_refuses_what_is_not_zlib(step: int | None) -> None:
    with pytest.raises(PayloadTooLargeError, match="decompresses to more than the maximum of 1000"):
        decompress(b"gzip", gzip.compress(bytes(1001)), 1000, "body", step)
    assert decompress(b"deflate", zlib.compress(bytes(1000)), 1000, "body", step) == bytes(1000)
    with pytest.raises(BadInputError, match="not valid gzip"):
        decompress(b"gzip", b"not gzip", 1000, "body", step)
    with pytest.raises(BadInputError, match="truncated"):
        decompress(b"gzip", gzip.compress(bytes(1000))[:-12], 1000, "body", step)


def replay(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def gzip_scope(length: int) -> dict[str, Any]:
    headers = [(b"content-type", b"application/octet-stream"), (b"content-encoding", b"gzip"),
               (b"content-length", b"%d" % length)]  # fmt: skip
    return {"type": "http", "headers": headers}


def test_a_gzip_body_is_not_inflated_on_the_event_loop() -> None:
    """Issue 62 item 11: a 64 KiB gzip body that inflates to 64 MiB was inflated whole on
    the event loop (190 ms on a 2-core VM), stalling every other connection. The loop now
    inflates at most INLINE_DECODE_BYTES of it; the rest is a worker thread's."""
    limits = BodyLimits(128 << 20, 1 << 20)

    async def main() -> tuple[float, float, int]:
        loop, longest, stop = asyncio.get_running_loop(), 0.0, False

        async def ticker() -> None:
            nonlocal longest
            last = loop.time()
            while not stop:
                await asyncio.sleep(0.001)
                now = loop.time()
                longest, last = max(longest, now - last), now

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        scope, began = gzip_scope(len(BOMB)), loop.time()
        receive = await limits.admit(scope, replay(BOMB))
        message = await receive()
        took = loop.time() - began
        stop = True
        await ticking
        return longest, took, len(message["body"])

    longest, took, size = asyncio.run(main())
    assert size == 64 << 20
    # Relative, as the machine's speed varies: on the loop, the stall was all of it.
    assert longest < took / 4, f"the event loop stalled {longest * 1e3:.0f} ms of {took * 1e3:.0f}"


def test_a_small_gzip_body_is_decoded_and_described(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inflated on the loop, at once: no worker thread is asked for."""
    import anyio.to_thread

    limits = BodyLimits(1 << 20, 1 << 20)
    body = gzip.compress(b'{"inputs": []}')
    scope = gzip_scope(len(body))

    async def main() -> bytes:
        receive = await limits.admit(scope, replay(body))
        message = await receive()
        return bytes(message["body"])

    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a small body was handed to a thread")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    assert asyncio.run(main()) == b'{"inputs": []}'
    assert (b"content-length", b"14") in scope["headers"]
    assert all(key != b"content-encoding" for key, _ in scope["headers"])


def test_body_above_the_limit_is_413(client) -> None:
    big = b'{"instances": [' + b"0.5," * 300_000 + b"0.5]]}"
    assert_error(client.post(V1, content=big), 413, "above the maximum of 1048576")


def test_streamed_body_above_the_limit_is_413(client) -> None:
    def chunks():  # no Content-Length: the limit applies as the body arrives
        for _ in range(40):
            yield b" " * 50_000

    assert_error(client.post(V1, content=chunks()), 413, "above the maximum")


@pytest.mark.slow
def test_large_json_bodies_do_not_stall_liveness_or_memory(model_repository: Path) -> None:
    """Four JSON bodies at the JSON limit at once: liveness keeps answering, its worst wait a
    small part of what one body's request takes (parsed on the event loop, a body held the
    loop for as long as its parse); RSS grows by less than 400 MiB; and a body above the limit
    is refused before it is read. Relative within the run, as the machine's speed varies."""
    import psutil

    limit = 8 << 20
    values = b"0.123456789," * (limit // 12 - 10)
    body = b'{"data": [' + values + b"0.5]}"
    assert len(body) <= limit
    with running(model_repository, GELU_MAX_JSON_BYTES=str(limit)) as (port, process):
        rss_before = psutil.Process(process.pid).memory_info().rss
        results: list[tuple[int, float]] = []

        def post() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            began = time.monotonic()
            connection.request("POST", "/v1/activations/gelu", body)
            status = connection.getresponse().status
            results.append((status, time.monotonic() - began))
            connection.close()

        def live() -> float:
            began = time.monotonic()
            assert get(port, "/v2/health/live", timeout=120)[0] == 200
            return time.monotonic() - began

        threads = [threading.Thread(target=post) for _ in range(4)]
        for thread in threads:
            thread.start()
        waits, peak = [], 0
        while any(t.is_alive() for t in threads):
            waits.append(live())
            peak = max(peak, psutil.Process(process.pid).memory_info().rss)
            time.sleep(0.05)
        for thread in threads:
            thread.join()
        assert [status for status, _ in results] == [200] * 4, results
        quickest = min(seconds for _, seconds in results)
        worst = max(waits)
        print(f"liveness worst {worst * 1e3:.0f} ms of {len(waits)} probes, quickest body "
              f"{quickest * 1e3:.0f} ms, RSS +{(peak - rss_before) >> 20} MiB")  # fmt: skip
        assert len(waits) >= 2, waits  # the probes ran while the bodies were served
        assert worst < quickest / 3, f"liveness waited {worst:.2f} s, a body took {quickest:.2f} s"
        assert peak - rss_before < 400 << 20, f"RSS grew {(peak - rss_before) >> 20} MiB"

        # Above the limit: refused by its Content-Length, before the body is sent.
        with connect(port) as sock:
            head = request_bytes("POST", "/v1/activations/gelu", headers="Connection: close\r\n")
            sock.sendall(head.replace(b"Length: 0", f"Length: {limit + 1}".encode()))
            status, error = status_and_error(read_all(sock))
        assert status == 413
        assert "GELU_MAX_JSON_BYTES" in error


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_bodies_are_decoded(client, encoding, compress) -> None:
    import orjson

    body = orjson.dumps({"instances": [ROW]})
    plain = client.post("/v1/models/digits-mlp:predict", content=body)
    packed = client.post(
        "/v1/models/digits-mlp:predict",
        content=compress(body),
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    )
    assert packed.status_code == 200, packed.text
    assert packed.content == plain.content
    # Counted as the plain one is, with the version that served it: the decoded request's
    # scope is the one the metrics read.
    counted = [
        line
        for line in client.get("/metrics").text.splitlines()
        if line.startswith('gelu_requests_total{code="200"') and ":predict" in line
    ]
    assert len(counted) == 1 and 'model="digits-mlp"' in counted[0], counted
    assert 'version=""' not in counted[0], counted


def test_a_decompression_bomb_stops_at_the_limit(client) -> None:
    bomb = gzip.compress(b" " * (4 << 20))  # 4 MiB of spaces in about 4 KiB; limit 1 MiB
    assert len(bomb) < 10_000
    response = client.post(
        "/v1/models/digits-mlp:predict", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert_error(response, 413, "decompresses to more than the maximum of 1048576")


@pytest.mark.parametrize(
    ("encoding", "body", "status", "needle"),
    [
        ("br", b"{}", 415, "Content-Encoding 'br' is not supported"),
        ("gzip", b"not gzip at all", 400, "not valid gzip data"),
        ("gzip", gzip.compress(b'{"instances": []}')[:-12], 400, "truncated gzip"),
        ("deflate", b"\x00\x01\x02", 400, "not valid deflate data"),
    ],
)
def test_bad_compressed_bodies(client, encoding, body, status, needle) -> None:
    response = client.post(
        "/v1/models/digits-mlp:predict", content=body, headers={"Content-Encoding": encoding}
    )
    assert_error(response, status, needle)
    assert client.get("/v2/health/live").status_code == 200


def slow_body_scope(path: str, timed: bool) -> dict[str, Any]:
    """A request whose body is promised (Content-Length) as a host's ASGI server hands it over;
    ``timed``: a server that holds the body to its deadline itself, as the service's own."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
    scope: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip
    if timed:
        scope[BODY_TIMED] = True
    return scope


@pytest.mark.parametrize("path", [V1, "/v2/repository/models/digits-mlp/load"])
def test_a_host_that_does_not_time_bodies_gets_the_apps_408(
    model_repository: Path, path: str
) -> None:
    """Ray Serve's proxy hands a replica the request once its headers are in and the body as
    it comes, with no deadline of its own: a body that stopped coming held one of the
    replica's requests (``max_ongoing_requests``) for as long as the client kept the
    connection (Slowloris, CVE-2007-6750's class). The app holds such a body to
    GELU_BODY_TIMEOUT_SECONDS itself: 408 in the one error shape, counted as 408, on a direct
    route and a FastAPI one. Under a server that times bodies itself (``BODY_TIMED``: the
    service's own), the app leaves it to that server."""
    from service.rest.app import create_app

    seconds = 0.3
    app = create_app(service_settings(model_repository, body_timeout_seconds=seconds))

    async def call(timed: bool, late: float | None) -> tuple[int, bytes, float]:
        """The app's answer to a body of which a part comes, then (``late``) the rest after
        that many seconds, or never."""
        sent: list[dict[str, Any]] = []
        parts = [{"type": "http.request", "body": b"{" + b" " * 498, "more_body": True}]

        async def receive() -> dict[str, Any]:
            if parts:
                return parts.pop(0)
            if late is None:
                await asyncio.Event().wait()  # the rest never comes
            else:
                await asyncio.sleep(late)
            late_part = {"type": "http.request", "body": b" " * 500 + b"}", "more_body": False}
            return late_part if not sent else {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        began = time.monotonic()
        async with asyncio.timeout(seconds * 20):  # a hang fails here
            await app(slow_body_scope(path, timed), receive, send)
        return sent[0]["status"], sent[1]["body"], time.monotonic() - began

    async def main() -> list[tuple[int, bytes, float]]:
        async with app.router.lifespan_context(app):
            return [await call(False, None), await call(True, seconds * 2)]

    (status, body, took), (timed_status, timed_body, timed_took) = asyncio.run(main())
    assert status == 408 and b"GELU_BODY_TIMEOUT_SECONDS" in body
    assert set(json.loads(body)) == {"error"}
    assert took < timed_took  # the untimed host's answer came at the app's deadline
    # The service's own server times the body: the app waited past its deadline for it, and
    # the route answered what came (a refusal of its content, not of its time).
    assert timed_status != 408 and set(json.loads(timed_body)) == {"error"}
    exposition = app.state.dataplane.metrics.exposition().decode()
    assert any('code="408"' in line for line in exposition.splitlines())
