"""Seeded random edits of ``config.pbtxt`` files: what the parser's fuzz and the attack
battery's poller fuzz (issue 62 item 3) feed the service."""

from __future__ import annotations

import random
from collections.abc import Callable

from contract.model_config import MAX_CONFIG_DEPTH
from contract.triton import model_config_pb2 as triton

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
parameters { key: "batch_invariant" value: { string_value: "pad" } }
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


def mutated(data: bytes, rng: random.Random) -> bytes:
    """``data`` after one to three of ``MUTATIONS``, chosen by ``rng``."""
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(MUTATIONS)(data, rng) if data else data
    return data
