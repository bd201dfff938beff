"""``where.py``'s stage report of a ``profile`` taken in a checkout whose path holds "grpc"
(this one was /work/wt-grpcface): the profiled files' paths are made relative to the current
directory first, or STAGES' "grpc" (grpcio) claims the core's modules.

    python runs/grpc-face-2026-11-28/stages.py PROFILE REQUESTS   (from that checkout's root)
"""

from __future__ import annotations

import marshal
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.getcwd(), "runs/ceiling-2026-11-28"))
import where


def relative(key: tuple[str, int, str]) -> tuple[str, int, str]:
    return key[0].replace(os.getcwd() + "/", ""), key[1], key[2]


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as file:
        stats: dict[Any, Any] = marshal.load(file)
    fixed = {relative(key): (cc, nc, tt, ct, {relative(c): v for c, v in callers.items()})
             for key, (cc, nc, tt, ct, callers) in stats.items()}  # fmt: skip
    out = Path(tempfile.mkdtemp()) / "profile.data"
    with open(out, "wb") as file:
        marshal.dump(fixed, file)
    where.report_stages(out, int(sys.argv[2]))
