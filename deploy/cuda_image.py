"""Does ``Dockerfile.cuda``'s base image carry the CUDA libraries the pinned onnxruntime-gpu
links? Checked offline, without a GPU or Docker.

The provider library in the onnxruntime-gpu wheel names the sonames it needs (ELF
``DT_NEEDED``: ``libcublas.so.13`` ...); the base image's tag names its CUDA release
(``nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04``). What the wheel needs is recorded in
``deploy/cuda_image.json``; ``python -m deploy.cuda_image --record WHEEL`` rewrites it from a
wheel (``docker/fetch-wheels.sh`` with ``EXTRAS=gpu`` fetches one) and a test holds the
record to the wheel whenever the wheel is in ``wheels/``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

from service.cuda import needed_libraries

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "deploy" / "cuda_image.json"
PROVIDER_LIBRARY = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
# The soname majors each CUDA release's libraries carry (NVIDIA's CUDA toolkit release notes).
SONAMES = {
    12: {"libcublas": 12, "libcublasLt": 12, "libcudart": 12, "libcufft": 11, "libcurand": 10,
         "libnvrtc": 12},
    13: {"libcublas": 13, "libcublasLt": 13, "libcudart": 13, "libcufft": 12, "libcurand": 10,
         "libnvrtc": 13},
}  # fmt: skip
_TAG = re.compile(r"^nvidia/cuda:(?P<major>\d+)\.\d+(?:\.\d+)?-(?P<flavour>[a-z0-9.-]+)$")


def wheel_needs(wheel: Path) -> list[str]:
    """The libraries the wheel's CUDA provider library needs, read from inside the wheel."""
    with zipfile.ZipFile(wheel) as archive, archive.open(PROVIDER_LIBRARY) as library:
        return needed_libraries(library)  # type: ignore[arg-type]


def base_image(dockerfile: Path) -> str:
    """The default of ``ARG CUDA_IMAGE`` in ``dockerfile``."""
    match = re.search(r"^ARG CUDA_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{dockerfile.name} has no ARG CUDA_IMAGE=...")
    return match.group(1)


def pinned_version(pyproject: Path) -> str:
    """The onnxruntime-gpu version the ``gpu`` extra pins (``==``)."""
    match = re.search(r'"onnxruntime-gpu==([^"]+)"', pyproject.read_text())
    if match is None:
        raise ValueError("pyproject.toml does not pin onnxruntime-gpu with ==")
    return match.group(1)


def mismatches(needed: list[str], image: str) -> list[str]:
    """What ``image`` lacks of ``needed``: one line per CUDA library whose soname major is
    not the one the image's CUDA release carries, or why the tag cannot be read."""
    match = _TAG.match(image)
    if match is None:
        return [f"{image}: not an nvidia/cuda:<version>-<flavour> tag"]
    major, flavour = int(match["major"]), match["flavour"]
    problems = []
    if "cudnn" not in flavour:
        problems.append(f"{image}: no cuDNN (onnxruntime-gpu needs a -cudnn- image)")
    carried = SONAMES.get(major)
    if carried is None:
        return [*problems, f"{image}: CUDA {major} is not in deploy/cuda_image.py's table"]
    for soname in needed:
        stem, _, version = soname.partition(".so.")
        if stem in carried and version.split(".")[0] != str(carried[stem]):
            problems.append(
                f"{soname} needed, but CUDA {major} ({image}) carries {stem}.so.{carried[stem]}"
            )
    return problems


def check(root: Path = ROOT) -> list[str]:
    """Every disagreement between the pin, the record and ``Dockerfile.cuda``'s base."""
    record = json.loads((root / "deploy" / "cuda_image.json").read_text())
    problems = []
    version = pinned_version(root / "pyproject.toml")
    if record["version"] != version:
        problems.append(
            f"deploy/cuda_image.json records onnxruntime-gpu {record['version']}, "
            f"pyproject.toml pins {version}: run python -m deploy.cuda_image --record WHEEL"
        )
    return problems + mismatches(record["needed"], base_image(root / "Dockerfile.cuda"))


def record(wheel: Path, path: Path = RECORD) -> dict[str, object]:
    """Write what ``wheel`` needs to ``path``; the record."""
    version = wheel.name.split("-")[1]
    written: dict[str, object] = {
        "package": "onnxruntime-gpu",
        "version": version,
        "wheel": wheel.name,
        "library": PROVIDER_LIBRARY,
        "needed": wheel_needs(wheel),
    }
    path.write_text(json.dumps(written, indent=2) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cuda_image", description=__doc__)
    parser.add_argument("--record", type=Path, metavar="WHEEL", help="rewrite the record")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record)
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    print("Dockerfile.cuda agrees with onnxruntime-gpu" if not problems else "disagreement")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
