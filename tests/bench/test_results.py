"""bench.results: a point's rounds kept as one row."""

from __future__ import annotations

from typing import Any

from bench.results import median_rounds


def row(scenario: str, c: int, rps: float, pid: int, errors: int = 0) -> dict[str, Any]:
    return {"scenario": scenario, "concurrency": c, "rps": rps, "p99_ms": rps / 100,
            "errors": errors, "server_pid": pid, "host_ms": {"0": 0.5}}  # fmt: skip


def test_a_points_rounds_become_the_median_round_with_every_rounds_figures() -> None:
    """One row per scenario and concurrency: the round of median requests/s (the lower middle
    one of an even count), every round's requests/s, p99 and server, and all their errors."""
    rows = [
        row("on", 1, 300, 11), row("on", 64, 900, 11), row("off", 1, 200, 12, errors=1),
        row("on", 1, 100, 21), row("on", 64, 700, 21), row("off", 1, 250, 22, errors=2),
        row("on", 1, 200, 31), row("on", 64, 800, 31),
    ]  # fmt: skip
    kept = {(r["scenario"], r["concurrency"]): r for r in median_rounds(rows)}
    assert list(kept) == [("on", 1), ("on", 64), ("off", 1)]
    on = kept["on", 1]
    assert (on["rps"], on["p99_ms"], on["server_pid"]) == (200, 2.0, 31)  # the middle of three
    assert on["rounds_rps"] == [300, 100, 200] and on["rounds_p99_ms"] == [3.0, 1.0, 2.0]
    assert on["rounds_server_pid"] == [11, 21, 31]
    off = kept["off", 1]
    assert off["rps"] == 200 and off["rounds_rps"] == [200, 250]  # the lower of two
    assert off["rounds_errors"] == 3 and off["errors"] == 1
    assert kept["on", 64]["rps"] == 800
