"""OpenTelemetry traces of inference and activation requests, on both faces.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``); then each
request that Triton's trace settings pick (``service.trace_settings``) and the sampler keeps
gets a span (its parent the caller's W3C ``traceparent``, when it sent one) and, once
answered, one child span per stage it went through: ``decode``, ``queue``, ``compute``
(linked to the ``batch`` span of the run it shared) and ``encode``.

A request pays only for what is recorded of it (issue 65). The sampler decides first, before
anything is built: a request with no propagator header is a root, whose decision is its new
trace id against the sampler's root bound (``Sampler.root_bound``, one comparison); only a
request that carries a parent has it extracted and asks the SDK's sampler. A request sampled
out is answered as with tracing off (its ``traceparent`` is read, never rewritten). A sampled
one records plain ``perf_counter_ns`` marks on the request path and, once answered, is put as
it is on a bounded queue (``Exporting``); a background thread turns the queue into spans and
hands them to the exporters, so the request path never builds a span or waits on an export.
When the queue is full a finished trace is dropped and counted, never queued without bound.

Everything else follows the OpenTelemetry SDK's own environment variables:
``OTEL_EXPORTER_OTLP_*`` (endpoint, protocol, headers, timeout), ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_PROPAGATORS``, and
``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BSP_MAX_QUEUE_SIZE`` (here in traces: a request's span and
its stages, or a batch's span) and ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (spans per export).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from service import __version__, otlp
from service.errors import StartupError

logger = logging.getLogger("gelu_serve")
# perf_counter_ns (what the request path reads) to the epoch (what spans carry).
_EPOCH_OFFSET = time.time_ns() - time.perf_counter_ns()
PROTOCOLS = ("grpc", "http/protobuf")
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
            "parentbased_always_off", "parentbased_traceidratio")  # fmt: skip
_SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)
_RATIO_BITS = TraceIdRatioBased.TRACE_ID_LIMIT  # the trace id bits a ratio sampler reads
_OK = trace.Status(trace.StatusCode.UNSET)
_ERROR = trace.Status(trace.StatusCode.ERROR)


def epoch_ns(perf_ns: int) -> int:
    """A ``time.perf_counter_ns`` reading as nanoseconds since the epoch."""
    return perf_ns + _EPOCH_OFFSET


_getrandbits = random.getrandbits


def _new_id(bits: int) -> int:
    """A random trace (128) or span (64) id; never the invalid 0."""
    return random.getrandbits(bits) or 1


Exporter = SpanExporter | otlp.HttpExporter  # the SDK's (given spans) or OTLP/HTTP's (bytes)


def _exporter(name: str) -> Exporter:
    """The exporter ``OTEL_TRACES_EXPORTER`` names; OTLP over the protocol the
    ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` says (the specification's default,
    http/protobuf, written by ``service.otlp``; grpc by the SDK's exporter), configured
    from the environment as the SDK's exporters are."""
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

        # Given in seconds: the SDK would read the milliseconds the specification sets as seconds.
        return grpc_otlp.OTLPSpanExporter(timeout=otlp.timeout_seconds())
    if protocol == "http/protobuf":
        return otlp.HttpExporter()
    raise StartupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: choose {' or '.join(PROTOCOLS)}")


def _sampler() -> tuple[Sampler, int]:
    """The sampler ``OTEL_TRACES_SAMPLER[_ARG]`` names, as the SDK builds it, and its root
    bound: a request with no parent is sampled when its trace id's low 64 bits are below it
    (what each of the SDK's samplers decides for a root; 0: never). A misspelt name or ratio
    is refused at start-up (the SDK would fall back to always on)."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if name not in SAMPLERS:
        raise StartupError(f"OTEL_TRACES_SAMPLER={name}: choose {', '.join(SAMPLERS)}")
    root: Sampler = ALWAYS_OFF if name.endswith("always_off") else ALWAYS_ON
    bound = 0 if root is ALWAYS_OFF else _RATIO_BITS + 1
    if name.endswith("traceidratio"):
        arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = TraceIdRatioBased(float(arg))
        except ValueError:
            raise StartupError(f"OTEL_TRACES_SAMPLER_ARG={arg}: a ratio from 0 to 1") from None
        root, bound = ratio, ratio.bound
    return (ParentBased(root) if name.startswith("parentbased") else root), bound


class Exporting:
    """Finished traces on their way out: a bounded queue the request path appends to (no
    lock: ``deque.append`` and ``len`` are atomic), drained by one background thread that
    makes their spans and exports them every ``OTEL_BSP_SCHEDULE_DELAY`` ms, or as soon as
    a batch's worth waits. A trace finished while ``limit`` wait is dropped and counted."""

    def __init__(
        self,
        exporters: list[Exporter],
        resource: Resource,
        scope: InstrumentationScope,
        dropped: Callable[[], None] | None = None,
    ) -> None:
        self.exporters = exporters
        self.resource = resource
        self.scope = scope
        self.encoder = otlp.Encoder(resource.attributes, scope.name, scope.version or "")
        self.limit = _positive("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = _positive("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self.delay_s = _positive("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.dropped = 0  # traces dropped on a full queue, since start
        self._on_drop = dropped  # told of each (the service's gelu_traces_dropped)
        self._queue: deque[RequestTrace | BatchTrace] = deque()
        self._wake = threading.Event()
        self._exporting = threading.Lock()  # the thread's drain against a flush's
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gelu-trace-export", daemon=True)
        self._thread.start()

    def put(self, finished: RequestTrace | BatchTrace) -> None:
        """Queue a finished trace for export, or drop and count it when the queue is full."""
        queue = self._queue
        if len(queue) >= self.limit:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            if self.dropped == 1 or not self.dropped % 10_000:
                logger.warning("trace export queue full (OTEL_BSP_MAX_QUEUE_SIZE=%d): %d "
                               "traces dropped so far", self.limit, self.dropped)  # fmt: skip
            return
        queue.append(finished)
        # About a batch's spans (a request's trace makes about five) wake the thread, once:
        # Event.set takes a lock, is_set does not.
        if len(queue) * 4 >= self.batch and not self._wake.is_set():
            self._wake.set()

    def flush(self) -> None:
        """Export everything queued now, on the calling thread."""
        with self._exporting:
            self._drain()

    def shutdown(self) -> None:
        """Export what is queued, stop the thread, then the exporters."""
        self._stopping = True
        self._wake.set()
        self._thread.join()
        self.flush()
        for exporter in self.exporters:
            exporter.shutdown()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            with self._exporting:
                self._drain()

    def _drain(self) -> None:
        # Each trace is made into what its exporters take: the SDK's spans, OTLP's bytes.
        sdk = any(not isinstance(e, otlp.HttpExporter) for e in self.exporters)
        wire = any(isinstance(e, otlp.HttpExporter) for e in self.exporters)
        queue, spans, encoded = self._queue, list[ReadableSpan](), list[bytes]()
        while queue:
            finished = queue.popleft()
            if sdk:
                finished.spans(self, spans)
            if wire:
                finished.encode(self.encoder, encoded)
            if max(len(spans), len(encoded)) >= self.batch:
                self._export(spans, encoded)
                spans, encoded = [], []
        if spans or encoded:
            self._export(spans, encoded)

    def _export(self, spans: list[ReadableSpan], encoded: list[bytes]) -> None:
        body = self.encoder.request(encoded) if encoded else b""
        for exporter in self.exporters:
            try:
                if isinstance(exporter, otlp.HttpExporter):
                    exporter.export(body)
                else:
                    exporter.export(spans)
            except Exception:  # an exporter's failure must not stop the thread
                logger.exception(
                    "trace export failed; %d spans lost", max(len(spans), len(encoded))
                )

    def span(
        self,
        name: str,
        context: trace.SpanContext,
        parent: trace.SpanContext | None,
        kind: trace.SpanKind,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        links: tuple[trace.Link, ...] = (),
        status: trace.Status = _OK,
    ) -> ReadableSpan:
        """A finished span of this process's resource and scope (times perf ns)."""
        return ReadableSpan(
            name, context, parent, self.resource, attributes, links=links, kind=kind,
            status=status, start_time=epoch_ns(start_ns), end_time=epoch_ns(end_ns),
            instrumentation_scope=self.scope,
        )  # fmt: skip


def _positive(variable: str, default: int) -> int:
    value = os.environ.get(variable, "").strip()
    try:
        parsed = int(value) if value else default
    except ValueError:
        parsed = 0
    if parsed < 1:
        raise StartupError(f"{variable}={value}: a whole number above 0")
    return parsed


class Tracing:
    """The process's tracer: its sampler, propagators and exporting thread."""

    def __init__(
        self, exporters: Iterable[Exporter], dropped: Callable[[], None] | None = None
    ) -> None:
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "gelu-serve"}))
        self.sampler, self.root_bound = _sampler()
        # OTEL_PROPAGATORS' headers: a request without any of them is a root.
        self.fields = frozenset(propagate.get_global_textmap().fields)
        self.header_fields = frozenset(f.encode("latin-1") for f in self.fields)
        scope = InstrumentationScope("gelu_serve", __version__)
        self.exporting = Exporting(list(exporters), resource, scope, dropped)

    @classmethod
    def from_environment(cls, dropped: Callable[[], None] | None = None) -> Tracing | None:
        """Tracing as ``OTEL_TRACES_EXPORTER`` asks, or None (off: unset or ``none``);
        ``dropped`` is called for each trace dropped on a full export queue."""
        names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
        names = [n for n in names if n and n != "none"]
        return cls([_exporter(n) for n in names], dropped) if names else None

    def sample(self, name: str, carrier: Mapping[str, str] | None = None) -> RequestTrace | None:
        """A request's trace if the sampler keeps it, else None, having built nothing.
        ``carrier``: its headers or metadata (lower-case names) when any of ``fields`` (the
        propagators' headers) is among them, else None (a root: one random number and one
        comparison decide). ``name`` is the span's; the caller then ``open``s the trace."""
        if carrier is None:
            # The ratio samplers read a trace id's low 64 bits: draw those, decide, and only
            # then the high 64 bits (one C call for a request sampled out).
            low = _getrandbits(64)
            if low >= self.root_bound:
                return None
            return RequestTrace(self, name, (_getrandbits(64) << 64 | low) or 1, None, None)
        context = propagate.extract(carrier)
        found = trace.get_current_span(context).get_span_context()
        parent = found if found.is_valid else None
        trace_id = _new_id(128) if parent is None else parent.trace_id
        result = self.sampler.should_sample(context, trace_id, name, trace.SpanKind.SERVER)
        if not result.decision.is_sampled():
            return None
        return RequestTrace(self, name, trace_id, parent, result.trace_state)

    def flush(self) -> None:
        """Export every finished trace now."""
        self.exporting.flush()

    def shutdown(self) -> None:
        """Export what is queued, then stop."""
        self.exporting.shutdown()


class BatchTrace:
    """One run that traced requests shared: its own trace's span, linked to each of them."""

    __slots__ = ("attributes", "began_ns", "links", "span_id", "took_ns", "trace_id")

    def __init__(
        self,
        requests: list[RequestTrace],
        began_ns: int,
        took_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        self.trace_id, self.span_id = _new_id(128), _new_id(64)
        self.links = [(r.trace_id, r.span_id) for r in requests]
        self.began_ns, self.took_ns, self.attributes = began_ns, took_ns, attributes
        requests[0].tracing.exporting.put(self)

    def context(self) -> trace.SpanContext:
        """Its span's context."""
        return trace.SpanContext(self.trace_id, self.span_id, False, _SAMPLED)

    def spans(self, exporting: Exporting, into: list[ReadableSpan]) -> None:
        """Its span, made on the exporting thread."""
        links = tuple(trace.Link(trace.SpanContext(t, s, False, _SAMPLED)) for t, s in self.links)
        into.append(exporting.span("batch", self.context(), None, trace.SpanKind.INTERNAL,
                                   self.began_ns, self.began_ns + self.took_ns,
                                   self.attributes, links))  # fmt: skip

    def encode(self, encoder: otlp.Encoder, into: list[bytes]) -> None:
        """Its span as OTLP bytes: what ``spans`` makes, as the SDK's encoder writes it."""
        began = epoch_ns(self.began_ns)
        into.append(encoder.span(self.trace_id, self.span_id, "", None, False, "batch",
                                 otlp.KIND_INTERNAL, began, began + self.took_ns,
                                 self.attributes, self.links))  # fmt: skip


class RequestTrace:
    """One sampled request: its ids, attributes and stages' marks (perf ns), exported as a
    span with a child per stage once it ``end``s."""

    __slots__ = ("attributes", "batch", "end_ns", "name", "parent", "span_id", "stage_ids",
                 "stages", "start_ns", "status", "trace_id", "trace_state", "tracing")  # fmt: skip

    def __init__(
        self,
        tracing: Tracing,
        name: str,
        trace_id: int,
        parent: trace.SpanContext | None,
        trace_state: trace.TraceState | None,
    ) -> None:
        self.tracing = tracing
        self.name = name
        self.trace_id = trace_id
        self.span_id = _new_id(64)
        self.parent = parent
        self.trace_state = trace_state
        self.stages: list[tuple[str, int, int]] = []
        self.stage_ids: list[int] = []  # its stages' span ids, drawn when first exported
        self.batch: BatchTrace | None = None
        self.attributes: dict[str, Any] = {}
        self.start_ns = self.end_ns = self.status = 0

    def open(self, began_ns: int, attributes: dict[str, Any]) -> RequestTrace:
        """Its span begins at ``began_ns`` (perf) with ``attributes``; itself."""
        self.start_ns, self.attributes = began_ns, attributes
        return self

    @property
    def trace_id_hex(self) -> str:
        """Its trace's id, as W3C and OpenMetrics exemplars write it (32 hex digits)."""
        return trace.format_trace_id(self.trace_id)

    def context(self) -> trace.SpanContext:
        """Its span's context."""
        return trace.SpanContext(self.trace_id, self.span_id, False, _SAMPLED, self.trace_state)

    def mark(self, stage: str, start_ns: int, end_ns: int) -> None:
        """A stage that ran from ``start_ns`` to ``end_ns`` (``time.perf_counter_ns``)."""
        self.stages.append((stage, start_ns, end_ns))

    def since(self, stage: str, start_ns: int) -> int:
        """A stage that ran from ``start_ns`` until now; now (perf ns)."""
        now = time.perf_counter_ns()
        self.stages.append((stage, start_ns, now))
        return now

    def ran(self, queued_ns: int, began_ns: int, took_ns: int, batch: BatchTrace | None) -> None:
        """The request waited from ``queued_ns`` and ran from ``began_ns`` for ``took_ns``,
        in ``batch`` when it shared one."""
        self.stages.append(("queue", queued_ns, began_ns))
        self.stages.append(("compute", began_ns, began_ns + took_ns))
        self.batch = batch

    def end(self, status: int, attributes: Mapping[str, Any], end_ns: int) -> None:
        """Answered with ``status``: queued for export with ``attributes`` added."""
        self.attributes.update(attributes)
        self.status, self.end_ns = status, end_ns
        self.tracing.exporting.put(self)

    def _stage_ids(self) -> list[int]:
        """Its stages' span ids, the same to every exporter."""
        ids = self.stage_ids
        while len(ids) < len(self.stages):
            ids.append(_new_id(64))
        return ids

    def spans(self, exporting: Exporting, into: list[ReadableSpan]) -> None:
        """Its stages' spans, then its own (an error status for a 5xx: a client's 4xx is not
        the server's error), made on the exporting thread."""
        context = self.context()
        batch = (trace.Link(self.batch.context()),) if self.batch is not None else ()
        internal = trace.SpanKind.INTERNAL
        for (stage, start, end), span_id in zip(self.stages, self._stage_ids(), strict=True):
            child = trace.SpanContext(self.trace_id, span_id, False, _SAMPLED,
                                      self.trace_state)  # fmt: skip
            links = batch if stage == "compute" else ()
            into.append(exporting.span(stage, child, context, internal, start, end, None, links))
        status = _ERROR if self.status >= 500 else _OK
        into.append(
            exporting.span(
                self.name,
                context,
                self.parent,
                trace.SpanKind.SERVER,
                self.start_ns,
                self.end_ns,
                self.attributes,
                (),
                status,
            )
        )

    def encode(self, encoder: otlp.Encoder, into: list[bytes]) -> None:
        """Its stages' spans and its own as OTLP bytes: what ``spans`` makes, as the SDK's
        encoder writes it."""
        state = self.trace_state
        states = ",".join(f"{k}={v}" for k, v in state.items()) if state else ""
        trace_id, span_id, internal = self.trace_id, self.span_id, otlp.KIND_INTERNAL
        batch = ((self.batch.trace_id, self.batch.span_id),) if self.batch is not None else ()
        for (stage, start, end), stage_id in zip(self.stages, self._stage_ids(), strict=True):
            into.append(encoder.span(trace_id, stage_id, states, span_id, False, stage,
                                     internal, epoch_ns(start), epoch_ns(end), None,
                                     batch if stage == "compute" else ()))  # fmt: skip
        parent = self.parent
        into.append(encoder.span(trace_id, span_id, states,
                                 None if parent is None else parent.span_id,
                                 parent is not None and parent.is_remote, self.name,
                                 otlp.KIND_SERVER, epoch_ns(self.start_ns),
                                 epoch_ns(self.end_ns), self.attributes, (),
                                 self.status >= 500))  # fmt: skip


def batch_of(
    traces: list[RequestTrace], began_ns: int, took_ns: int, attributes: dict[str, Any]
) -> BatchTrace | None:
    """The batch span of a run shared by more than one request, if any of them is traced."""
    return BatchTrace(traces, began_ns, took_ns, attributes) if traces else None
