"""A seeded mutation fuzz of ``config.pbtxt`` (issue 62 item 3): random edits of the configs
export writes and the tests' repositories hold. The parser either returns a config, which then
survives a write and a read unchanged, or raises ``ConfigParseError`` naming the file; never
any other exception."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from contract.model_config import (
    ConfigParseError,
    EnsembleStep,
    ModelConfig,
    load_model_config,
)
from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM
from tests.mutations import EXTRAS, mutated

CASES = 3000
SEED = 62


def _seeds(model_repository: Path) -> list[bytes]:
    """The configs of the tests' repository (as export writes them), each also with every
    field the service reads added, an ensemble of two of them, and one without a name."""
    configs = [p.read_bytes() for p in sorted(model_repository.glob(f"*/{CONFIG_FILENAME}"))]
    mlp = load_model_config(configs[0])
    ensemble = dataclasses.replace(
        mlp,
        name="ensemble",
        platform=ENSEMBLE_PLATFORM,
        dynamic_batching=False,
        max_queue_delay_us=None,
        steps=(
            EnsembleStep("a", -1, (("input", "input"),), (("logits", "x"),)),
            EnsembleStep("b", 2, (("input", "x"),), (("logits", "logits"),)),
        ),
    )
    nameless = b"\n".join(x for x in configs[0].split(b"\n") if not x.startswith(b"name:"))
    policy = b"version_policy: { specific: { versions: [ 1, 2 ] } }"
    full = [c.replace(b"version_policy { all { } }", policy) + EXTRAS.encode() for c in configs]
    return [*configs, *full, ensemble.to_pbtxt().encode(), nameless]


def _check(data: bytes) -> ModelConfig | None:
    """The parser's answer to ``data``: a config that writes and reads back unchanged, or
    ``None`` for a ConfigParseError that names the file; any other exception propagates."""
    try:
        config = load_model_config(data, "digits-mlp")
    except ConfigParseError as exc:
        assert str(exc).startswith(f"{CONFIG_FILENAME}"), str(exc)
        assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)
        return None
    assert load_model_config(config.to_pbtxt()) == dataclasses.replace(config, unhonoured=())
    return config


def test_mutated_configs_parse_or_raise_config_parse_error(model_repository: Path) -> None:
    """Issue 62 item 3: a few thousand seeded random edits (byte flips, deletions, lines
    duplicated, deleted or swapped, fields of Triton's schema inserted with random values, huge
    numbers, deep nesting, bytes that are not UTF-8, truncation) of real configs."""
    seeds = _seeds(model_repository)
    for seed in seeds:
        assert _check(seed) is not None  # every seed is a valid config
    rng = random.Random(SEED)
    outcomes = {"parsed": 0, "refused": 0}
    for case in range(CASES):
        data = mutated(rng.choice(seeds), rng)
        try:
            parsed = _check(data)
        except Exception as exc:
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}\n{data!r}")
        outcomes["parsed" if parsed is not None else "refused"] += 1
    # Both outcomes are exercised: the fuzz edits configs, not only breaks them.
    assert outcomes["parsed"] > CASES // 25 and outcomes["refused"] > CASES // 2, outcomes
