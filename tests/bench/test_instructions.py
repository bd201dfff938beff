"""bench.instructions: instructions counted under callgrind, per request."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import instructions
from bench.instructions import total
from bench.measure import sample_inputs


@pytest.mark.slow  # half a minute under valgrind
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="`make tools` installs valgrind")
def test_instructions_are_counted_per_request_in_each_state(model_repository: Path) -> None:
    counted = instructions.count(model_repository, sample_inputs(64), calls=100)
    assert counted is not None and list(counted) == list(instructions.STATES)
    on, off = counted.values()
    # one small request's core and run, not start-up's billions or an empty window; batching
    # on runs a lone client's requests as off does, after a check
    assert 50_000 < off < 2_000_000 and 0.9 < on / off < 1.1, counted


def test_a_callgrind_total_is_its_totals_line() -> None:
    # a part written after instrumentation was turned off and on: its summary wrapped below 0
    part = "events: Ir\nsummary: 18446744073709464703\n\nfn=(1) x\n0 23872822\ntotals: 23872822\n"
    assert total(part) == 23872822
    with pytest.raises(ValueError, match="no totals"):
        total("events: Ir\nsummary: 1\n")
