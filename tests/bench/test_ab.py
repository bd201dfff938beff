"""bench.ab: two checkouts measured by one harness."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import ab, compare
from bench.launch import Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # real servers
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk missing: `make tools` installs it")
def test_two_checkouts_by_one_harness(bench_repository: Path, tmp_path: Path) -> None:
    """bench.ab serves two checkouts (here this one twice) side by side, the two checkouts'
    points back to back, and writes a run for each that bench.compare reads. One pass: what
    passes do to one another is the next test's."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.ab", str(ROOT), str(ROOT), "--out", str(tmp_path),
         "--rounds", "1", "--seconds", "1", "--kinds", "v1",
         "--repository", str(bench_repository)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    v1 = [line.split()[0] for line in result.stdout.splitlines() if "v1 predict" in line]
    # six v1 points a pass, old first in the first: c=64 in turn, then c=1 on and off in turn
    assert v1 == ["old", "new", "old", "old", "new", "new"], v1
    assert "v2-" not in result.stdout
    pids = set()
    for tree in ("old", "new"):
        rows = json.loads((tmp_path / f"{tree}-1.json").read_text())["http"]
        assert {(r["scenario"], r["concurrency"]) for r in rows} == {
            ("http floor", 64),
            ("v1 predict, batching on", 64),
            ("v1 predict, batching on", 1),
            ("v1 predict, batching off", 1),
        }  # fmt: skip
        assert all(r["errors"] == 0 and r["rps"] > 0 for r in rows), rows
        pids |= {(r["scenario"], r["rounds_server_pid"][0]) for r in rows}
    # one floor for both, and each checkout's own batching-on and -off servers
    on_and_off = {pid for scenario, pid in pids if scenario != "http floor"}
    assert len(on_and_off) == 4 and len({pid for _, pid in pids}) == 5, pids

    lines = compare.table(tmp_path).splitlines()
    assert len(lines) == 2 + 2 and all(" [" in line for line in lines[2:]), lines


def test_each_pass_has_new_servers_and_the_other_checkout_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every pass starts a floor and each checkout's two servers anew and stops them after;
    the checkouts' points go in turn, the other one first every other pass; each row is the
    median of the passes, every pass's server named."""
    started: list[int] = []
    running: set[int] = set()

    @contextmanager
    def server(app: str, env: dict[str, str], *args: Any, **kwargs: Any) -> Iterator[Server]:
        pid = len(started) + 1000
        started.append(pid)
        running.add(pid)
        yield Server(f"http://127.0.0.1:{pid}", pid, {0})
        running.remove(pid)

    driven: list[tuple[int, int]] = []  # (server pid, connections)

    def measure(target: Server, request: Any, c: int, *args: Any) -> dict[str, Any]:
        assert target.pid in running
        driven.append((target.pid, c))
        rps = 100.0 * len(driven)
        return {"rps": rps, "p99_ms": 1.0, "errors": 0, "server_pid": target.pid}

    monkeypatch.setattr(ab, "server", server)
    monkeypatch.setattr(ab, "measure", measure)
    monkeypatch.setattr(ab, "drive", lambda target, *args: None)
    # the requests' values do not matter here (real digits would import scikit-learn)
    monkeypatch.setattr(ab, "sample_inputs", lambda n: np.zeros((1, n), np.float32))
    args = argparse.Namespace(old=tmp_path, new=tmp_path, repository=tmp_path, seconds=1.0,
                              kinds="v1", rounds=2)  # fmt: skip
    harness = ab.AB(args, host=None)  # type: ignore[arg-type]
    firsts = []
    for round_index in range(2):
        servers, points = len(started), len(driven)
        harness.one_pass(round_index)
        assert len(started) == servers + 5 and not running  # a floor, 2 x (on, off)
        firsts.append(driven[points + 1])  # after the floor's point, the first c=64 one
    # the first pass drives old first, the second new: their servers were started in that pass
    trees: dict[int, str] = {}
    for tree in ("old", "new"):
        for row in harness.rows[tree]:
            trees.setdefault(row["server_pid"], tree)
    assert [trees[pid] for pid, _ in firsts] == ["old", "new"], (firsts, trees)
    harness.write(tmp_path / "out")
    for tree in ("old", "new"):
        rows = json.loads((tmp_path / "out" / f"{tree}-1.json").read_text())["http"]
        assert len(rows) == 4, rows
        for row in rows:  # the lower of two passes, each pass's own server
            assert row["rps"] == min(row["rounds_rps"]) and len(row["rounds_rps"]) == 2, row
            assert len(set(row["rounds_server_pid"])) == 2, row
