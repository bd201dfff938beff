"""OTLP/HTTP export of this service's spans, written directly in the protobuf wire format.

The OpenTelemetry exporter builds a protobuf message per span and per attribute in Python
(about 17 µs a span, docs/performance.md, issue 65); the spans here have one fixed shape, so
``Encoder`` writes each span's bytes straight from a trace's ids, marks and attributes, and
``HttpExporter`` posts the ``ExportTraceServiceRequest`` they make as the OpenTelemetry
specification's OTLP/HTTP exporter does (``application/x-protobuf`` to ``/v1/traces``). The
messages are those of opentelemetry-proto (``opentelemetry/proto/trace/v1/trace.proto``); a
collector decodes the same request the SDK's encoder would send (``tests/service/test_otlp.py``
compares them message by message).

Configured as the SDK's exporter is, from ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``_HEADERS``, ``_TIMEOUT`` (milliseconds, default 10000, as the specification says; the Python
SDK reads seconds, opentelemetry-python#4044), ``_COMPRESSION`` (``gzip``, ``deflate``,
``none``), ``_CERTIFICATE``, ``_CLIENT_CERTIFICATE`` and ``_CLIENT_KEY``.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import ssl
import struct
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.util.re import parse_env_headers

from service.errors import StartupError

logger = logging.getLogger("gelu_serve")
# Span.SpanKind and SpanFlags (trace.proto): a span's flags say whether its parent is remote.
KIND_INTERNAL, KIND_SERVER = 1, 2
_LOCAL_PARENT, _REMOTE_PARENT = 0x100, 0x300
_BYTE = [bytes((n,)) for n in range(128)]
_TIMES = struct.Struct("<BQBQ")  # start_time_unix_nano (7) and end_time_unix_nano (8), fixed64
_FLAGS = {p: b"\x85\x01" + struct.pack("<I", p) for p in (_LOCAL_PARENT, _REMOTE_PARENT)}
_LINK_FLAGS = b"\x35" + struct.pack("<I", _LOCAL_PARENT)
_STATUS_UNSET, _STATUS_ERROR = b"\x7a\x00", b"\x7a\x02\x18\x02"  # Status{} and {code: ERROR}
_RETRY_STATUSES = frozenset({429, 502, 503, 504})  # the OTLP specification's retryable ones


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` its key's bytes)."""
    return tag + _varint(len(payload)) + payload


def _value(value: Any) -> bytes:
    """An ``AnyValue`` (the oneof always set, as the SDK's encoder sets it)."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFF_FFFF_FFFF_FFFF)  # int64, two's complement
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Iterable):  # ArrayValue{values}
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    return b""  # None: an empty AnyValue


class Encoder:
    """Spans of one resource and instrumentation scope, as bytes of an export request."""

    def __init__(self, resource: Mapping[str, Any], scope_name: str, scope_version: str) -> None:
        self._keys: dict[str, bytes] = {}  # an attribute's key, encoded once
        resource_bytes = self.attributes(resource, b"\x0a")
        scope = _field(b"\x0a", scope_name.encode()) + _field(b"\x12", scope_version.encode())
        self._resource = _field(b"\x0a", resource_bytes)  # ResourceSpans.resource
        self._scope = _field(b"\x0a", scope)  # ScopeSpans.scope

    def attributes(self, attributes: Mapping[str, Any], tag: bytes = b"\x4a") -> bytes:
        """``KeyValue``s as the repeated field ``tag`` (a span's attributes: 9)."""
        keys, out = self._keys, []
        for key, value in attributes.items():
            encoded = keys.get(key)
            if encoded is None:
                encoded = keys[key] = _field(b"\x0a", key.encode())
            out.append(_field(tag, encoded + _field(b"\x12", _value(value))))
        return b"".join(out)

    def span(
        self,
        trace_id: int,
        span_id: int,
        trace_state: str,
        parent_id: int | None,
        remote_parent: bool,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        links: Iterable[tuple[int, int]] = (),
        error: bool = False,
    ) -> bytes:
        """One ``Span`` (times since the epoch, ns), as ``ScopeSpans.spans`` holds it."""
        parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
        if trace_state:
            parts.append(_field(b"\x1a", trace_state.encode()))
        if parent_id is not None:
            parts += (b"\x22\x08", parent_id.to_bytes(8, "big"))
        parts += (_field(b"\x2a", name.encode()), b"\x30", _BYTE[kind],
                  _TIMES.pack(0x39, start_ns, 0x41, end_ns))  # fmt: skip
        if attributes:
            parts.append(self.attributes(attributes))
        for link_trace, link_span in links:  # Link{trace_id, span_id, flags}
            parts += (b"\x6a\x21\x0a\x10", link_trace.to_bytes(16, "big"), b"\x12\x08",
                      link_span.to_bytes(8, "big"), _LINK_FLAGS)  # fmt: skip
        parts.append(_STATUS_ERROR if error else _STATUS_UNSET)
        parts.append(_FLAGS[_REMOTE_PARENT if remote_parent else _LOCAL_PARENT])
        return _field(b"\x12", b"".join(parts))

    def request(self, spans: list[bytes]) -> bytes:
        """An ``ExportTraceServiceRequest`` of ``span``'s results."""
        scope_spans = _field(b"\x12", self._scope + b"".join(spans))
        return _field(b"\x0a", self._resource + scope_spans)


class HttpExporter:
    """Posts encoded export requests to an OTLP/HTTP endpoint over one kept connection."""

    def __init__(self) -> None:
        env = _environment
        # The traces' endpoint is used as it is; the general one gets the signal's path.
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
            f"{base.removesuffix('/')}/v1/traces"
        )
        url = urlsplit(endpoint)
        self.endpoint = endpoint
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self.timeout = timeout_seconds()
        self.compression = env("COMPRESSION", "none").strip().lower()
        headers = {"Content-Type": "application/x-protobuf", "User-Agent": "gelu-serve"}
        headers.update(parse_env_headers(env("HEADERS", ""), liberal=True))
        if self.compression in ("gzip", "deflate"):
            headers["Content-Encoding"] = self.compression
        self.headers = headers
        self._context: ssl.SSLContext | None = None
        if self._https:
            self._context = ssl.create_default_context(cafile=env("CERTIFICATE", "") or None)
            certificate = env("CLIENT_CERTIFICATE", "")
            if certificate:
                self._context.load_cert_chain(certificate, env("CLIENT_KEY", "") or None)
        self._connection: http.client.HTTPConnection | None = None

    def export(self, body: bytes) -> bool:
        """Post one export request; retried (with backoff, within the timeout) on a lost
        connection or a status the specification calls retryable. Whether it was taken."""
        if self.compression == "gzip":
            body = gzip.compress(body)
        elif self.compression == "deflate":
            body = zlib.compress(body)
        deadline, pause = time.monotonic() + self.timeout, 0.0
        while True:
            try:
                status = self._post(body)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                status, reason = 0, str(exc)
            else:
                if 200 <= status < 300:
                    return True
                reason = f"HTTP {status}"
            retry = status == 0 or status in _RETRY_STATUSES
            if not retry or time.monotonic() + pause > deadline:
                logger.warning("OTLP export to %s failed: %s", self.endpoint, reason)
                return False
            time.sleep(pause)
            pause = min(max(2 * pause, 0.5), 8.0)

    def _post(self, body: bytes) -> int:
        connection = self._connection
        if connection is None:
            if self._https:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout, context=self._context
                )
            else:
                connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout
                )
            self._connection = connection
        connection.request("POST", self._path, body, self.headers)
        response = connection.getresponse()
        response.read()  # the connection is kept for the next export
        return response.status

    def close(self) -> None:
        """Close the kept connection (a later export opens another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def shutdown(self) -> None:
        """Nothing more will be exported."""
        self.close()


def timeout_seconds() -> float:
    """``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` in seconds: the specification gives it in
    milliseconds (default 10000); both exporters are handed it converted."""
    name = next(
        (n for n in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
         if os.environ.get(n)),
        None,
    )  # fmt: skip
    raw = os.environ[name] if name else "10000"
    try:
        milliseconds = float(raw)
    except ValueError:
        milliseconds = -1.0
    if not 0 < milliseconds < float("inf"):
        raise StartupError(f"{name}={raw}: give milliseconds, above 0")
    return milliseconds / 1000


def _environment(name: str, default: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``, else default."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or default
    )
