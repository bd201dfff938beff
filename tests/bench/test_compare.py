"""bench.compare: two serving codes' rows, each pooled over its runs, new over old."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import compare


def _point(scenario: str, c: int, rps: list[float], host: list[float] | None = None) -> dict:
    row = {"scenario": scenario, "concurrency": c, "rps": sorted(rps)[len(rps) // 2],
           "rounds_rps": rps, "errors": 0}  # fmt: skip
    if host is not None:
        row["rounds_host_ms"] = [{"0": ms} for ms in host]
    return row


def _run(folder: Path, name: str, v1_64: list[float], on_1: list[float],
         host: list[float] | None = None) -> None:  # fmt: skip
    """A run of three passes: the floor at 100 req/s, V1 at c=64, and V1 on (and off, at 100)
    at c=1."""
    folder.mkdir(exist_ok=True)
    rows = [_point("http floor", 64, [100.0] * 3, host),
            _point("v1 predict, batching on", 64, v1_64, host),
            _point("v1 predict, batching on", 1, on_1),
            _point("v1 predict, batching off", 1, [100.0] * 3)]  # fmt: skip
    (folder / f"{name}.json").write_text(json.dumps({"http": rows}))


def test_a_row_is_new_over_old_and_met_only_when_its_interval_is(tmp_path: Path) -> None:
    _run(tmp_path, "old-1", [150.0] * 3, [100.0] * 3)
    _run(tmp_path, "new-1", [140.0] * 3, [99.0] * 3)
    lines = compare.table(tmp_path).splitlines()
    assert lines[2:] == [  # V2's rows: measured by neither, so left out
        "| v1 at c=64, share of the HTTP floor (3 / 3) | 150% | 140% | 0.933 [0.933, 0.933] "
        "| **no** |",
        "| v1 at c=1, batching on against off (3 / 3) | 1.00x | 0.99x | 0.990 [0.990, 0.990] "
        "| yes |",
    ]


def test_the_runs_of_every_folder_named_are_pooled(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _run(first, "old-1", [150.0] * 3, [100.0] * 3)
    _run(first, "new-1", [150.0] * 3, [100.0] * 3)
    _run(second, "old-1", [150.0] * 3, [100.0] * 3)
    _run(second, "new-1", [120.0] * 3, [100.0] * 3)
    # three passes of 150 % and three of 120 %: the median of the new tree's six is 135 %
    assert "| v1 at c=64, share of the HTTP floor (6 / 6) | 150% | 135% | 0.900 " in (
        compare.table(first, second)
    )


def test_a_pass_the_probe_read_at_two_speeds_is_not_counted(tmp_path: Path) -> None:
    # The new tree's third pass read the host 1.5x apart for the floor and V1: set aside.
    _run(tmp_path, "old-1", [150.0] * 3, [100.0] * 3)
    _run(tmp_path, "new-1", [150.0, 150.0, 60.0], [100.0] * 3)
    new = tmp_path / "new-1.json"
    rows = json.loads(new.read_text())["http"]
    rows[0]["rounds_host_ms"] = [{"0": 1.0}, {"0": 1.0}, {"0": 1.5}]
    rows[1]["rounds_host_ms"] = [{"0": 1.0}, {"0": 1.0}, {"0": 1.0}]
    new.write_text(json.dumps({"http": rows}))
    assert "| v1 at c=64, share of the HTTP floor (3 / 2) | 150% | 150% | 1.000 " in (
        compare.table(tmp_path)
    )


def test_no_folder_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one folder"):
        compare.table()


def test_the_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, "old-1", [150.0] * 3, [100.0] * 3)
    _run(tmp_path, "new-1", [150.0] * 3, [100.0] * 3)
    compare.main([str(tmp_path)])
    assert capsys.readouterr().out == compare.table(tmp_path) + "\n"
