"""bench.report: the tables of a run's report."""

from __future__ import annotations

from bench.report import of_floors
from bench.results import ASGI_FLOOR, HTTP_FLOOR, Results


def test_each_row_is_shown_against_both_floors() -> None:
    results = Results(environment={}, http=[
        {"scenario": HTTP_FLOOR, "concurrency": 64, "rps": 8000.0},
        {"scenario": ASGI_FLOOR, "concurrency": 64, "rps": 40000.0},
        {"scenario": "v1 predict, batching on", "concurrency": 64, "rps": 12000.0},
        {"scenario": "v1 predict, batching on", "concurrency": 1, "rps": 900.0},
    ])  # fmt: skip
    assert of_floors(results, results.http[2]) == "150% / 30%"
    assert of_floors(results, results.http[3]) == "- / -"  # no floor measured at c=1
