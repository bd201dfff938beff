"""PyTorch: the activations, the networks, the data, training and the paper's comparisons.

torch picks its vectorised kernels, its own (ATen's) and oneDNN's, by the CPU it finds: AVX2
or AVX-512 on x86-64. Their float rounding differs, so the same seed trains a different
network on each: on one AVX-512 machine the default models' validation accuracies were 0.9638
and 0.9610 with every kernel free, 0.9694 and 0.9638 with ATen's held to AVX2 alone, and the
table's 0.9638 and 0.9638 with both held to AVX2 (``tests/export/test_defaults.py`` builds
them afresh). So that a build gives the same networks on more x86-64 CPUs, training uses the
AVX2 kernels, unless ``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA`` say otherwise. MKL's
kernels still follow the CPU: an Intel Xeon host gave 0.9721 and 0.9749 so held (2026-11-26),
and the test allows for that.
Both are read at torch's first operation, so they are set here, on import of this package:
every module that runs torch is in it or imports it first.
"""

from __future__ import annotations

import os
import platform


def _cpu_flags() -> set[str]:
    """The CPU's feature flags, as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


if platform.machine() == "x86_64" and {"avx2", "fma"} <= _cpu_flags():
    # ATen runs the kernels it is told to without checking the CPU: hence the flags check.
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
