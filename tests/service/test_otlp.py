"""OTLP/HTTP written directly: the export request a collector decodes is the one the
OpenTelemetry SDK's encoder makes of the same traces, and it reaches a receiver on loopback
as the OTLP/HTTP exporter's environment variables say."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp_pb
from opentelemetry.sdk.trace import ReadableSpan

from service import otlp
from service.tracing import RequestTrace, Tracing, batch_of

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _finished(tracing: Tracing, carrier: dict[str, str] | None) -> RequestTrace:
    traced = tracing.sample("POST /v1/models/{name}:predict", carrier)
    assert traced is not None
    began = time.perf_counter_ns()
    attributes = {"http.request.method": "POST", "url.path": "/v1/models/m:predict",
                  "http.route": "/v1/models/{name}:predict", "triton.model_name": "m"}  # fmt: skip
    traced.open(began, attributes)
    traced.since("decode", began)
    return traced


def _traces(tracing: Tracing) -> list[Any]:
    """Traces of every shape the service makes: a root, a remote parent with a tracestate
    and a 5xx, two requests sharing a batch (linked), attributes of every scalar type."""
    root = _finished(tracing, None)
    parented = _finished(tracing, {"traceparent": PARENT, "tracestate": "a=1,b=2"})
    attributes = {"triton.model_name": "m", "gelu.batch_size": 2, "gelu.ratio": 0.25,
                  "gelu.flag": True, "gelu.off": False, "gelu.negative": -3,
                  "gelu.empty": ""}  # fmt: skip
    now = time.perf_counter_ns()
    batch = batch_of([root, parented], now, 1234, attributes)
    for traced, status in ((root, 200), (parented, 503)):
        traced.ran(now - 99, now, 1234, batch)
        traced.since("encode", now)
        traced.attributes.update({"http.response.status_code": status, "gelu.request_id": "r"})
        traced.status, traced.end_ns = status, time.perf_counter_ns()
    lone = _finished(tracing, None)
    lone.ran(now, now, 5, None)
    lone.status, lone.end_ns = 200, time.perf_counter_ns()
    return [batch, root, parented, lone]


@pytest.fixture
def tracing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracing]:
    """A tracer that samples every request and exports nothing by itself."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,k8s.pod.uid=p")
    made = Tracing([])
    yield made
    made.shutdown()


def test_the_request_decodes_as_the_sdks_encoding_of_the_same_spans(tracing: Tracing) -> None:
    exporting = tracing.exporting
    spans: list[ReadableSpan] = []
    encoded: list[bytes] = []
    for finished in _traces(tracing):
        finished.spans(exporting, spans)
        finished.encode(exporting.encoder, encoded)
    assert len(encoded) == len(spans) == 1 + 2 * 5 + 4
    ours = otlp_pb.ExportTraceServiceRequest.FromString(exporting.encoder.request(encoded))
    sdks = otlp_pb.ExportTraceServiceRequest.FromString(encode_spans(spans).SerializeToString())
    assert ours == sdks
    # What the comparison covers, read from the decoded request itself.
    resource = {a.key: a.value.string_value for a in ours.resource_spans[0].resource.attributes}
    assert resource["deployment.environment"] == "test"
    decoded = ours.resource_spans[0].scope_spans[0].spans
    by_name = {s.name: s for s in decoded}
    assert by_name["batch"].attributes[3].value.bool_value is True
    server = [s for s in decoded if s.kind == s.SPAN_KIND_SERVER]
    assert [s.status.code for s in server] == [0, 2, 0]
    assert server[1].trace_state == "a=1,b=2" and server[1].parent_span_id.hex() == PARENT[36:52]
    assert [len(s.links) for s in decoded if s.name == "compute"] == [1, 1, 0]


def test_an_empty_batch_of_traces_encodes_what_the_sdk_would(tracing: Tracing) -> None:
    batch = batch_of([_finished(tracing, None)], 10, 20, {})
    assert batch is not None
    spans: list[ReadableSpan] = []
    encoded: list[bytes] = []
    batch.spans(tracing.exporting, spans)
    batch.encode(tracing.exporting.encoder, encoded)
    ours = otlp_pb.ExportTraceServiceRequest.FromString(tracing.exporting.encoder.request(encoded))
    assert ours == otlp_pb.ExportTraceServiceRequest.FromString(
        encode_spans(spans).SerializeToString()
    )


class Received:
    """What a loopback OTLP/HTTP endpoint was sent."""

    def __init__(self, failures: int) -> None:
        self.failures = failures  # answered 503 before any is taken
        self.requests: list[tuple[str, dict[str, str], bytes]] = []


@contextmanager
def _receiver(failures: int = 0) -> Iterator[tuple[Received, int]]:
    got = Received(failures)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if got.failures:
                got.failures -= 1
                status = 503
            else:
                got.requests.append((self.path, dict(self.headers.items()), body))
                status = 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_exports_reach_the_endpoint_as_the_environment_says(
    tracing: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _receiver(failures=1) as (got, port):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}/")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=gelu,authorization=k%20v")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        exporter = otlp.HttpExporter()
        tracing.exporting.exporters.append(exporter)
        for finished in _traces(tracing)[1:]:  # the batch queued itself
            tracing.exporting.put(finished)
        tracing.flush()
        exporter.shutdown()
    assert len(got.requests) == 1  # the 503 retried, once taken
    path, headers, body = got.requests[0]
    assert path == "/v1/traces"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Content-Encoding"] == "gzip"
    assert (headers["x-team"], headers["authorization"]) == ("gelu", "k v")
    request = otlp_pb.ExportTraceServiceRequest.FromString(gzip.decompress(body))
    names = [s.name for s in request.resource_spans[0].scope_spans[0].spans]
    assert names.count("POST /v1/models/{name}:predict") == 3 and names.count("batch") == 1


def test_a_lost_endpoint_fails_the_export_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    with _receiver() as (_, port):
        pass  # closed: nothing listens on the port now
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "200")
    exporter = otlp.HttpExporter()
    assert exporter.export(b"") is False


def test_the_timeout_is_milliseconds_as_the_specification_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT is milliseconds, default 10000 (the Python SDK
    reads seconds): an endpoint that never answers is given up at that timeout, and a value
    that is not a positive number is refused at start-up, naming the variable."""
    from service.errors import StartupError

    assert otlp.HttpExporter().timeout == 10.0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1500")
    assert otlp.HttpExporter().timeout == 1.5
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250")  # the signal's own first
    assert otlp.timeout_seconds() == 0.25
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/")
        exporter = otlp.HttpExporter()
        gave_up: list[bool] = []
        # Read as seconds, the export would wait 250 s: the join only bounds the wait.
        waiting = threading.Thread(target=lambda: gave_up.append(exporter.export(b"")))
        waiting.start()
        waiting.join(60)
        exporter.close()
    assert gave_up == [False]
    for wrong in ("ten", "0", "-5", "inf"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", wrong)
        with pytest.raises(StartupError, match=f"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT={wrong}"):
            otlp.HttpExporter()
