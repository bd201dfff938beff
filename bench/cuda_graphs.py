"""The accurate kernel's float64 graphs on CUDA, against the same graphs on the CPU.

With CUDA in use the activation endpoint's accurate kernel runs as float64 graphs on CUDA
(docs/serving.md). The CPU's graphs were swept on all 2^32 inputs (docs/accuracy-exhaustive.md),
so where CUDA's bits equal the CPU's the sweep's bound holds on CUDA too. On a GPU machine
(bench/on-gpu.sh)::

    python -m bench.cuda_graphs --out cuda-graphs.npz     # 2^26 inputs a function, both ways

writes every input whose bits differ, with both answers; here, where scipy and mpmath are,
``python -m bench.cuda_graphs --judge cuda-graphs.npz`` measures CUDA's error at those inputs
against the correctly rounded reference (bench/exhaustive.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.activations import ACCURATE, FUNCTIONS, ActivationEvaluator

F32 = np.float32


def sample(stride_bits: int, seed: int = 0) -> np.ndarray:
    """One float32 from every ``2^stride_bits`` consecutive bit patterns, at a random place
    in each: NaNs, infinities, zeros and subnormals among them."""
    count = 1 << (32 - stride_bits)
    rng = np.random.default_rng(seed)
    starts = np.arange(count, dtype=np.uint64) << np.uint64(stride_bits)
    offsets = rng.integers(0, 1 << stride_bits, count, dtype=np.uint64)
    return (starts + offsets).astype(np.uint32).view(F32)


def evaluators() -> dict[str, ActivationEvaluator]:
    """The graphs on CUDA (strict: no silent fallback) and on every CPU core."""
    import onnxruntime as ort

    from service.onnxrt import SessionFactory

    options = ort.SessionOptions()
    options.intra_op_num_threads = 0
    on = {
        "cuda": (["CUDAExecutionProvider", "CPUExecutionProvider"], True),
        "cpu": (["CPUExecutionProvider"], False),
    }
    return {
        where: ActivationEvaluator(SessionFactory(providers, options, strict=strict), False)
        for where, (providers, strict) in on.items()
    }


def compare(stride_bits: int, out: Path) -> dict[str, object]:
    """Every accurate function on ``sample(stride_bits)``, CUDA against the CPU; the inputs
    whose bits differ and both answers go to ``out`` (npz), a summary is returned."""
    x = sample(stride_bits)
    engines = evaluators()
    summary: dict[str, object] = {
        "inputs_per_function": int(x.size),
        "providers": {w: e.providers for w, e in engines.items()},
        "functions": {},
    }
    arrays: dict[str, Any] = {}  # numpy's stubs type savez's keywords as its own options
    for name, derivative, kernel in FUNCTIONS:
        if kernel != ACCURATE:
            continue
        label = name + ("'" if derivative else "")
        started = time.monotonic()
        cuda = engines["cuda"].evaluate(name, x, derivative)
        took = time.monotonic() - started
        cpu = engines["cpu"].evaluate(name, x, derivative)
        differ = (cuda.view(np.uint32) != cpu.view(np.uint32)) & ~(np.isnan(cuda) & np.isnan(cpu))
        arrays[f"{label}/x"] = x[differ]
        arrays[f"{label}/cuda"] = cuda[differ]
        arrays[f"{label}/cpu"] = cpu[differ]
        summary["functions"][label] = {  # type: ignore[index]
            "differ": int(differ.sum()),
            "cuda_seconds": round(took, 3),
        }
    np.savez_compressed(out, **arrays)
    return summary


def judge(path: Path) -> dict[str, dict[str, Any]]:
    """CUDA's and the CPU's error in ULPs at each input where their bits differ."""
    from bench.exhaustive import reference, ulp_errors

    found = np.load(path)
    labels = sorted({k.split("/")[0] for k in found.files})
    report: dict[str, dict[str, Any]] = {}
    for label in labels:
        x = found[f"{label}/x"]
        row: dict[str, Any] = {"differ": int(x.size)}
        if x.size:
            function = (label.rstrip("'"), label.endswith("'"))
            rounded, value, _ = reference(function, x)
            for where in ("cuda", "cpu"):
                errors = ulp_errors(found[f"{label}/{where}"], rounded, value)
                worst = int(np.argmax(errors))
                row[f"{where}_worst_ulp"] = round(float(errors[worst]), 3)
                row[f"{where}_worst_x"] = float(x[worst])
                row[f"{where}_above_one"] = int((errors > 1.0).sum())
        report[label] = row
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("cuda-graphs.npz"))
    parser.add_argument("--stride-bits", type=int, default=6, help="2^(32-N) inputs a function")
    parser.add_argument("--judge", type=Path, help="judge a file --out wrote; run nothing")
    args = parser.parse_args(argv)
    if args.judge:
        print(json.dumps(judge(args.judge), indent=1))
    else:
        print(json.dumps(compare(args.stride_bits, args.out), indent=1))


if __name__ == "__main__":
    main()
