"""What one run of ``make bench`` records: its points (rows) named by scenario, as written to
benchmarks.json, and the helpers that read a point."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SMALL = "digits-mlp"
HTTP_FLOOR = "http floor"  # FastAPI answering a constant
ASGI_FLOOR = "asgi floor"  # a pure ASGI app answering the same, no framework


PEER_MLSERVER, PEER_BENTOML = "MLServer 1.7.1", "BentoML 1.4"


PEERS = (PEER_MLSERVER, PEER_BENTOML)


FLOOR_AS_SERVED = "http floor, served as the service serves"


FLOOR_AS_SERVED_TWO = f"{FLOOR_AS_SERVED}, --workers 2"


FLOOR_AS_SERVED_ONE = f"{FLOOR_AS_SERVED}, --workers 1"  # the 2-worker rows' twin


TWO_WORKERS = "v1 predict, gelu-serve serve --workers 2"


ONE_WORKER = "v1 predict, gelu-serve serve --workers 1"  # the 2-worker rows' twin


TWO_WORKERS_OFF = "v1 predict, batching off, gelu-serve serve --workers 2"


ONE_WORKER_OFF = "v1 predict, batching off, gelu-serve serve --workers 1"


ECHO_AS_SERVED = "echo floor, served as the service serves"


# A second server as batching off's, driven right after it: how far apart two identical servers
# measure, beside the ratio of batching on and off, which at c=1 run the same path.
OFF_AGAIN = "v1 predict, batching off, a second server"

# The batching-on server with OpenTelemetry on, exporting over OTLP to bench.otlp_sink, its
# sampler keeping 1 % and every one of the spans: what tracing costs (off is "batching on").
# The batching-on server over TLS (GELU_TLS_*, a certificate made for the run): wrk over https.
OVER_TLS = "v1 predict, over TLS"

TRACED = {"0.01": "v1 predict, traced 1 %", "1.0": "v1 predict, traced 100 %"}

# The batching-on server with Triton's response cache on for the small model: every request
# the same (each a hit after the first), and every request different (each a miss, inserted).
CACHE_HIT = "v1 predict, response cache hit"
CACHE_MISS = "v1 predict, response cache miss (unique inputs)"

# Many models (bench.fleet): the small model, batching on, served from a repository holding it
# alone and from one holding 20 other models beside it; and the two servers idle.
FLEET_ALONE = "v1 predict, its model alone loaded"
FLEET_CROWDED = "v1 predict, 20 other models loaded"
IDLE_ALONE = "idle server, 1 model loaded"
IDLE_CROWDED = "idle server, 21 models loaded"


def priority_scenario(model: str, level: str) -> str:
    """A row of ``bench.priority``'s overload: one level's clients (``high``, priority 1;
    ``low``, priority 2) on one of its models (``ranked``, two levels; ``plain``, one queue).
    Its "concurrency" is the number of lower-level clients driven beside (0: the higher alone)."""
    return f"priority {level} clients, {model} model"


@dataclass
class Results:
    """Everything one run measured, as written to benchmarks.json."""

    environment: dict[str, Any]
    http: list[dict[str, Any]] = field(default_factory=list)
    compute: dict[str, Any] = field(default_factory=dict)
    activations: list[dict[str, Any]] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, float] = field(default_factory=dict)  # ms per activation call, in process
    instructions: dict[str, float] = field(default_factory=dict)  # per request, by state
    gpu: dict[str, Any] = field(default_factory=dict)  # bench.gpu: CPU against CUDA, or why not
    priority: list[dict[str, Any]] = field(default_factory=list)  # bench.priority's, per level
    idle: list[dict[str, Any]] = field(default_factory=list)  # bench.fleet: idle servers' cores

    def find(self, rows: list[dict[str, Any]], scenario: str, concurrency: int) -> dict[str, Any]:
        """The row of ``scenario`` at ``concurrency``; empty when it was not measured."""
        return next(
            (r for r in rows if r["scenario"] == scenario and r["concurrency"] == concurrency), {}
        )

    def rps(self, scenario: str, concurrency: int) -> float:
        return float(self.find(self.http, scenario, concurrency).get("rps", float("nan")))


def load_results(path: Path) -> Results:
    """A run's results back from its benchmarks.json."""
    return Results(**json.loads(path.read_text()))


def median_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario and concurrency: the round of median requests/s (the lower
    middle one for an even count), with every round's requests/s in ``rounds_rps``, p99 in
    ``rounds_p99_ms``, server CPU per request in ``rounds_cpu_us_per_request``, and the
    errors of all rounds together in ``rounds_errors``."""
    taken: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        taken.setdefault((row["scenario"], row["concurrency"]), []).append(row)
    kept = []
    for measured in taken.values():
        ordered = sorted(measured, key=lambda r: r["rps"])
        median = ordered[(len(ordered) - 1) // 2]
        kept.append({
            **median,
            "rounds_rps": [r["rps"] for r in measured],
            "rounds_p99_ms": [r["p99_ms"] for r in measured],
            "rounds_cpu_us_per_request": [r.get("cpu_us_per_request") for r in measured],
            "rounds_errors": sum(r["errors"] for r in measured),
            "rounds_host_ms": [r.get("host_ms", {}) for r in measured],
            "rounds_server_pid": [r["server_pid"] for r in measured],
        })  # fmt: skip
    return kept


def probe_text(row: dict[str, Any]) -> str:
    """A point's probe readings (``bench.speed``), CPU by CPU: ``0.57`` or ``0.57 / 0.93``."""
    readings = row.get("host_ms", {})
    return " / ".join(f"{readings[cpu]:.2f}" for cpu in sorted(readings))
