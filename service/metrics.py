"""Prometheus metrics, in a registry owned by one app (no global state between apps or tests).

With several server processes, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory: every
process then writes its samples there and ``/metrics`` aggregates all of them.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
COMPUTE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_pid: list[int] = []  # this process's id, kept by _remember_pid


def _remember_pid() -> None:
    """Multiprocess values that ask the process id once, not on every update.

    prometheus_client calls ``os.getpid()``, a system call, on each update of a multiprocess
    value, to notice a fork; that is about 0.2 µs of the 0.6-0.8 µs an update costs, on each of
    the nine or so updates a request makes. Here the id is read once and again in the child of
    any fork (``os.register_at_fork``), through the identifier hook prometheus_client gives for
    this (``values.MultiProcessValue(process_identifier)``), so a forked child still gets files
    of its own. Values made before this keep the stock identifier.
    """
    if _pid:
        return
    _pid.append(os.getpid())
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
    values.ValueClass = values.MultiProcessValue(lambda: _pid[0])


class Metrics:
    """Every metric the service exports."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.registry = CollectorRegistry()
        # prometheus_client itself reads PROMETHEUS_MULTIPROC_DIR; Settings reads it for us.
        self.multiprocess = multiprocess
        if multiprocess:
            _remember_pid()
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
