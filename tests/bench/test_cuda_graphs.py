"""bench.cuda_graphs: the accurate graphs on CUDA against the CPU's, and the judge of what
differed (the CUDA side runs where a GPU is, bench/on-gpu.sh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bench import cuda_graphs


def test_the_sample_takes_one_input_from_every_stride() -> None:
    x = cuda_graphs.sample(20)
    bits = x.view(np.uint32)
    assert x.dtype == np.float32 and x.size == 1 << 12
    np.testing.assert_array_equal(bits >> 20, np.arange(1 << 12))
    assert np.isnan(x).any() and np.isinf(x).sum() <= 2  # NaNs are many patterns, inf two


def test_the_judge_measures_both_sides_against_the_reference(tmp_path: Path) -> None:
    """CUDA's relu'(NaN) = 0 is wrong where the CPU's NaN is right; an elu' two float32 steps
    off is 2 ULP, the correctly rounded one 0.5 at most."""
    x = np.array([-1.5, -3.0], np.float32)
    rounded = np.exp(x.astype(np.float64)).astype(np.float32)
    off = np.nextafter(np.nextafter(rounded, np.float32(1)), np.float32(1))
    path = tmp_path / "found.npz"
    arrays: dict[str, Any] = {
        "relu'/x": np.array([np.nan], np.float32),
        "relu'/cuda": np.zeros(1, np.float32),
        "relu'/cpu": np.array([np.nan], np.float32),
        "elu'/x": x,
        "elu'/cuda": off,
        "elu'/cpu": rounded,
        "gelu/x": np.zeros(0, np.float32),
        "gelu/cuda": np.zeros(0, np.float32),
        "gelu/cpu": np.zeros(0, np.float32),
    }
    np.savez(path, **arrays)
    report = cuda_graphs.judge(path)
    assert report["gelu"] == {"differ": 0}
    assert report["relu'"]["cuda_above_one"] == 1 and report["relu'"]["cpu_above_one"] == 0
    elu = report["elu'"]
    assert elu["differ"] == 2 and elu["cuda_above_one"] == 2 and elu["cpu_above_one"] == 0
    assert 1.5 < float(elu["cuda_worst_ulp"]) <= 2.5 and float(elu["cpu_worst_ulp"]) <= 0.5
