"""The README is a guide: short, its links alive, and each figure it keeps the code's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_export_parity_it_quotes_is_the_exports() -> None:
    pytest.importorskip("onnxscript", reason="export needs the [train] extra")
    from export.onnx_export import PARITY_ATOL

    quoted = f"{PARITY_ATOL:.0e}".replace("e-0", "e-")  # 1e-5, as written
    assert f"agrees with PyTorch within {quoted}" in " ".join(README.split())


def test_the_accuracy_it_quotes_is_the_tests() -> None:
    pytest.importorskip("mpmath", reason="the reference needs mpmath (the dev extra)")
    from bench.accuracy import BOUNDS

    text = " ".join(README.split())
    assert f"within {max(BOUNDS.values()):g} ULP of the correctly rounded" in text
    # The sweep that proves it: tests/bench/test_exhaustive.py holds the committed report to it.
    swept = "at every one of the 2^32 float32 inputs, each swept by `make accuracy-exhaustive`"
    assert swept in text


def test_the_pins_it_quotes_are_pyprojects() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (torch,) = [d for d in extras["train"] if d.startswith("torch")]
    (ray,) = [d for d in extras["ray"] if d.startswith("ray")]
    assert f"torch {torch.split('==')[1]}" in README
    assert f"Ray Serve {ray.split('==')[1]}" in README
