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
- at most ``max_header_bytes`` of request line and headers and ``max_headers`` fields (431);
- a Transfer-Encoding other than ``chunked`` alone refused (400) before its body is read;
- at most ``PIPELINE_DEPTH`` pipelined requests waiting behind the one being answered, and
  nothing more read while any wait (one more: 429 once those are answered, and closed);
- a chunked body's framing (size lines, chunk extensions, trailer fields) at most
  ``FRAMING_PER_CHUNK`` bytes per chunk beyond ``max_header_bytes`` (431); its trailer fields
  are dropped, never added to the request's headers.

It also settles what a lost connection means for its request. A client that half-closes
(sends its whole request, then shuts its write side) still gets its answer. A connection that is
lost (reset, or closed by a timeout above) cancels its request's task, so work queued for a
client that has gone is dropped instead of run; the scope's ``CLIENT_GONE`` key tells the app
that this cancellation is not a shutdown's.

A request's body is read when its route asks for it, so after the route's credentials and its
own limit (JSON or binary, ``service.rest.body``) have been decided; until then the parser
holds at most uvicorn's 64 KiB of it and stops reading. What a body holds grows with the bytes
that arrive, never with what its Content-Length promises (issue 62 item 1).

Savings on every request: a response's head goes out with its body's first write
(``HeadWithBody``), and a request body's pieces are handed on as they came (``Pieces``). A
large body framed by Content-Length is read by the kernel straight into buffers
(``BodyReader``), not copied piece by piece by the event loop, the parser and the route.

This is the service's one use of a private module of a dependency: uvicorn bounds none of the
above through its public options. It is kept to this module, uvicorn is pinned to the release
it was tested with (``TESTED_UVICORN``), and with any other release the server runs uvicorn's
own protocol with its public limits instead (``service.rest.server.http_options``), warning
that the header and body timeouts and header limits are off.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service import codecs
from service.rest.connection import (
    DIRECT_BODY_BYTES,
    REASONS,
    SPARE_BYTES,
    BodyReader,
    ConnectionLimits,
    HeadWithBody,
    Pieces,
    Spare,
    sweep,
)
from service.rest.middleware import (
    BODY_TIMED,
    CLIENT_GONE,
    REFUSED,
    TRANSFER_ENCODING,
    transfer_coding_refusal,
)

# The one uvicorn release this subclass of its private ``HttpToolsProtocol`` was written and
# tested against (pyproject.toml pins it; tests/service/rest/test_protocol.py checks both).
TESTED_UVICORN = "0.54.0"
# The framing a chunked body's chunk may take: a 16-digit size line, its CRLFs, a short
# extension. Beyond it, extensions and trailer fields are bytes the parser reads (and httptools
# buffers, for a trailer field) that no body limit counts.
FRAMING_PER_CHUNK = 64
# Requests a connection may have parsed and waiting behind the one being answered; one more is
# refused (429) once those are answered, and the connection closed (Node.js CVE-2013-4450: a
# client pipelining without reading the answers; nginx closes such a connection too).
PIPELINE_DEPTH = 32
# Where a request's trailer fields go once its headers are whole: nowhere (one for every
# connection, as it holds nothing).
DROPPED: deque[tuple[bytes, bytes]] = deque(maxlen=0)


def supported() -> bool:
    """Whether the installed uvicorn is the one this protocol was tested with."""
    return uvicorn.__version__ == TESTED_UVICORN


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
    sweeper: asyncio.Task[None] | None = None  # one per server (class), see sweep
    spare: Spare  # one per server (class), for BodyReader

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
        # The request being answered: ``cycle`` is the last one parsed, which differs from it
        # while requests are pipelined behind it.
        self._answering: Any = None
        # A refusal of a pipelined request, held until the requests before it are answered.
        self._held: tuple[int, str] | None = None
        # Whether _read_rest_of_body is still to decide, once per request, who reads the rest
        # of its body: set by the request's headers, cleared by the decision (at the route's
        # first read, ``ReadWhenAsked``) or the request's end.
        self._body_undecided = False
        self._body_bytes = 0  # of the current request's body, parsed so far
        self._in_body = False  # from the end of the headers to the end of the message
        self._body_phase_bytes = 0  # received in the reads after the one ending the headers
        self._chunks = 0  # chunk headers parsed in the current request's body
        self._writer: HeadWithBody | None = None  # what the current request's answer goes to

    # ---- connection ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = ReadWhenAsked(transport, self)
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
            cls.sweeper = self.loop.create_task(sweep(self.connections))

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
        cycle, task = self._answering, self._task
        gone = cycle is not None and not cycle.response_complete
        super().connection_lost(exc)
        if gone and task is not None and not task.done():
            cycle.disconnected = True  # uvicorn marks only the last request parsed
            cycle.scope[CLIENT_GONE] = True
            task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._held is not None:
            return  # the parser failed: nothing after the refused request is read
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
        elif self._in_body:  # what is not body is framing: bounded by the chunks it frames
            self._body_phase_bytes += len(data)
            framing = self._body_phase_bytes - self._body_bytes
            if framing > self.limits.max_header_bytes + FRAMING_PER_CHUNK * self._chunks:
                self._refuse(
                    431,
                    "chunked framing (chunk extensions, trailer fields) above "
                    f"{self.limits.max_header_bytes} bytes beyond {FRAMING_PER_CHUNK} per chunk "
                    "(GELU_MAX_HEADER_BYTES)",
                )

    def _read_rest_of_body(self) -> None:
        """Have the rest of a large body framed by Content-Length read into the ``bytes`` the
        app will be handed, after what the app has not read yet of it (``BodyReader``); the
        app then gets the body in one message. A smaller, chunked or over-limit body stays
        with the parser (an over-limit one was refused by the app, by its Content-Length)."""
        length = None
        cycle: Any = self.cycle
        for name, value in cycle.scope["headers"]:
            if name == b"content-length":
                length = int(value)  # digits: the parser has checked them
            elif name == b"transfer-encoding":
                return
        if length is None or length > self.limits.max_body_bytes or cycle.response_complete:
            return
        rest = length - self._body_bytes
        if rest < DIRECT_BODY_BYTES:
            return
        unread = bytes(cycle.body)
        reader = BodyReader(self, len(unread) + rest, unread, self.spare)
        cycle.body = bytearray()
        cycle.message_event.clear()  # nothing to read until the body is whole
        self.transport.set_protocol(reader)

    def body_read(self, body: bytes) -> None:
        """The ``BodyReader`` has read the whole body: hand it to the app as the request's
        last message, and parse the next request with a new parser (this one is still inside
        the body it did not see)."""
        self.transport.set_protocol(self)
        cycle: Any = self.cycle
        if not cycle.response_complete:
            pieces = cycle.body = Pieces()
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
            writer = self._writer = HeadWithBody(self.transport)
        writer.answer(cycle)
        cycle.transport = writer
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._task = task
        self._answering = cycle

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()  # a response without a body write (HEAD) has its head held
        super().on_response_complete()
        held = self._held
        if held is not None and not self.pipeline and self._answering.response_complete:
            self._held = None
            self._refuse(*held)

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
        if len(self.pipeline) >= PIPELINE_DEPTH:  # uvicorn would queue it behind them
            raise _Refusal(
                429, f"more than {PIPELINE_DEPTH} requests pipelined ahead of their answers: "
                "read the answers, or open another connection"
            )  # fmt: skip
        if len(headers) > limits.max_headers:
            raise _Refusal(431, f"more than {limits.max_headers} headers (GELU_MAX_HEADERS)")
        # The headers came in the data received since they began: when that is within the
        # limit, so are they, and they need not be summed (a small request's usual case).
        if self._unparsed_bytes + self._chunk_bytes > limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in headers)
            if size > limits.max_header_bytes:
                raise _Refusal(431, self._header_limit_message())
        # Transfer-Encoding as anything but "chunked" alone: the parser would read the body as
        # chunked whatever else it names (``transfer_coding_refusal``).
        codings = [value for name, value in headers if name == TRANSFER_ENCODING]
        if codings and (refusal := transfer_coding_refusal(codings)) is not None:
            raise _Refusal(refusal.status_code, refusal.message)
        # uvicorn parses the target only now, and a target it cannot parse (CONNECT's
        # authority-form, an absolute URL with a bad host) or one naming no path ("http://a")
        # raised from this callback: no answer and an ERROR traceback per request.
        url = self.url
        if url[:1] != b"/":  # not origin-form: rare, so the usual request pays one compare
            try:
                path = httptools.parse_url(url).path
            except httptools.HttpParserInvalidURLError:
                path = None
            if path is None:
                raise _Refusal(400, "invalid HTTP request: the request target names no path")
        self._reading_headers = False
        self._body_undecided = True
        # The read that ended the headers is not counted: where in it they ended is unknown
        # (it may hold an earlier pipelined request's body too), and it is one read at most.
        self._in_body, self._body_phase_bytes, self._chunks = True, -self._chunk_bytes, 0
        self._arm(limits.body_timeout_seconds, "body", "GELU_BODY_TIMEOUT_SECONDS")
        # The body's deadline is kept here, per connection: the app need not keep its own.
        self.scope[BODY_TIMED] = True  # type: ignore[literal-required]
        super().on_headers_complete()
        # uvicorn appends every field the parser reports to the list the scope holds as the
        # request's headers: trailer fields would grow it past the checks above and reach the
        # app as headers after its credentials were decided. They go nowhere (RFC 9110 lets a
        # recipient drop them); what they cost in bytes is bounded in data_received.
        self.headers = DROPPED  # type: ignore[assignment]

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle.body) is not Pieces:  # uvicorn's bytearray: a new cycle, or after a read
            cycle.body = Pieces()
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._deadline = None
        self._body_undecided = False
        self._in_body = False
        super().on_message_complete()

    # ---- refusals ------------------------------------------------------------------------------

    def _arm(self, seconds: float, what: str, variable: str) -> None:
        self._deadline = self.loop.time() + seconds
        self._deadline_phase = (seconds, what, variable)  # the message is built if it is needed

    def check_deadline(self, now: float) -> None:
        """Refuse the request (408) if its current phase is past its deadline; not while
        requests wait in the pipeline, when this one is not being read (``ReadWhenAsked``)."""
        if self._deadline is not None and now > self._deadline and not self.pipeline:
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
        cycle, answering = self.cycle, self._answering
        if (
            answering is not None
            and not answering.response_complete
            and (self._reading_headers or answering is not cycle)
        ):
            # Requests pipelined before this one are still being answered: writing now would
            # answer the first of them with this refusal (and cancel it). They are answered
            # first, then this one (RFC 9112 9.3.2); it and nothing after it is run.
            self._held = (status, message)
            if not self._reading_headers:
                self.pipeline = deque(p for p in self.pipeline if p[0] is not cycle)
            return
        # ``cycle`` is the last request's until a new one's headers are whole: a request
        # refused before then (on a kept-alive connection) is answered once that one's is.
        if (
            cycle is None
            or not cycle.response_started
            or (self._reading_headers and cycle.response_complete)
        ):
            if cycle is not None and not cycle.response_started:  # in progress: counted so
                cycle.scope[REFUSED] = status  # type: ignore[literal-required]
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


class ReadWhenAsked(FlowControl):
    """uvicorn's flow control of a connection, which its request's ``receive`` calls on every
    read, before it waits: the route's first read of a body decides who reads the rest of it
    (``GuardedHttpProtocol._read_rest_of_body``).

    Not before: the route checks the request's credentials and its body's limit, then reads; a
    body its route never reads (refused, or not asked for yet) is given no buffer, and the
    parser stops reading past uvicorn's 64 KiB of it. While requests wait in the pipeline, the
    one being parsed is not the one reading (nor is it, after a response: uvicorn resumes
    reading then too), so nothing is decided."""

    def __init__(self, transport: asyncio.Transport, http: GuardedHttpProtocol) -> None:
        super().__init__(transport)
        self.http = http
        self.held_for_pipeline = False  # reading stayed paused while requests were pipelined

    def resume_reading(self) -> None:
        http = self.http
        if http.pipeline:
            # uvicorn reads on after every answer, and parses a whole read (64 KiB: thousands
            # of small requests) into the pipeline: nothing more is read while it holds any.
            self.held_for_pipeline = self.read_paused
            return
        if http._body_undecided:
            http._body_undecided = False
            http._read_rest_of_body()
        if self.read_paused:  # as uvicorn's
            self.read_paused = False
            self._transport.resume_reading()
            if self.held_for_pipeline and http._deadline is not None:
                http._arm(*http._deadline_phase)  # its phase's time starts as reading does
        self.held_for_pipeline = False


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn builds per connection, with ``limits``."""
    attributes = {"limits": limits, "spare": Spare(SPARE_BYTES)}
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), attributes)
