"""Prometheus metrics, in a registry owned by one app (no global state between apps or tests).

With several server processes, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory: every
process then writes its samples there and ``/metrics`` aggregates all of them.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from typing import Any, ClassVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import (
    CounterMetricFamily,
    Exemplar,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.openmetrics import exposition as openmetrics_exposition

# The media type of the OpenMetrics exposition, which carries exemplars.
OPENMETRICS = openmetrics_exposition.CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
COMPUTE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

FLUSH_SECONDS = 1.0  # how stale, at most, one worker's samples are in another's /metrics

logger = logging.getLogger("gelu_serve")

# The autoscaling signals (docs/observability.md, "Autoscaling signals"): per model version,
# the requests waiting to run (Triton's nv_inference_pending_request_count; Prometheus keeps
# the suffix _count for histograms and summaries) and those waiting or running.
PENDING = "gelu_inference_pending_requests"
PENDING_HELP = (
    "Requests a model version has taken that have not started to run: queued in its batcher, "
    "or in a batch still gathering (Triton's nv_inference_pending_request_count)"
)
IN_FLIGHT = "gelu_inference_in_flight_requests"
IN_FLIGHT_HELP = (
    "Requests a model version has taken and not yet answered, waiting or running (what "
    "GELU_MAX_QUEUE_SIZE bounds); running = this minus pending"
)
# One version's requests as read at a scrape: model, version, pending, in flight.
QueueSample = tuple[str, str, int, int]


class _DeferredValue:
    """A multiprocess sample kept in memory and written to this process's files in batches.

    prometheus_client's own multiprocess value (``values.MultiProcessValue``) writes its mmap
    file on every update and asks ``os.getpid()`` each time: of the twelve or so updates a
    request makes, that is about half the metrics' cost. Here an update only changes memory and
    marks the value; ``flush`` writes the values so marked to the same files in the same format
    (``MmapedDict``), so ``MultiProcessCollector`` reads them unchanged. ``flush`` runs every
    ``FLUSH_SECONDS`` on a thread of its own, before this process answers ``/metrics`` and at
    exit: another worker's samples are at most ``FLUSH_SECONDS`` old in a scrape. A forked
    child starts files of its own, named by its process id, as with prometheus_client's.
    """

    _multiprocess = True
    _lock: ClassVar[threading.Lock] = threading.Lock()  # one for all, as prometheus_client's
    _files: ClassVar[dict[str, MmapedDict]] = {}
    _values: ClassVar[list[_DeferredValue]] = []
    _pending: ClassVar[list[_DeferredValue]] = []  # updated since the last flush

    def __init__(
        self,
        typ: str,
        metric_name: str,
        name: str,
        labelnames: Sequence[str],
        labelvalues: Sequence[str],
        help_text: str,
        multiprocess_mode: str = "",
        **kwargs: Any,
    ) -> None:
        self._prefix = f"{typ}_{multiprocess_mode}" if typ == "gauge" else typ
        self._key = mmap_key(metric_name, name, list(labelnames), list(labelvalues), help_text)
        with self._lock:
            self._open()
            self._values.append(self)

    def _open(self) -> None:
        """Read this value from its file in this process's directory (the lock is held)."""
        files = _DeferredValue._files
        file = files.get(self._prefix)
        if file is None:
            directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
            path = os.path.join(directory, f"{self._prefix}_{os.getpid()}.db")
            file = files[self._prefix] = MmapedDict(path)
        self._file = file
        self._value, self._timestamp = file.read_value(self._key)
        self._pending_write = False

    def inc(self, amount: float) -> None:
        with self._lock:
            self._value += amount
            self._timestamp = 0.0
            if not self._pending_write:
                self._pending_write = True
                self._pending.append(self)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with self._lock:
            self._value = value
            self._timestamp = timestamp or 0.0
            if not self._pending_write:
                self._pending_write = True
                self._pending.append(self)

    def get(self) -> float:
        with self._lock:
            return self._value

    def set_exemplar(self, exemplar: object) -> None:
        """Exemplars are not kept in multiprocess mode (nor by prometheus_client's)."""

    def get_exemplar(self) -> None:
        return None

    @classmethod
    def flush(cls) -> None:
        """Write every value updated since the last flush to this process's files."""
        with cls._lock:
            for value in cls._pending:
                value._file.write_value(value._key, value._value, value._timestamp)
                value._pending_write = False
            cls._pending.clear()

    @classmethod
    def _forked(cls) -> None:
        """In a forked child: files of its own, and its values start from them."""
        cls._lock = threading.Lock()
        for file in cls._files.values():
            file.close()
        cls._files.clear()
        cls._pending.clear()
        for value in cls._values:
            value._open()
        _start_flushing()


# The Metrics of this process whose request gauges are read, not counted (``_Queues``): each
# flush sets them first, so the files hold what was waiting and running at that moment.
_SAMPLED: weakref.WeakSet[_Queues] = weakref.WeakSet()


def _flush() -> None:
    """Read the request gauges, then write every value updated since the last flush."""
    for queues in list(_SAMPLED):
        queues.sample()
    _DeferredValue.flush()


def _start_flushing() -> None:
    def flush_now_and_then() -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            _flush()

    threading.Thread(target=flush_now_and_then, name="metrics-flush", daemon=True).start()


def _defer_multiprocess_writes() -> None:
    """Make every metric made from now on in this process a ``_DeferredValue`` (once)."""
    if values.ValueClass is _DeferredValue:
        return
    values.ValueClass = _DeferredValue
    os.register_at_fork(after_in_child=_DeferredValue._forked)
    atexit.register(_flush)
    _start_flushing()


class _Count:
    """One labelled series of a ``LeanCounter``."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value, self.created = 0.0, time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Buckets:
    """One labelled series of a ``LeanHistogram``: a count per bucket (not cumulative), the
    sum, and the last exemplar of each bucket."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * len(bounds), 0.0
        self.exemplars: list[Exemplar | None] = [None] * len(bounds)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        index = bisect_left(self.bounds, amount)  # the first bound >= amount, as "le" says
        self.counts[index] += 1
        self.sum += amount
        if exemplar is not None:
            self.exemplars[index] = Exemplar(exemplar, amount, time.time())


class _LeanFamily:
    """Labelled series kept as plain numbers and turned into samples only when scraped.

    For the series every request updates: prometheus_client's ``Counter`` takes a lock on each
    update and its ``Histogram`` finds the bucket by a loop in Python: microseconds of a small
    model's request (``bench/asgi_path.py``; docs/performance.md, "Lean metrics"). Updated on the
    event loop's thread only, as ``service.statistics`` is; a scrape reads a snapshot. The
    exposition is prometheus_client's (a test holds the two side by side), less histograms'
    ``_created`` series. One process only: across workers, ``Metrics`` uses
    prometheus_client's multiprocess values instead."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._series: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    def labels(self, *values: str) -> Any:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = self._new()
        return series

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        """Drop every series whose labels include ``labels`` (prometheus_client's name); a
        family without one of those labels keeps its series."""
        if not labels.keys() <= set(self.labelnames):
            return
        where = [(self.labelnames.index(k), v) for k, v in labels.items()]
        self._series = {
            key: series
            for key, series in self._series.items()
            if not all(key[i] == value for i, value in where)
        }

    def _new(self) -> Any:
        raise NotImplementedError

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        raise NotImplementedError


class LeanCounter(_LeanFamily):
    """A counter whose series ``labels(...)`` gives (``inc``); see ``_LeanFamily``."""

    def _new(self) -> _Count:
        return _Count()

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self._series.items()):
            family.add_metric(labels, series.value, created=series.created)
        yield family


class LeanHistogram(_LeanFamily):
    """A histogram whose series ``labels(...)`` gives (``observe``); see ``_LeanFamily``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        self.bounds = (*(float(b) for b in buckets), math.inf)
        self._le = ["+Inf" if b == math.inf else repr(b) for b in self.bounds]  # as scraped
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> _Buckets:
        return _Buckets(self.bounds)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self._series.items()):
            cumulative, buckets = 0, []
            counts, exemplars = list(series.counts), list(series.exemplars)
            for le, count, exemplar in zip(self._le, counts, exemplars, strict=True):
                cumulative += count
                buckets.append((le, cumulative) if exemplar is None else (le, cumulative, exemplar))
            family.add_metric(labels, buckets, series.sum)
        yield family


class _Queues:
    """The per-version request gauges (``PENDING``, ``IN_FLIGHT``), read from a source rather
    than counted: the request path changes nothing for them. The source (the repository's
    ``queues``) answers from what already holds each request: a version's in-flight count and
    its batcher's queue.

    In one process they are read as the registry is scraped. Across workers each process sets
    its own gauges (summed over live processes, as ``gelu_requests_in_flight``) before each
    flush, on the flushing thread or the scrape's: at most ``FLUSH_SECONDS`` old, as every
    multiprocess sample is. The source may then be read off the event loop; it reads only
    counts and lengths. A version gone from the source reads 0 from then on."""

    def __init__(self, registry: CollectorRegistry, multiprocess: bool) -> None:
        self.source: Callable[[], Iterable[QueueSample]] | None = None
        if multiprocess:
            self._lock = threading.Lock()  # the flushing thread and a scrape may both sample
            self._sampled: set[tuple[str, str]] = set()
            labels = ["model", "version"]
            self._pending = Gauge(PENDING, PENDING_HELP, labels, registry=registry,
                                  multiprocess_mode="livesum")  # fmt: skip
            self._in_flight = Gauge(IN_FLIGHT, IN_FLIGHT_HELP, labels, registry=registry,
                                    multiprocess_mode="livesum")  # fmt: skip
            _SAMPLED.add(self)
        else:
            registry.register(self)

    def read(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Pending and in flight by (model, version), summed over the source's entries (a
        version being replaced by a reload of itself finishes its requests beside it)."""
        source = self.source
        totals: dict[tuple[str, str], tuple[int, int]] = {}
        for model, version, pending, in_flight in source() if source is not None else ():
            was_pending, was_in_flight = totals.get((model, version), (0, 0))
            totals[model, version] = (was_pending + pending, was_in_flight + in_flight)
        # Read one after the other, off the loop a request may move between the two reads.
        return {key: (p, max(p, f)) for key, (p, f) in totals.items()}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One process: the gauges as the scrape reads them."""
        pending = GaugeMetricFamily(PENDING, PENDING_HELP, labels=["model", "version"])
        in_flight = GaugeMetricFamily(IN_FLIGHT, IN_FLIGHT_HELP, labels=["model", "version"])
        for (model, version), (waiting, held) in sorted(self.read().items()):
            pending.add_metric([model, version], waiting)
            in_flight.add_metric([model, version], held)
        yield pending
        yield in_flight

    def sample(self) -> None:
        """Across workers: set this process's gauges to what the source says now, 0 for a
        version it no longer names. A failing read skips one flush, never the flushing."""
        with self._lock:
            try:
                now = self.read()
            except Exception:  # read off the loop while it changes: the next flush reads again
                logger.warning("request gauges not sampled this time", exc_info=True)
                return
            for key in self._sampled - now.keys():
                now[key] = (0, 0)
            for (model, version), (waiting, held) in now.items():
                self._pending.labels(model, version).set(waiting)
                self._in_flight.labels(model, version).set(held)
            self._sampled |= now.keys()


class Metrics:
    """Every metric the service exports."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.registry = CollectorRegistry()
        # prometheus_client itself reads PROMETHEUS_MULTIPROC_DIR; Settings reads it for us.
        self.multiprocess = multiprocess
        if multiprocess:
            _defer_multiprocess_writes()
        registry = self.registry
        # The series each request updates: lean in one process, shared across workers.
        counter: Any = Counter if multiprocess else LeanCounter
        histogram: Any = Histogram if multiprocess else LeanHistogram
        self.requests = counter(
            "gelu_requests", "Requests answered (gRPC: endpoint grpc:<method>)",
            ["endpoint", "model", "version", "code"], registry=registry,
        )  # fmt: skip
        self.failures = counter(
            "gelu_request_failures", "Requests answered with 4xx or 5xx (gRPC: its equivalent)",
            ["endpoint", "model", "version", "code"], registry=registry,
        )  # fmt: skip
        self.latency = histogram(
            "gelu_request_duration_seconds", "Time from request to response",
            ["endpoint", "model", "version"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "gelu_requests_in_flight", "HTTP requests being handled", registry=registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.providers = Gauge(
            "gelu_execution_provider", "1 for each execution provider a session really uses",
            ["model", "version", "provider"], registry=registry, multiprocess_mode="max",
        )  # fmt: skip
        self.batch_size = histogram(
            "gelu_batch_size", "Samples per onnxruntime run of a model",
            ["model"], buckets=BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queue_time = histogram(
            "gelu_batch_queue_seconds",
            "Time a request waited in a batcher for its batch to start (not counted: requests "
            "run unbatched at once, as a lone client's are)",
            ["model"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip

        self.compute = histogram(
            "gelu_compute_seconds", "Time of one onnxruntime run of a model version",
            ["model", "version"], buckets=COMPUTE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.warmup_runs = Counter(
            "gelu_model_warmup_runs", "Runs of config.pbtxt's model_warmup samples before a "
            "version turned ready", ["model", "version"], registry=registry,
        )  # fmt: skip
        self.cache_lookups = counter(
            "gelu_response_cache_lookups", "Response cache lookups, by model and result "
            "(hit or miss)", ["model", "result"], registry=registry,
        )  # fmt: skip
        self.cache_bytes = Gauge(
            "gelu_response_cache_bytes", "Bytes the response cache holds (this process's)",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.load_failures = Counter(
            "gelu_model_load_failures", "Model (version) loads that failed; the log says why",
            ["model"], registry=registry,
        )  # fmt: skip
        self.traces_dropped = Counter(
            "gelu_traces_dropped", "Finished traces dropped because the export queue "
            "(OTEL_BSP_MAX_QUEUE_SIZE) was full", registry=registry,
        )  # fmt: skip
        self._residency(registry)
        self._queues = _Queues(registry, multiprocess)

        # In one process, requests in flight are a plain count read at scrape time (a Gauge's
        # inc and dec take a lock each, per request); across workers, each worker's gauge.
        self.in_flight_count = 0
        if not multiprocess:
            self.in_flight.set_function(lambda: self.in_flight_count)

        # labels() is a call and a lookup per family (prometheus_client's also take a lock):
        # each label set's three are looked up once and kept, until its version is forgotten
        # (label values are bounded: routes, served models, statuses).
        self._request_children: dict[tuple[str, str, str, int], tuple[Any, Any, Any]] = {}

    def _residency(self, registry: CollectorRegistry) -> None:
        """on_demand mode's (``service.repository.demand``): loads at a model's first request,
        and unloads of the least recently used to make room."""
        self.loads = Histogram(
            "gelu_model_load_seconds", "on_demand: time to load a model, room made included",
            buckets=LOAD_BUCKETS, registry=registry,
        )  # fmt: skip
        self.load_waits = Histogram(
            "gelu_model_load_wait_seconds", "on_demand: time a request waited for its model "
            "to load", buckets=LOAD_BUCKETS, registry=registry,
        )  # fmt: skip
        self.evictions = Counter(
            "gelu_model_evictions", "on_demand: models unloaded to make room for another",
            ["model"], registry=registry,
        )  # fmt: skip
        self.loaded_models = Gauge(
            "gelu_loaded_models", "on_demand: models loaded, as GELU_MAX_LOADED_MODELS "
            "counts them: ensembles aside (this process's)",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.loaded_model_bytes = Gauge(
            "gelu_loaded_model_bytes", "on_demand: bytes the loaded models' sessions hold, as "
            "GELU_MODEL_MEMORY_BYTES counts them (this process's)",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip

    def forget(self, model: str, version: str, providers: Sequence[str], last: bool) -> None:
        """Drop the series of a version no longer served, and its model's batching and cache
        series when ``last`` (no version of it is served): a scrape lists what is served, as
        Triton's per-model metrics leave with the model. The requests about the model by name
        alone (load, unload, metadata; version "") stay. Across workers prometheus_client's
        files keep them all."""
        if self.multiprocess:
            return
        with suppress(KeyError):  # prometheus_client before 0.21 raises for an absent one
            for provider in providers:
                self.providers.remove(model, version, provider)
            self.warmup_runs.remove(model, version)
        for family in (self.requests, self.failures, self.latency, self.compute):
            family.remove_by_labels({"model": model, "version": version})
        for family in (self.batch_size, self.queue_time, self.cache_lookups) if last else ():
            family.remove_by_labels({"model": model})
        self._request_children = {
            key: children
            for key, children in self._request_children.items()
            if key[1:3] != (model, version)
        }

    def watch_queues(self, source: Callable[[], Iterable[QueueSample]] | None) -> None:
        """Read ``gelu_inference_pending_requests`` and ``gelu_inference_in_flight_requests``
        from ``source`` (None: every version reads 0, or is gone in one process); see
        ``_Queues``."""
        self._queues.source = source

    def request_started(self) -> None:
        if self.multiprocess:
            self.in_flight.inc()
        else:
            self.in_flight_count += 1

    def request_finished(self) -> None:
        if self.multiprocess:
            self.in_flight.dec()
        else:
            self.in_flight_count -= 1

    def observe_request(
        self,
        endpoint: str,
        model: str,
        version: str,
        status: int,
        seconds: float,
        trace_id: str | None = None,
    ) -> None:
        """One answered request of any face: counted, a failure if ``status`` >= 400, timed
        (with its ``trace_id`` as the bucket's exemplar when it was traced)."""
        key = (endpoint, model, version, status)
        children = self._request_children.get(key)
        if children is None:
            code = str(status)
            children = (
                self.requests.labels(endpoint, model, version, code),
                self.failures.labels(endpoint, model, version, code) if status >= 400 else None,
                self.latency.labels(endpoint, model, version),
            )
            self._request_children[key] = children
        requests, failures, latency = children
        requests.inc()
        if failures is not None:
            failures.inc()
        if trace_id is None:
            latency.observe(seconds)
        else:
            latency.observe(seconds, exemplar={"trace_id": trace_id})

    def exposition(self, openmetrics: bool = False) -> bytes:
        """The Prometheus text format, or OpenMetrics (with exemplars), aggregated over
        processes in multiprocess mode (which keeps no exemplars)."""
        registry = self.registry
        if self.multiprocess:
            _flush()
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return (openmetrics_exposition.generate_latest if openmetrics else generate_latest)(
            registry
        )
