"""workbench.timing: two revisions of a small repository, cloned, run and timed in turn."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from workbench.timing import (
    Measurement,
    ci_parts,
    clean_environment,
    main,
    markdown,
    order,
    rows,
)

# A stand-in for the project: `make run` serves /v2/health/ready (after a moment, as a real
# start does), `make test` and `.ci/run` print the lines the parts are read from.
MAKEFILE = """\
PORT ?= 8000
run:
\t@echo .venv/bin/gelu-serve models --repository model_repository
\t@echo .venv/bin/gelu-serve serve --port $(PORT)
\texec python3 server.py $(PORT)
test:
\t@echo .venv/bin/ruff check .
\t@echo .venv/bin/pytest -q
\tsleep {test_seconds}
"""
SERVER = """\
import http.server, sys, time
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
time.sleep(0.3)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""
CI = "#!/bin/sh\nset -e\nmake test\necho '== 1. tools'\nsleep 0.2\n"


def git(repository: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repository, check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """Two commits: the old one's `make test` slower than the new one's."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "server.py").write_text(SERVER)
    (repo / ".ci" / "run").write_text(CI)
    (repo / ".ci" / "run").chmod(0o755)
    git(repo, "init", "-q")
    for seconds in ("0.6", "0.1"):
        (repo / "Makefile").write_text(MAKEFILE.format(test_seconds=seconds))
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"make test in {seconds} s")
    return repo


def test_two_revisions_are_timed_from_fresh_clones(repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    main(["--old", "HEAD~1", "--new", "HEAD", "--repository", str(repository), "--out",
          str(out), "--steps", "run-warm,test,ci", "--no-floor", "--limit", "60"])  # fmt: skip
    report = json.loads((out / "results.json").read_text())
    measured = report["measurements"]
    # The caches are primed first, then each step of each revision, taking turns.
    assert [(m["step"], m["label"]) for m in measured] == [
        ("prime", "old"), ("prime", "new"),
        ("run-warm", "new"), ("run-warm", "old"),
        ("test", "old"), ("test", "new"),
        ("ci", "new"), ("ci", "old"),
    ]  # fmt: skip
    assert all(m["ok"] for m in measured), measured
    assert all(len(m["load"]) == 2 and min(m["load"]) >= 0 for m in measured), measured
    run = next(m for m in measured if m["step"] == "run-warm")
    assert 0 <= run["parts"]["models"] <= run["parts"]["serve"] < run["seconds"]
    # Each revision's own Makefile ran: the old one's `make test` sleeps longer.
    for m in measured:
        if m["step"] == "test":
            assert f"sleep {'0.6' if m['label'] == 'old' else '0.1'}" in Path(m["log"]).read_text()
    ci = next(m for m in measured if m["step"] == "ci")
    assert 0 <= ci["parts"]["pytest"] < ci["parts"]["e2e"] < ci["seconds"]
    assert not (out / "clones").exists() or not any((out / "clones").iterdir())
    page = (out / "workbench.md").read_text()
    assert "| test |" in page and "| ci: make test |" in page and "| ci: docker/e2e.sh |" in page
    assert report["revisions"]["old"] != report["revisions"]["new"]


def test_a_run_that_never_answers_is_a_failure(repository: Path, tmp_path: Path) -> None:
    (repository / "server.py").write_text("import time\ntime.sleep(60)\n")
    git(repository, "commit", "-q", "-am", "never ready")
    out = tmp_path / "out"
    main(["--old", "HEAD~1", "--new", "HEAD", "--repository", str(repository), "--out",
          str(out), "--steps", "run-warm", "--no-prime", "--no-floor", "--limit", "3"])  # fmt: skip
    measured = json.loads((out / "results.json").read_text())["measurements"]
    assert [(m["label"], m["ok"]) for m in measured] == [("new", False), ("old", True)]
    assert "run-warm of new (round 1) failed" in (out / "workbench.md").read_text()


def measurement(
    step: str, label: str, seconds: float, load: tuple[float, float] = (1.0, 2.0), **parts: float
) -> Measurement:
    return Measurement(step, label, "0" * 40, 1, seconds, True, parts, "", list(load))


def test_the_table_takes_medians_and_judges_the_targets() -> None:
    results = [
        measurement("run-warm", "old", 150), measurement("run-warm", "new", 40),
        measurement("run-warm", "old", 160), measurement("run-warm", "new", 50),
        measurement("run-warm", "new", 60, load=(0.5, 6.3)),
        measurement("ci", "old", 1000, e2e=700), measurement("ci", "new", 800, e2e=400),
    ]  # fmt: skip
    assert rows(results) == [
        ("run-warm", 155, 50, 2),
        ("ci", 1000, 800, 1),
        ("ci: make test", 700, 400, 1),
        ("ci: docker/e2e.sh", 300, 400, 1),
    ]
    report = {"date": "d", "command": "c", "revisions": {"old": "a" * 40, "new": "b" * 40},
              "floor_rps": 3800.0, "host": {"cpu": "x", "cores": 2, "memory_gib": 24,
                                           "kernel": "k", "python": "3.11"}}  # fmt: skip
    page = markdown(report, results)
    # the load average beside each step, its least and most over the step's measurements
    assert "| run-warm | 155.0 | 50.0 | 0.32 | <= 0.30 MISSED | 2 | 0.5-6.3 |" in page
    assert "| ci: make test | 700.0 | 400.0 | 0.57 | <= 0.70 met | 1 | 1.0-2.0 |" in page
    assert "floor (one pinned core, c=64) 3,800 requests/s" in page


def test_turns_alternate_and_the_shell_s_venv_stays_behind() -> None:
    assert [order(("old", "new"), step, 1) for step in range(3)] == [
        ("new", "old"), ("old", "new"), ("new", "old"),
    ]  # fmt: skip
    assert order(("old", "new"), 0, 2) == ("old", "new")
    env = clean_environment({"VIRTUAL_ENV": "/v", "PATH": "/v/bin:/usr/bin", "MAKEFLAGS": "-j",
                             "HOME": "/root"})  # fmt: skip
    assert env == {"PATH": "/usr/bin", "HOME": "/root"}
    assert ci_parts(measurement("ci", "old", 10)) == {}
