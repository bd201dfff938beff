"""Request bodies within their limits: admitted, counted as they stream in, decompressed."""

from __future__ import annotations

import asyncio
import zlib

import anyio.to_thread
from starlette.requests import ClientDisconnect

from service import codecs
from service.errors import (
    BadInputError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceError,
    UnsupportedMediaError,
)
from service.rest.middleware import BODY_TIMED, ASGIApp, Message, Receive, Scope, Send, send_error


class BodyLimits:
    """Request bodies within their limits, and compressed ones decoded.

    A binary body (``application/octet-stream``, or a V2 request with
    ``Inference-Header-Content-Length``) may be up to ``max_bytes``; any other body is JSON,
    whose parsing costs many times its size, and may be up to ``max_json_bytes`` (as may a V2
    binary request's JSON header). A body above its limit gets 413: by its Content-Length
    before it is read, or as it streams in. A ``Content-Encoding: gzip`` or ``deflate`` body
    (tritonclient's request compression) is read whole, decompressed within the same limits (a
    decompression bomb stops at the limit, 413) and handed on decoded; another encoding is 415.

    With ``body_seconds``, a body must arrive within that many seconds of being asked for, or
    408, wherever the app is served: the service's own server bounds it per connection and says
    so in the scope (``BODY_TIMED``); a host whose server does not (Ray Serve's proxy hands the
    replica the request once its headers are in, and the body as it trickles) gets the bound
    here, so a slow body cannot hold one of the replica's requests without end.
    """

    def __init__(
        self, max_bytes: int, max_json_bytes: int, body_seconds: float | None = None
    ) -> None:
        self.body_seconds = body_seconds
        self.max_bytes = max_bytes
        self.max_json_bytes = min(max_json_bytes, max_bytes)
        self.json_variable = (
            "GELU_MAX_JSON_BYTES; send large tensors in a binary form"
            if max_json_bytes < max_bytes
            else "GELU_MAX_BODY_BYTES"
        )

    async def admit(self, scope: Scope, receive: Receive) -> Receive:
        """The ``receive`` that gives the request's body within its limits: ``receive`` itself
        when its Content-Length is within them, one that counts (413 as the body streams past
        the limit) when there is none, or one that replays the decoded body of a compressed
        request, whose headers in ``scope`` then describe the decoded body. Raises
        ``ServiceError`` (413, 415, 400) for a body that cannot be admitted."""
        binary, length, encoding = False, None, None
        for key, value in scope["headers"]:
            if key == b"content-type":
                binary = binary or value.startswith(b"application/octet-stream")
            elif key == codecs.HEADER_LENGTH_KEY:
                binary = True
                header = codecs.client_size(value)
                if header is not None and header > self.max_json_bytes:
                    raise self._too_large(header, "JSON header")
            elif key == b"content-length":
                length = codecs.client_size(value)
            elif key == b"content-encoding" and value.lower() != b"identity":
                encoding = value.lower()
        if self.body_seconds is not None and BODY_TIMED not in scope:
            receive = self._timed(receive, self.body_seconds)
        limit = self.max_bytes if binary else self.max_json_bytes
        what = "body" if binary else "JSON body"
        if length is not None and length > limit:
            raise self._too_large(length, what, limit)
        if length is not None and encoding is None:
            # HTTP/1.1 framing: the server hands on at most Content-Length bytes of body.
            return receive
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise self._too_large(received, what, limit)
            return message

        if encoding is None:
            return limited_receive
        decoded = await self._decode(encoding, limited_receive, limit, what)
        describe_decoded(scope, len(decoded))
        return replay(decoded)

    @staticmethod
    def _timed(receive: Receive, seconds: float) -> Receive:
        """``receive``, its body's messages due within ``seconds`` from now (408 after); what
        comes after the body (a disconnect) is waited for as long as it takes."""
        deadline = asyncio.get_running_loop().time() + seconds
        done = False

        async def timed_receive() -> Message:
            nonlocal done
            if done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"the request's body did not arrive within {seconds:g} s "
                    "(GELU_BODY_TIMEOUT_SECONDS)"
                ) from None
            done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return timed_receive

    async def _decode(self, encoding: bytes, receive: Receive, limit: int, what: str) -> bytes:
        if encoding not in DECODERS:
            raise UnsupportedMediaError(
                f"Content-Encoding {encoding.decode(errors='replace')!r} is not supported; "
                "send gzip, deflate or identity"
            )
        compressed = await read_body(receive)
        if len(compressed) <= INLINE_DECODE_BYTES:
            decoded = decompress(encoding, compressed, limit, what, INLINE_DECODE_BYTES)
            if decoded is not None:
                return decoded
        # Larger, or more to inflate than the loop's step: all of it again, on a thread (the
        # step's work, bounded, is the cost of not copying its output into the whole).
        whole = await anyio.to_thread.run_sync(decompress, encoding, compressed, limit, what)
        assert whole is not None  # no step: the whole, or an error
        return whole

    def _too_large(self, size: int, what: str, limit: int | None = None) -> PayloadTooLargeError:
        variable = "GELU_MAX_BODY_BYTES" if what == "body" else self.json_variable
        amount = f"{size} bytes" if size < 1 << 62 else "over 10**18 bytes"
        return PayloadTooLargeError(
            f"{what} of {amount} is above the maximum of {limit or self.max_json_bytes} "
            f"({variable})"
        )


class BodyLimitMiddleware:
    """``BodyLimits`` as pure ASGI middleware; a body they refuse is answered here."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_json_bytes: int, body_seconds: float | None = None
    ) -> None:
        self.app = app
        self.limits = BodyLimits(max_bytes, max_json_bytes, body_seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self.limits.admit(scope, receive)
        except ServiceError as exc:
            await send_error(send, exc)
            return
        await self.app(scope, receive, send)


# A compressed body up to this size is inflated on the event loop for at most this many bytes
# of output (64 KiB: about 0.15 ms, zlib on a 2-core VM); more, or a larger body, on a thread.
INLINE_DECODE_BYTES = 64 * 1024
# zlib's wbits for each Content-Encoding: gzip's header, or zlib's (deflate as HTTP means it).
GZIP, ZLIB = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS
DECODERS = {b"gzip": GZIP, b"x-gzip": GZIP, b"deflate": ZLIB}


def decompress(
    encoding: bytes, data: bytes, limit: int, what: str, step: int | None = None
) -> bytes | None:
    """``data`` decoded, never producing more than ``limit`` bytes (413 beyond). With
    ``step``, no more than ``step`` bytes of output are made: None when the whole needs more.

    Inflated in pieces of at most PIECE_BYTES, joined at the end: zlib lets other threads run
    while it inflates, but not while it copies its output into one ``bytes``, nor does a
    ``bytes`` join below 1 MiB; one 64 MiB output would hold the event loop for that copy."""
    decoder = zlib.decompressobj(DECODERS[encoding])
    room = limit + 1 if step is None else min(step, limit + 1)
    pieces: list[bytes] = []
    size, rest = 0, data
    try:
        while not decoder.eof:
            piece = decoder.decompress(rest, min(PIECE_BYTES, room - size))
            rest = decoder.unconsumed_tail
            if not piece and not rest:
                raise BadInputError(f"body is truncated {encoding.decode()} data")
            size += len(piece)
            if size > limit:
                raise PayloadTooLargeError(
                    f"{what} decompresses to more than the maximum of {limit} bytes"
                )
            pieces.append(piece)
            if size == room and not decoder.eof:
                return None  # ``step`` reached: there is more
    except zlib.error as exc:
        raise BadInputError(f"body is not valid {encoding.decode()} data: {exc}") from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


# The most one call into zlib inflates (see ``decompress``).
PIECE_BYTES = 1 << 20


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ``receive``."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def describe_decoded(scope: Scope, length: int) -> None:
    """Make ``scope``'s headers describe the decoded body: no Content-Encoding, its
    Content-Length. In place, so that what the app later records in the scope (the served
    version) is seen by the layers around it."""
    headers = [
        (k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")
    ]
    headers.append((b"content-length", str(length).encode()))
    scope["headers"] = headers


def replay(body: bytes) -> Receive:
    """A ``receive`` that gives ``body`` as one message, then waits for the disconnect."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # as a server does: nothing more until the client goes
        raise AssertionError("unreachable")

    return receive
