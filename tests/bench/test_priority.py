"""``bench.priority``: its models and what it makes of its clients' answers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.priority import CAP, Level, write_models
from contract.model_config import QueuePolicy, SchedulingPolicy
from service.repository.layout import read_config


def test_the_models_differ_only_in_their_levels(tmp_path: Path) -> None:
    write_models(tmp_path)
    ranked, plain = read_config(tmp_path / "ranked"), read_config(tmp_path / "plain")
    assert ranked.scheduling == SchedulingPolicy(
        2, 2, None, ((2, QueuePolicy(max_queue_size=CAP)),)
    )
    assert plain.scheduling is None and plain.dynamic_batching
    assert (ranked.max_batch_size, ranked.inputs, ranked.outputs) == (
        plain.max_batch_size, plain.inputs, plain.outputs
    )  # fmt: skip
    model = (tmp_path / "ranked" / "1" / "model.onnx").read_bytes()
    assert model == (tmp_path / "plain" / "1" / "model.onnx").read_bytes()


def test_a_level_counts_answers_and_refusals_and_times_the_answers() -> None:
    rows = [(200, 0.001 * i) for i in range(1, 101)] + [(503, 0.0)] * 7
    level = Level.of(rows)
    assert (level.answered, level.refused) == (100, 7)
    assert level.p50_ms == pytest.approx(50.5) and level.p99_ms == pytest.approx(99.01)
    refused = Level.of([(503, 0.0)])
    assert refused.answered == 0 and math.isnan(refused.p99_ms)
    with pytest.raises(AssertionError, match="500"):
        Level.of([(200, 0.1), (500, 0.1)])
