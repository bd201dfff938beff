"""workbench.subjects: the commit subjects after a base, held to 72 characters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.subjects import BASE, LIMIT, subjects, too_long

ROOT = Path(__file__).resolve().parents[2]


def git(repository: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repository, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A repository: a base commit with a long subject, then two commits after it."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x" * 100)
    git(tmp_path, "tag", "base")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "y" * LIMIT)
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "z" * (LIMIT + 1) + "\n\nbody " * 30)
    return tmp_path


def check(repository: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench.subjects", *args], cwd=repository,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip


def test_only_the_commits_after_the_base_are_held(history: Path) -> None:
    commits = subjects("base", cwd=history)
    assert [s for _, s in commits] == ["z" * (LIMIT + 1), "y" * LIMIT]
    (line,) = too_long(commits)
    assert f"({LIMIT + 1} > {LIMIT})" in line
    failed = check(history, "--base", "base")
    assert failed.returncode == 1 and "1 commit subject(s) over 72" in failed.stderr
    assert check(history, "--base", "base", "--head", "HEAD~1").returncode == 0


def test_a_base_missing_from_the_history_is_said(history: Path) -> None:
    failed = check(history, "--base", "0" * 40)
    assert failed.returncode == 1
    assert "not in this clone's history" in failed.stderr


def test_this_repository_s_base_is_in_its_history() -> None:
    """BASE names a commit that HEAD descends from, so CI checks the commits meant."""
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", BASE, "HEAD"], cwd=ROOT)
    assert ancestor.returncode == 0, f"{BASE} is not an ancestor of HEAD"
