"""Request bodies within their limits, and compressed ones decoded off the event loop."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from typing import Any

import pytest

from service.errors import BadInputError, PayloadTooLargeError
from service.rest.body import INLINE_DECODE_BYTES, BodyLimits, decompress
from tests.helpers import assert_error

V1 = "/v1/models/digits-mlp:predict"

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


def test_a_small_gzip_body_is_decoded_and_described() -> None:
    limits = BodyLimits(1 << 20, 1 << 20)
    body = gzip.compress(b'{"inputs": []}')
    scope = gzip_scope(len(body))

    async def main() -> bytes:
        receive = await limits.admit(scope, replay(body))
        message = await receive()
        return bytes(message["body"])

    began = time.perf_counter()
    assert asyncio.run(main()) == b'{"inputs": []}'
    assert time.perf_counter() - began < 5
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
