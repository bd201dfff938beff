"""Prometheus metrics, in a registry owned by one app (no global state between apps or tests).

With several server processes, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory: every
process then writes its samples there and ``/metrics`` aggregates all of them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
COMPUTE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """Every metric the service exports."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.registry = CollectorRegistry()
        # prometheus_client itself reads PROMETHEUS_MULTIPROC_DIR; Settings reads it for us.
        self.multiprocess = multiprocess
        registry = self.registry
        self.requests = Counter(
            "gelu_requests", "Requests answered (gRPC: endpoint grpc:<method>)",
            ["endpoint", "model", "version", "code"],
            registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "gelu_request_failures", "Requests answered with 4xx or 5xx (gRPC: its equivalent)",
            ["endpoint", "model", "version", "code"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
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
        self.batch_size = Histogram(
            "gelu_batch_size", "Samples per onnxruntime run of a model",
            ["model"], buckets=BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queue_time = Histogram(
            "gelu_batch_queue_seconds", "Time a request waited for its batch to start",
            ["model"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip

        self.compute = Histogram(
            "gelu_compute_seconds", "Time of one onnxruntime run of a model version",
            ["model", "version"], buckets=COMPUTE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.load_failures = Counter(
            "gelu_model_load_failures", "Model (version) loads that failed; the log says why",
            ["model"], registry=registry,
        )  # fmt: skip

        # In one process, requests in flight are a plain count read at scrape time (a Gauge's
        # inc and dec take a lock each, per request); across workers, each worker's gauge.
        self.in_flight_count = 0
        if not multiprocess:
            self.in_flight.set_function(lambda: self.in_flight_count)

        # labels() takes a lock and builds a key on each call: each label set's children are
        # looked up once and kept (label values are bounded: routes, served models, statuses).
        self._request_children: dict[tuple[str, str, str, int], tuple[Any, Any, Any]] = {}

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
        self, endpoint: str, model: str, version: str, status: int, seconds: float
    ) -> None:
        """One answered request of any face: counted, a failure if ``status`` >= 400, timed."""
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
        latency.observe(seconds)

    def exposition(self) -> bytes:
        """The text format, aggregated over processes in multiprocess mode."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
