"""A pytest plugin: the tests run as a serving install runs them, with torch, ``models/``,
scikit-learn and onnxscript unimportable (``python -m pytest -p tests.serving_install``, the
serving-install parts of ``make pytest``). A test skipped for any reason but the want of a
GPU fails the run, so that nothing is skipped for want of what a serving install lacks."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

import pytest

ABSENT = ("torch", "models", "sklearn", "onnxscript")


class Absent(importlib.abc.MetaPathFinder):
    """What a serving install lacks: importing it fails, as there."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before any conftest (and whatever it imports) loads."""
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ABSENT)
    if loaded:
        raise pytest.UsageError(f"tests.serving_install: {loaded} imported before it")
    sys.meta_path.insert(0, Absent())
    early_config.pluginmanager.register(Skips(), "serving-install-skips")


class Skips:
    """Every skip whose reason is not a GPU's, reported at the end and failing the run."""

    def __init__(self) -> None:
        self.unexpected: list[str] = []

    def note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            if "GPU" not in reason:
                self.unexpected.append(f"{report.nodeid}: {reason}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.note(report)  # a module skipped whole at import (pytest.importorskip)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.note(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.unexpected:
            terminalreporter.section("skipped, not for want of a GPU", red=True)
            for line in self.unexpected:
                terminalreporter.line(line)
