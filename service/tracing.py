"""OpenTelemetry traces of inference and activation requests, on both faces.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``); then each
request that Triton's trace settings pick (``service.trace_settings``) gets a span (its
parent the caller's W3C ``traceparent``, when it sent one) and, once answered, one child span
per stage it went through: ``decode``, ``queue``, ``compute`` (linked to the ``batch`` span
of the run it shared) and ``encode``. The stages are timed on the request path as plain
``perf_counter_ns`` marks and become spans only for a traced request, at its end, so the
path pays for a span only when one is made. Everything else follows the OpenTelemetry SDK's
own environment variables: ``OTEL_EXPORTER_OTLP_*`` (endpoint, protocol, headers, timeout),
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]``,
``OTEL_BSP_*``, ``OTEL_PROPAGATORS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from service import __version__
from service.errors import StartupError

# perf_counter_ns (what the request path reads) to the epoch (what spans carry).
_EPOCH_OFFSET = time.time_ns() - time.perf_counter_ns()
PROTOCOLS = ("grpc", "http/protobuf")


def epoch_ns(perf_ns: int) -> int:
    """A ``time.perf_counter_ns`` reading as nanoseconds since the epoch."""
    return perf_ns + _EPOCH_OFFSET


def _exporter(name: str) -> SpanExporter:
    """The exporter ``OTEL_TRACES_EXPORTER`` names; OTLP over the protocol the
    ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` says (the specification's default,
    http/protobuf), configured by the exporter itself from the environment."""
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise StartupError(f"OTEL_TRACES_EXPORTER={name}: choose otlp, console or none")
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_otlp

        return grpc_otlp.OTLPSpanExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_otlp

        return http_otlp.OTLPSpanExporter()
    raise StartupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: choose {' or '.join(PROTOCOLS)}")


class Tracing:
    """The process's tracer: its provider, exporters and batch span processors."""

    def __init__(self, exporters: Iterable[SpanExporter]) -> None:
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "gelu-serve"}))
        # No sampler given: the SDK's from OTEL_TRACES_SAMPLER (parent-based, always on).
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for exporter in exporters:
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("gelu_serve", __version__)
        self._fields = propagate.get_global_textmap().fields  # OTEL_PROPAGATORS' headers

    @classmethod
    def from_environment(cls) -> Tracing | None:
        """Tracing as ``OTEL_TRACES_EXPORTER`` asks, or None (off: unset or ``none``)."""
        names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
        names = [n for n in names if n and n != "none"]
        return cls([_exporter(n) for n in names]) if names else None

    def begin(
        self,
        name: str,
        carrier: Mapping[str, str],
        began_ns: int,
        attributes: dict[str, Any],
    ) -> RequestTrace | None:
        """A request's trace: its span, started at ``began_ns`` (perf) under the caller's
        context in ``carrier`` (its headers or metadata, lower-case names); None when the
        sampler drops it, so that a request sampled out pays for no stage or batch span."""
        # Extracting costs microseconds: only where a propagator's header is there to read.
        fields = self._fields
        context = propagate.extract(carrier) if any(f in carrier for f in fields) else None
        span = self.tracer.start_span(
            name,
            context=context,
            kind=trace.SpanKind.SERVER,
            attributes=attributes,
            start_time=epoch_ns(began_ns),
        )
        if not span.is_recording():
            return None
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is queued, then stop."""
        self.provider.shutdown()


class BatchTrace:
    """One run that traced requests shared: its span, linked to each of them."""

    __slots__ = ("context",)

    def __init__(
        self,
        requests: list[RequestTrace],
        began_ns: int,
        took_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        tracer = requests[0].tracing.tracer
        links = [trace.Link(r.span.get_span_context()) for r in requests]
        span = tracer.start_span(
            "batch", links=links, attributes=attributes, start_time=epoch_ns(began_ns)
        )
        span.end(end_time=epoch_ns(began_ns + took_ns))
        self.context = span.get_span_context()


class RequestTrace:
    """One traced request: its span, and its stages' marks (perf ns) to become child spans."""

    __slots__ = ("batch", "span", "stages", "tracing")

    def __init__(self, tracing: Tracing, span: trace.Span) -> None:
        self.tracing = tracing
        self.span = span
        self.stages: list[tuple[str, int, int]] = []
        self.batch: BatchTrace | None = None

    @property
    def trace_id(self) -> str:
        """Its trace's id, as W3C and OpenMetrics exemplars write it (32 hex digits)."""
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    def mark(self, stage: str, start_ns: int, end_ns: int) -> None:
        """A stage that ran from ``start_ns`` to ``end_ns`` (``time.perf_counter_ns``)."""
        self.stages.append((stage, start_ns, end_ns))

    def since(self, stage: str, start_ns: int) -> int:
        """A stage that ran from ``start_ns`` until now; now (perf ns)."""
        now = time.perf_counter_ns()
        self.mark(stage, start_ns, now)
        return now

    def ran(self, queued_ns: int, began_ns: int, took_ns: int, batch: BatchTrace | None) -> None:
        """The request waited from ``queued_ns`` and ran from ``began_ns`` for ``took_ns``,
        in ``batch`` when it shared one."""
        self.stages.append(("queue", queued_ns, began_ns))
        self.stages.append(("compute", began_ns, began_ns + took_ns))
        self.batch = batch

    def end(self, status: int, attributes: Mapping[str, Any], end_ns: int) -> None:
        """Its stages as child spans, then its own span, with the answer's ``status`` (an
        error status for a 5xx: a client's 4xx is not the server's error)."""
        parent = trace.set_span_in_context(self.span)
        tracer = self.tracing.tracer
        for stage, start, end in self.stages:
            links = [trace.Link(self.batch.context)] if stage == "compute" and self.batch else []
            child = tracer.start_span(stage, parent, links=links, start_time=epoch_ns(start))
            child.end(end_time=epoch_ns(end))
        self.span.set_attributes(attributes)
        if status >= 500:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR))
        self.span.end(end_time=epoch_ns(end_ns))


def batch_of(
    traces: list[RequestTrace], began_ns: int, took_ns: int, attributes: dict[str, Any]
) -> BatchTrace | None:
    """The batch span of a run shared by more than one request, if any of them is traced."""
    return BatchTrace(traces, began_ns, took_ns, attributes) if traces else None
