"""OpenTelemetry traces, exported over OTLP from a real server to a receiver on loopback, and
tritonclient changing which requests a running server traces (the settings themselves:
test_trace_settings.py)."""

from __future__ import annotations

import concurrent.futures
import http.client
import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from tests.helpers import DIGITS
from tests.servers import ServedFaces, grpc_server, wait_until

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
STAGES = {"decode", "queue", "compute", "encode"}


class Receiver:
    """The spans an OTLP endpoint on loopback has received, decoded from real protobuf."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def take(self, request: otlp.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
                    self.resources.extend(resource for _ in scope_spans.spans)

    def wait(self, done: Any, seconds: float = 15) -> list[Any]:
        """The spans received, once ``done(spans)`` holds of them."""

        def received() -> list[Any] | None:
            spans = self.received()
            return spans if done(spans) else None

        return wait_until(received, seconds, 0.05, "spans to arrive",
                          lambda: f"spans: {[s.name for s in self.received()]}")  # fmt: skip

    def received(self) -> list[Any]:
        """The spans received so far."""
        with self.lock:
            return list(self.spans)


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[Receiver, str, str]]:
    """An OTLP receiver of each protocol: (its spans, protocol, endpoint)."""
    with otlp_receiver(request.param) as (got, endpoint):
        yield got, request.param, endpoint


@contextmanager
def otlp_receiver(protocol: str) -> Iterator[tuple[Receiver, str]]:
    """An OTLP receiver of ``protocol`` on loopback: (its spans, its endpoint)."""
    got = Receiver()
    if protocol == "grpc":

        class Service(otlp_grpc.TraceServiceServicer):
            def Export(self, message: Any, context: Any) -> Any:
                got.take(message)
                return otlp.ExportTraceServiceResponse()

        server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        otlp_grpc.add_TraceServiceServicer_to_server(Service(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield got, f"http://127.0.0.1:{port}"
        finally:
            server.stop(0)
        return

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces"
            got.take(otlp.ExportTraceServiceRequest.FromString(body))
            answer = otlp.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def _scrape(port: int) -> str:
    """/metrics as an OpenMetrics scraper asks for it (exemplars included)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    accept = "application/openmetrics-text; version=1.0.0"
    connection.request("GET", "/metrics", headers={"Accept": accept})
    response = connection.getresponse()
    assert response.getheader("content-type", "").startswith("application/openmetrics-text")
    return response.read().decode()


def _attributes(span: Any) -> dict[str, Any]:
    values = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        values[a.key] = getattr(a.value, kind)
    return values


def _children(spans: list[Any], parent: Any) -> dict[str, Any]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id}


@pytest.mark.slow
def test_spans_reach_an_otlp_receiver_from_both_faces(
    model_repository: Path, receiver: tuple[Receiver, str, str]
) -> None:
    """Through a real server: each inference request's span sits under the caller's trace,
    with one child per stage; requests that shared a run link to its batch span, and it to
    them; a gRPC call is traced as an HTTP one is."""
    import tritonclient.grpc as grpcclient

    got, protocol, endpoint = receiver
    with grpc_server(
        model_repository,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="gelu-test",
    ) as server:
        parent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        body = b'{"instances": [' + ",".join(["[" + ",".join(["0.5"] * 64) + "]"]).encode() + b"]}"
        status, _ = server.http_post(
            "/v1/models/digits-mlp:predict",
            body,
            {"Content-Type": "application/json", "traceparent": parent, "X-Request-ID": "t-1"},
        )
        assert status == 200
        client = grpcclient.InferenceServerClient(server.address)
        x = grpcclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.ascontiguousarray(DIGITS[:1]))
        client.infer("digits-mlp", [x], headers={"traceparent": parent})
        streamed: list[Any] = []
        client.start_stream(lambda result, error: streamed.append(error or result),
                            headers={"traceparent": parent})  # fmt: skip
        client.async_stream_infer("digits-mlp", [x], request_id="s-1")
        client.stop_stream()
        assert len(streamed) == 1 and not isinstance(streamed[0], Exception)
        scraped = _scrape(server.http_port)  # before other requests replace the exemplars
        # Many at once, each its own trace: some share a run.
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(
                lambda i: server.http_post("/v1/models/digits-mlp:predict", body,
                                           {"Content-Type": "application/json"}),
                range(64),
            ))  # fmt: skip
        assert all(status == 200 for status, _ in answers)
        spans = got.wait(
            lambda spans: (
                sum(s.kind == s.SPAN_KIND_SERVER for s in spans) >= 67
                and any(s.name == "batch" for s in spans)
            )
        )

    by_caller = [
        s for s in spans if s.trace_id.hex() == CALLER_TRACE and s.kind == s.SPAN_KIND_SERVER
    ]
    (http_span,) = [s for s in by_caller if s.name == "POST /v1/models/{name}:predict"]
    (grpc_span,) = [s for s in by_caller if s.name == "inference.GRPCInferenceService/ModelInfer"]
    (stream_span,) = [s for s in by_caller if s.name.endswith("/ModelStreamInfer")]
    assert _attributes(stream_span)["gelu.request_id"] == "s-1"  # the streamed request's id
    for span in (http_span, grpc_span, stream_span):
        assert span.parent_span_id.hex() == CALLER_SPAN  # under the caller's span
        children = _children(spans, span)
        assert set(children) == STAGES
        for child in children.values():
            assert span.start_time_unix_nano <= child.start_time_unix_nano
            assert child.start_time_unix_nano <= child.end_time_unix_nano <= span.end_time_unix_nano
        assert _attributes(span)["triton.model_name"] == "digits-mlp"
        assert _attributes(span)["triton.model_version"] == "2"
    http_attributes = _attributes(http_span)
    assert http_attributes["http.response.status_code"] == 200
    assert http_attributes["http.route"] == "/v1/models/{name}:predict"
    assert http_attributes["gelu.request_id"] == "t-1"
    assert _attributes(grpc_span)["rpc.grpc.status_code"] == 0
    assert got.resources[0]["service.name"] == "gelu-test"
    # Metrics meet traces: the caller's trace id is an exemplar of both faces' latency.
    exemplars = [line for line in scraped.splitlines() if f'trace_id="{CALLER_TRACE}"' in line]
    assert any('endpoint="/v1/models/{name}:predict"' in line for line in exemplars)
    assert any('endpoint="grpc:ModelInfer"' in line for line in exemplars)

    batches = [s for s in spans if s.name == "batch"]
    shared = max(batches, key=lambda s: len(s.links))
    assert len(shared.links) >= 2 and _attributes(shared)["gelu.batch_requests"] >= 2
    requests = {s.span_id: s for s in spans if s.kind == s.SPAN_KIND_SERVER}
    for link in shared.links:  # each request in the run links back to it from its compute
        compute = _children(spans, requests[link.span_id])["compute"]
        assert [(k.trace_id, k.span_id) for k in compute.links] == [
            (shared.trace_id, shared.span_id)
        ]


@pytest.mark.slow
def test_tritonclient_changes_the_running_servers_tracing(model_repository: Path) -> None:
    """tritonclient's trace settings over gRPC and HTTP change which requests a running
    server exports spans for."""
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with (
        otlp_receiver("http/protobuf") as (got, endpoint),
        grpc_server(model_repository, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **env) as server,
    ):
        _change_tracing(got, server)


def _change_tracing(got: Receiver, server: ServedFaces) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc_client = grpcclient.InferenceServerClient(server.address)

    def predict(model: str, times: int) -> None:
        x = httpclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(DIGITS[:1])
        for _ in range(times):
            http.infer(model, [x])

    def traced(model: str) -> int:
        spans = got.wait(lambda spans: True)
        return sum(s.kind == s.SPAN_KIND_SERVER and _attributes(s)["triton.model_name"]
                   == model for s in spans)  # fmt: skip

    answer = grpc_client.update_trace_settings(settings={"trace_rate": "2"}, as_json=True)
    assert answer["settings"]["trace_rate"]["value"] == ["2"]
    assert http.get_trace_settings()["trace_rate"] == "2"  # one server, one setting
    predict("digits-mlp", 4)
    got.wait(lambda spans: traced("digits-mlp") >= 2)
    time.sleep(0.3)  # any third would have come by now
    assert traced("digits-mlp") == 2  # one in two
    http.update_trace_settings("digits-mlp", {"trace_level": ["OFF"]})
    assert grpc_client.get_trace_settings("digits-mlp", as_json=True)["settings"]["trace_level"][
        "value"
    ] == ["OFF"]
    predict("digits-mlp", 4)
    predict("digits-mlp-tanh", 2)
    got.wait(lambda spans: traced("digits-mlp-tanh") >= 1)
    time.sleep(0.3)
    assert traced("digits-mlp") == 2  # off for this model alone


def test_a_request_the_sampler_drops_makes_no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled out, a request gets no RequestTrace: no stage or batch span is made for it."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    from service.tracing import Tracing

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracing = Tracing([ConsoleSpanExporter()])
    assert tracing.sample("r") is None
    tracing.shutdown()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    tracing = Tracing([ConsoleSpanExporter()])
    sampled = tracing.sample("r")
    assert sampled is not None and sampled.context().trace_flags.sampled
    tracing.shutdown()


def _memory_traced_client(
    settings_factory: Any, monkeypatch: pytest.MonkeyPatch, **env: str
) -> Any:
    """A TestClient of an app whose tracing exports into memory (``OTEL_*`` from ``env``)."""
    from fastapi.testclient import TestClient
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.rest.app import create_app

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")  # exported when the test flushes
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = TestClient(create_app(settings_factory()))
    client.__enter__()
    memory = InMemorySpanExporter()
    client.app.state.dataplane.tracing.exporting.exporters[:] = [memory]  # type: ignore[attr-defined]
    return client, memory


def test_a_request_sampled_out_makes_no_span_and_a_parent_is_honoured(
    settings_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``parentbased_always_off`` a request with no parent is sampled out and nothing of
    it reaches the exporter; a caller's sampled ``traceparent`` is honoured (its span is under
    the caller's), and one whose flags say not sampled is not traced either."""
    client, memory = _memory_traced_client(
        settings_factory, monkeypatch, OTEL_TRACES_SAMPLER="parentbased_always_off"
    )
    try:
        body = {"instances": DIGITS[:1].tolist()}
        for _ in range(5):
            assert client.post("/v1/models/digits-mlp:predict", json=body).status_code == 200
        unsampled = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}
        client.post("/v1/models/digits-mlp:predict", json=body, headers=unsampled)
        tracing = client.app.state.dataplane.tracing
        tracing.flush()
        assert memory.get_finished_spans() == ()  # nothing made for six requests
        sampled = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
        client.post("/v1/models/digits-mlp:predict", json=body, headers=sampled)
        tracing.flush()
        spans = memory.get_finished_spans()
        (server,) = [s for s in spans if s.kind.name == "SERVER"]
        assert server.context.trace_id == int(CALLER_TRACE, 16)
        assert server.parent is not None and server.parent.span_id == int(CALLER_SPAN, 16)
        assert {s.name for s in spans if s.parent == server.context} == STAGES
    finally:
        client.__exit__(None, None, None)


def test_a_full_export_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces finished while the queue holds OTEL_BSP_MAX_QUEUE_SIZE are dropped and counted;
    the queued ones are still exported, each as its span and its stages'."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.tracing import Tracing

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "3")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")  # the thread waits for a flush
    memory = InMemorySpanExporter()
    tracing = Tracing([memory])
    try:
        for _ in range(5):
            traced = tracing.sample("r")
            assert traced is not None
            began = time.perf_counter_ns()
            traced.open(began, {"k": 1}).mark("decode", began, began + 10)
            traced.end(200, {}, began + 20)
        assert tracing.exporting.dropped == 2
        tracing.flush()
        spans = memory.get_finished_spans()
        assert sorted(s.name for s in spans) == ["decode"] * 3 + ["r"] * 3
        tracing.flush()
        assert len(memory.get_finished_spans()) == 6  # the queue was emptied once
    finally:
        tracing.shutdown()


def test_traces_dropped_on_a_full_queue_are_a_metric(
    settings_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests traced while the export queue is full are counted in
    ``gelu_traces_dropped_total``, as a scrape reads it; a flush makes room again."""
    client, memory = _memory_traced_client(
        settings_factory, monkeypatch, OTEL_TRACES_SAMPLER="always_on", OTEL_BSP_MAX_QUEUE_SIZE="2"
    )

    def dropped() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("gelu_traces_dropped_total "):
                return float(line.split()[1])
        raise AssertionError("gelu_traces_dropped_total is not exported")

    try:
        body = {"instances": DIGITS[:1].tolist()}
        assert dropped() == 0
        for _ in range(5):  # one at a time: no batch spans, one trace each
            assert client.post("/v1/models/digits-mlp:predict", json=body).status_code == 200
        assert dropped() == 3
        client.app.state.dataplane.tracing.flush()
        assert client.post("/v1/models/digits-mlp:predict", json=body).status_code == 200
        assert dropped() == 3
        client.app.state.dataplane.tracing.flush()
        assert sum(s.kind.name == "SERVER" for s in memory.get_finished_spans()) == 3
    finally:
        client.__exit__(None, None, None)


def test_a_misnamed_sampler_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK would fall back to always on; here the variable is named in the refusal."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.errors import StartupError
    from service.tracing import Tracing

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "one percent")
    with pytest.raises(StartupError, match="OTEL_TRACES_SAMPLER_ARG"):
        Tracing([InMemorySpanExporter()])
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "sometimes")
    with pytest.raises(StartupError, match="OTEL_TRACES_SAMPLER=sometimes"):
        Tracing([InMemorySpanExporter()])


def test_the_grpc_exporters_deadline_is_the_timeout_in_milliseconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_TIMEOUT is milliseconds (the specification's unit); the SDK's
    gRPC exporter, which would read it as seconds, is handed it converted: the receiver sees
    a deadline of at most 2.5 s for 2500 (2500 s before)."""
    from service.tracing import Tracing

    remaining: list[float | None] = []

    class Service(otlp_grpc.TraceServiceServicer):
        def Export(self, message: Any, context: Any) -> Any:
            remaining.append(context.time_remaining())
            return otlp.ExportTraceServiceResponse()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    otlp_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    for name, value in {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
                        "OTEL_TRACES_SAMPLER": "always_on",
                        "OTEL_BSP_SCHEDULE_DELAY": "3600000"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    tracing = Tracing.from_environment()
    assert tracing is not None
    try:
        traced = tracing.sample("r")
        assert traced is not None
        began = time.perf_counter_ns()
        traced.open(began, {}).end(200, {}, began + 10)
        tracing.flush()
    finally:
        tracing.shutdown()
        server.stop(0)
    assert len(remaining) == 1 and remaining[0] is not None
    assert 0 < remaining[0] <= 2.5, remaining
