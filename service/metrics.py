"""Prometheus metrics, in a registry owned by one app (no global state between apps or tests).

With several server processes, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory: every
process then writes its samples there and ``/metrics`` aggregates all of them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """Every metric the service exports."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.registry = CollectorRegistry()
        # prometheus_client itself reads PROMETHEUS_MULTIPROC_DIR; Settings reads it for us.
        self.multiprocess = multiprocess
        registry = self.registry
        self.requests = Counter(
            "gelu_requests", "HTTP requests answered", ["endpoint", "model", "code"],
            registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "gelu_request_failures", "HTTP requests answered with 4xx or 5xx",
            ["endpoint", "model", "code"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "gelu_request_duration_seconds", "Time from request to response",
            ["endpoint", "model"], buckets=LATENCY_BUCKETS, registry=registry,
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

    def exposition(self) -> bytes:
        """The text format, aggregated over processes in multiprocess mode."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts, times and tracks in-flight requests by route template and model (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # labels() takes a lock and builds a key on each call; keep each label set's children.
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any]] = {}

    def _observe(self, endpoint: str, model: str, status: int, seconds: float) -> None:
        key = (endpoint, model, status)
        children = self._children.get(key)
        if children is None:
            metrics, code = self.metrics, str(status)
            children = (
                metrics.requests.labels(endpoint, model, code),
                metrics.failures.labels(endpoint, model, code) if status >= 400 else None,
                metrics.latency.labels(endpoint, model),
            )
            self._children[key] = children
        requests, failures, latency = children
        requests.inc()
        if failures is not None:
            failures.inc()
        latency.observe(seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            # A 404's name is the client's string: keep it out of the label set.
            path_params = scope.get("path_params", {}) if route and status != 404 else {}
            model = path_params.get("name", "")
            self._observe(endpoint, model, status, time.perf_counter() - start)
