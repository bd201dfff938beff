"""bench.pairs: paired in-process runs of two trees, their median difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import pairs


def test_the_difference_is_over_the_pairs_that_ran_both(tmp_path: Path) -> None:
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    one.write_text("1 a 41.0\n1 b 40.0\n2 b 40.0\n2 a 43.0\n3 a 50.0\n")  # pair 3: a alone
    two.write_text("1 a 40.0\n1 b 40.0\n")  # pair 1 again, a pair of its own in this file
    found = pairs.runs(one, two)
    assert sorted(found) == [(0, 1), (0, 2), (0, 3), (1, 1)]
    median, low, high = pairs.difference(found, "a", "b")
    assert median == 1.0  # of 1, 3 and 0
    assert low <= median <= high and (low, high) != (median, median)
    assert pairs.difference(found, "b", "a")[0] == -1.0


def test_trees_that_never_ran_together_are_an_error(tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    runs.write_text("1 a 41.0\n2 b 40.0\n")
    with pytest.raises(ValueError, match="no pair ran both 'a' and 'b'"):
        pairs.difference(pairs.runs(runs), "a", "b")


def test_the_command_prints_the_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs.txt"
    runs.write_text("1 a 41.5\n1 b 40.0\n")
    pairs.main([str(runs), "a", "b"])
    assert capsys.readouterr().out == "a - b: median 1.50 µs, 95 % bootstrap [1.50, 1.50]\n"
