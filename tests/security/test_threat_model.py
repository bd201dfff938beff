"""docs/security.md's threat model names, for each claim, the tests that hold it: each named
test module and test exists, so a claim cannot outlive its test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "security.md"


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def threat_model() -> str:
    return section("Threat model")


def references(section: str) -> list[tuple[Path, str | None]]:
    """Every test module ``test_x.py`` or ``test_x.py::test_name`` in backticks; a bare file
    name is under tests/security/, and a name ending in ``*`` is a prefix."""
    found = []
    for module, name in re.findall(r"`((?:tests/[\w/]+/)?test_\w+\.py)(?:::(\w+\*?))?`", section):
        path = ROOT / module if module.startswith("tests/") else ROOT / "tests/security" / module
        found.append((path, name or None))
    return found


@pytest.mark.parametrize(("title", "least"), [("Threat model", 15), ("Ray Serve", 8)])
def test_every_test_the_threat_model_names_exists(title: str, least: int) -> None:
    named = references(section(title))
    assert len(named) > least, named  # the tables were read
    for path, name in named:
        assert path.is_file(), path
        if name is None:
            continue
        tests = {
            node.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        prefix = name.removesuffix("*")
        assert any(t == name or (name.endswith("*") and t.startswith(prefix)) for t in tests), (
            f"{path.relative_to(ROOT)} has no {name}"
        )
