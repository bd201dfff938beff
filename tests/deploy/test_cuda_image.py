"""Dockerfile.cuda's base image against the pinned onnxruntime-gpu, offline
(deploy/cuda_image.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploy import cuda_image

ROOT = Path(__file__).resolve().parents[2]


def _copy_checked_files(root: Path) -> None:
    """The three files the check reads, copied under ``root`` to be planted in."""
    for name in ("pyproject.toml", "Dockerfile.cuda", "deploy/cuda_image.json"):
        (root / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, root / name)


def test_the_cuda_image_carries_what_onnxruntime_gpu_links() -> None:
    assert cuda_image.check() == []


def test_a_base_of_another_cuda_major_is_caught(tmp_path: Path) -> None:
    """Planted: the base before this check (CUDA 12.8) under today's pin (CUDA 13)."""
    _copy_checked_files(tmp_path)
    dockerfile = tmp_path / "Dockerfile.cuda"
    image = cuda_image.base_image(dockerfile)
    dockerfile.write_text(dockerfile.read_text().replace(
        image, "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"))  # fmt: skip
    problems = cuda_image.check(tmp_path)
    assert any(p.startswith("libcublas.so.13 needed, but CUDA 12") for p in problems)
    assert any(p.startswith("libcudart.so.13 needed") for p in problems)


def test_a_pin_the_record_does_not_describe_is_caught(tmp_path: Path) -> None:
    _copy_checked_files(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    version = cuda_image.pinned_version(pyproject)
    pyproject.write_text(pyproject.read_text().replace(f"=={version}", "==9.9.9"))
    assert "pyproject.toml pins 9.9.9" in cuda_image.check(tmp_path)[0]


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        ("nvidia/cuda:13.0.2-runtime-ubuntu24.04", "no cuDNN"),
        ("ubuntu:24.04", "not an nvidia/cuda"),
        ("nvidia/cuda:14.0.0-cudnn-runtime-ubuntu24.04", "CUDA 14 is not in"),
    ],
)
def test_tags_it_cannot_vouch_for_are_refused(image: str, problem: str) -> None:
    assert problem in " ".join(cuda_image.mismatches(["libcublas.so.13"], image))


def test_the_record_is_what_the_pinned_wheel_needs() -> None:
    """Read from the wheel itself when docker/fetch-wheels.sh (EXTRAS=gpu) has fetched it."""
    recorded = json.loads(cuda_image.RECORD.read_text())
    wheels = sorted((ROOT / "wheels").glob(f"onnxruntime_gpu-{recorded['version']}-*.whl"))
    if not wheels:
        pytest.skip(f"onnxruntime-gpu {recorded['version']} is not in wheels/: fetch it with "
                    "EXTRAS=gpu docker/fetch-wheels.sh")  # fmt: skip
    assert cuda_image.wheel_needs(wheels[0]) == recorded["needed"]
