"""tests.serving_install: tests run as a serving install runs them (``make pytest``'s serving
parts); a skip for want of anything but a GPU fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_as_serving(folder: Path, source: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_it.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p",
         "tests.serving_install", "--rootdir", str(folder), str(folder)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow  # two pytest runs in processes of their own
def test_what_a_serving_install_lacks_cannot_be_imported(tmp_path: Path) -> None:
    source = """
import importlib, pytest

@pytest.mark.parametrize("name", ["torch", "torch.nn", "models.train", "sklearn", "onnxscript"])
def test_absent(name):
    with pytest.raises(ModuleNotFoundError, match=name.split(".")[0]):
        importlib.import_module(name)

def test_the_serving_install_has_the_rest():
    import numpy, onnxruntime, service.dataplane

@pytest.mark.skip(reason="needs onnxruntime-gpu and a GPU")
def test_on_a_gpu():
    pass
"""
    result = run_as_serving(tmp_path, source)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed, 1 skipped" in result.stdout, result.stdout


@pytest.mark.slow
def test_a_skip_for_want_of_anything_else_fails_the_run(tmp_path: Path) -> None:
    source = """
import pytest

def test_passes():
    pass

def test_needs_training():
    pytest.importorskip("torch", reason="training needs the [train] extra")
"""
    result = run_as_serving(tmp_path, source)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout, result.stdout
    summary = result.stdout.split("skipped, not for want of a GPU")[1]
    assert "test_it.py::test_needs_training: " in summary, result.stdout
    assert "training needs the [train] extra" in summary, result.stdout

    # a module skipped whole at import counts too
    result = run_as_serving(tmp_path, 'import pytest\npytest.importorskip("sklearn")\n')
    assert result.returncode == 1, result.stdout + result.stderr
    assert "test_it.py: Skipped: could not import 'sklearn'" in result.stdout, result.stdout
