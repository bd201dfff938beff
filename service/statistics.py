"""Triton's statistics extension: per model version, what was inferred and where the time went.

One ``ModelStatistics`` per serving version. The core records each request's outcome and time
(``success`` / ``fail``), the batcher each request's wait (``queue``), and whoever runs a batch
its three phases: gathering the inputs (``compute_input``), the onnxruntime run itself
(``compute_infer``) and splitting the outputs (``compute_output``), per request and per batch
size (``batch_stats``). ``to_triton()`` answers as Triton's ``ModelStatistics`` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    """How many times, and how long in all (ns)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns * count

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStatistics:
    """The runs of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStatistics:
    """Triton's statistics of one model version."""

    inference_count: int = 0  # samples inferred
    execution_count: int = 0  # onnxruntime runs
    last_inference: int = 0  # ms since the epoch
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)  # lookups that answered
    cache_miss: Duration = field(default_factory=Duration)  # lookups and insertions that did not
    batches: dict[int, BatchStatistics] = field(default_factory=dict)

    def record_request(self, ok: bool, ns: int) -> None:
        """One request's outcome and its time from arrival at the core to its result."""
        (self.success if ok else self.fail).add(ns)
        self.last_inference = time.time_ns() // 1_000_000

    def record_run(
        self, samples: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One onnxruntime run of ``samples`` samples serving ``requests`` requests; each
        request is charged the run's phases, as Triton does."""
        self.inference_count += samples
        self.execution_count += 1
        # Plain arithmetic: this runs once per batch on the request path.
        self.compute_input.count += requests
        self.compute_input.ns += input_ns * requests
        self.compute_infer.count += requests
        self.compute_infer.ns += infer_ns * requests
        self.compute_output.count += requests
        self.compute_output.ns += output_ns * requests
        batch = self.batches.get(samples)
        if batch is None:
            batch = self.batches[samples] = BatchStatistics()
        batch.compute_input.count += 1
        batch.compute_input.ns += input_ns
        batch.compute_infer.count += 1
        batch.compute_infer.ns += infer_ns
        batch.compute_output.count += 1
        batch.compute_output.ns += output_ns

    def to_triton(self, name: str, version: str) -> dict[str, object]:
        """Triton's ``ModelStatistics`` JSON."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": self.cache_hit.to_json(),
                "cache_miss": self.cache_miss.to_json(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": batch.compute_input.to_json(),
                    "compute_infer": batch.compute_infer.to_json(),
                    "compute_output": batch.compute_output.to_json(),
                }
                for size, batch in sorted(self.batches.items())
            ],
        }
