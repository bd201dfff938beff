"""A seeded mutation fuzz of ``config.pbtxt`` (issue 62 item 3): random edits of the configs
export writes and the tests' repositories hold. The parser either returns a config, which then
survives a write and a read unchanged, or raises ``ConfigParseError`` naming the file; never
any other exception."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.model_config import (
    MAX_CONFIG_DEPTH,
    ConfigParseError,
    EnsembleStep,
    ModelConfig,
    load_model_config,
)
from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM
from contract.triton import model_config_pb2 as triton

CASES = 3000
SEED = 62

# Additions to the exported configs, as the tests and Triton's documentation write them: every
# field the service acts on, and some it does not.
EXTRAS = """
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0 ] } ]
model_warmup [
  {
    name: "sample"
    batch_size: 8
    inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 64 ] random_data: true } }
    count: 2
  },
  {
    name: "digit"
    batch_size: 1
    inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 64 ] input_data_file: "zero" } }
  }
]
response_cache { enable: true }
optimization { cuda { graphs: true graph_spec [ { batch_size: 1 }, { batch_size: 4 } ] } }
parameters { key: "x" value: { string_value: "café" } }
"""


def _names() -> list[str]:
    """Every field and enum value name of Triton's schema, for inserted fields."""
    names: set[str] = set()
    pending = list(triton.DESCRIPTOR.message_types_by_name.values())
    while pending:
        message = pending.pop()
        names.update(message.fields_by_name)
        names.update(v.name for e in message.enum_types for v in e.values)
        pending.extend(message.nested_types)
    names.update(v.name for v in triton.DataType.DESCRIPTOR.values)
    return sorted(names)


NAMES = _names()
VALUES = [
    "0", "-1", "1", "18446744073709551616", "-9223372036854775809", "0x7fffffffffffffff",
    "1e309", "-inf", "nan", "1.5", "true", "false", '"x"', '"café"', r'"\377\376"', '"\\',
    '"', "'", "TYPE_FP32", "TYPE_STRING", "KIND_GPU", "{ }", "[ ]", "[ 1, 2 ]", "[ { } ]", "<>",
    "{", "}", "[", "]", ":", ",", ";", "#", "\x00", "\u2028",
]  # fmt: skip


def _flip(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]


def _delete(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 40) :]


def _lines(edit: Callable[[list[bytes], random.Random], None]) -> Callable[..., bytes]:
    def mutate(data: bytes, rng: random.Random) -> bytes:
        lines = data.split(b"\n")
        edit(lines, rng)
        return b"\n".join(lines)

    return mutate


def _duplicate_line(lines: list[bytes], rng: random.Random) -> None:
    at = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[at])


def _delete_line(lines: list[bytes], rng: random.Random) -> None:
    del lines[rng.randrange(len(lines))]


def _swap_lines(lines: list[bytes], rng: random.Random) -> None:
    a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[a], lines[b] = lines[b], lines[a]


def _insert_field(data: bytes, rng: random.Random) -> bytes:
    """A field of Triton's schema (or a value) with a random value, anywhere."""
    field = f"{rng.choice(NAMES)}{rng.choice([': ', ' ', ''])}{rng.choice(VALUES)} "
    at = rng.randrange(len(data) + 1)
    return data[:at] + field.encode() + data[at:]


def _replace_number(data: bytes, rng: random.Random) -> bytes:
    """A digit's place taken by a huge, negative or odd number."""
    digits = [i for i, b in enumerate(data) if chr(b).isdigit()]
    if not digits:
        return data
    at = rng.choice(digits)
    number = rng.choice(["99999999999999999999", "-2147483649", "2147483648", "-0", "0x10", "1.0",
                         "3", "16", "0"])  # fmt: skip
    return data[:at] + number.encode() + data[at + 1 :]


def _nest(data: bytes, rng: random.Random) -> bytes:
    """Deep nesting: of real field names (as far as the schema goes), or of bare braces."""
    depth = rng.choice([MAX_CONFIG_DEPTH - 1, MAX_CONFIG_DEPTH, MAX_CONFIG_DEPTH + 1, 5000])
    opener = rng.choice(["optimization { cuda { graph_spec { ", "parameters { ", "{ ", "[ ", "< "])
    closer = {"{": "}", "[": "]", "<": ">"}[opener.strip()[-1]]
    return data + (opener * depth + closer * (depth * 3 if rng.random() < 0.5 else 0)).encode()


def _non_utf8(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe9", b"\x80"]) + data[at:]


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


MUTATIONS = (
    _flip, _delete, _lines(_duplicate_line), _lines(_delete_line), _lines(_swap_lines),
    _insert_field, _insert_field, _replace_number, _nest, _non_utf8, _truncate,
)  # fmt: skip


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
    started = time.perf_counter()
    for case in range(CASES):
        data = rng.choice(seeds)
        for _ in range(rng.randint(1, 3)):
            data = rng.choice(MUTATIONS)(data, rng) if data else data
        try:
            parsed = _check(data)
        except Exception as exc:
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}\n{data!r}")
        outcomes["parsed" if parsed is not None else "refused"] += 1
    elapsed = time.perf_counter() - started
    # Both outcomes are exercised: the fuzz edits configs, not only breaks them.
    assert outcomes["parsed"] > CASES // 25 and outcomes["refused"] > CASES // 2, outcomes
    assert elapsed < 20, f"{CASES} cases took {elapsed:.1f} s"
