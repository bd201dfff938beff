"""bench.wrk: wrk's counts, successes only."""

from __future__ import annotations

import itertools
import shutil
import time
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


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_a_point_with_no_answer_counts_as_failed(stub_server: Callable[..., str]) -> None:
    """A server that answers no request within the point's second: wrk reads 0 requests and 0
    errors; the point counts each connection's unanswered request as an error."""

    def slow(path: str) -> tuple[int, bytes]:
        time.sleep(2.5)
        return 200, b""

    row = run_wrk(stub_server(slow), Request("/", b"x", {}), 2, 1, None)
    assert row["requests"] == 0 and row["rps"] == 0
    assert row["errors"] == 2
