"""bench.wrk: wrk's counts, successes only."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable

import pytest

from bench.wrk import Request, run_wrk


def test_wrk_counts_successes_only(stub_server: Callable[..., str]) -> None:
    """Through wrk itself, against a server that answers every other request with 503."""
    if shutil.which("wrk") is None:
        pytest.skip("wrk missing: `make tools` installs it")
    served = itertools.count(1)
    url = stub_server(lambda path: (503 if next(served) % 2 else 200, b""))
    row = run_wrk(url, Request("/", b"x", {}), 1, 1, None)
    assert row["errors"] >= row["requests"] // 2 - 1 > 0
    answered = row["requests"] - row["errors"]
    assert row["rps"] < row["requests"] * 0.6 and row["rps"] >= answered * 0.5  # successes only
