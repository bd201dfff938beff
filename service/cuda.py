"""Why a GPU execution provider did not load, in one line that names the missing library.

onnxruntime falls back to the CPU when its CUDA (or TensorRT) provider library cannot load,
and says why only on stderr, if at all. ``provider_unloadable`` reads that library's needed
shared libraries (its ELF ``DT_NEEDED`` entries) and names those the dynamic loader would not
find: the usual cause is a CUDA major that is not the one onnxruntime-gpu was built for.
``needed_libraries`` also serves the image check (``deploy.cuda_image``).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

# The provider library each GPU provider needs beside onnxruntime's own.
PROVIDER_LIBRARIES = {
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
}
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_RPATH, _DT_RUNPATH = 1, 5, 10, 15, 29


def dynamic_entries(file: BinaryIO) -> tuple[list[str], list[str]]:
    """The needed libraries and the run path entries of a 64-bit little-endian ELF shared
    library read from ``file`` (seekable: a zip member is, so a wheel need not be unpacked).
    ``ValueError`` if it is not one."""
    header = file.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4:6] != b"\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", header, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
    file.seek(phoff)
    table = file.read(phentsize * phnum)
    loads, dynamic = [], None
    for index in range(phnum):
        kind, _, offset, vaddr, _, size = struct.unpack_from("<IIQQQQ", table, index * phentsize)
        if kind == _PT_LOAD:
            loads.append((vaddr, offset, size))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, size)
    if dynamic is None:
        return [], []
    file.seek(dynamic[0])
    tags: dict[int, list[int]] = {}
    for tag, value in struct.iter_unpack("<qQ", file.read(dynamic[1] - dynamic[1] % 16)):
        if tag == 0:
            break
        tags.setdefault(tag, []).append(value)
    strtab, size = tags[_DT_STRTAB][0], tags[_DT_STRSZ][0]
    file.seek(next(o + strtab - v for v, o, n in loads if v <= strtab < v + n))
    strings = file.read(size)

    def string(at: int) -> str:
        return strings[at : strings.index(b"\0", at)].decode()

    paths = [string(at) for at in tags.get(_DT_RUNPATH, tags.get(_DT_RPATH, []))]
    return [string(at) for at in tags.get(_DT_NEEDED, [])], [
        entry for path in paths for entry in path.split(":") if entry
    ]


def needed_libraries(file: BinaryIO) -> list[str]:
    """The ``DT_NEEDED`` entries of the ELF shared library in ``file``, in order."""
    return dynamic_entries(file)[0]


def _loader_cache() -> set[str]:
    """The library names in the dynamic loader's cache (``ldconfig -p``)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listing = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}


def _search_dirs(origin: Path, runpath: Iterable[str]) -> list[Path]:
    """Where the loader looks, plus the CUDA wheels' folders onnxruntime-gpu preloads from
    (``nvidia-*`` packages on ``sys.path``)."""
    dirs = [Path(e.replace("$ORIGIN", str(origin))) for e in runpath]
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [Path(p) for p in ("/lib", "/usr/lib", "/lib64", "/usr/lib64")]
    dirs += [Path(p) for p in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")]
    for entry in sys.path:
        dirs += sorted(Path(entry).glob("nvidia/*/lib")) if entry else []
    return dirs


def unresolved(needed: Iterable[str], dirs: Iterable[Path], cache: set[str]) -> list[str]:
    """Those of ``needed`` found neither in ``dirs`` nor in the loader's ``cache``."""
    folders = [d for d in dirs if d.is_dir()]
    return [n for n in needed if n not in cache and not any((d / n).exists() for d in folders)]


def provider_unloadable(provider: str, capi: Path) -> str | None:
    """Why ``provider`` cannot load from onnxruntime's ``capi`` folder, naming what is
    missing; None where its libraries are all found (the cause is then the driver or the
    device, which onnxruntime's own log names)."""
    library_name = PROVIDER_LIBRARIES.get(provider)
    if library_name is None:
        return None
    library = capi / library_name
    if not library.exists():
        return (
            f"this onnxruntime has no {library_name}: it is a build without {provider} "
            "(install onnxruntime-gpu, the project's [gpu] extra, in place of onnxruntime)"
        )
    with library.open("rb") as file:
        needed, runpath = dynamic_entries(file)
    missing = unresolved(needed, _search_dirs(capi, runpath), _loader_cache())
    if not missing:
        return None
    return (
        f"{library_name} needs {', '.join(missing)}, which the dynamic loader cannot find "
        "(LD_LIBRARY_PATH, its cache, the nvidia-* wheels): a CUDA or cuDNN major other than "
        "the one this onnxruntime-gpu was built for, or none installed"
    )
