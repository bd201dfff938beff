"""The tables of this folder's README, from its runs on one NVIDIA H200.

    python docs/runs/gpu-2026-11-28/summary.py      # from the repository root

``gpu.json`` is ``python -m bench.gpu --seconds 0.2``: one call of onnxruntime in process per
variant and batch size. ``served-N.txt`` are ``bench/on-gpu.sh``'s served rows: the V1
predict of one row through the app in process (``bench/asgi_path.py``), µs per request, each
mode in its own process, one after another. Runs 1-3 ran the tree at 5886f9a, runs 4-5 the
tree at 43b2b15 (I/O binding off by default, graphs with two instances). A mode's figure is
the median over the runs of its sitting, with the lowest and highest; its ratio to CUDA's plain
run is taken within each run first (the runs drift more than the modes differ).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITTINGS = {
    "5886f9a (runs 1-3)": (1, 2, 3),
    "43b2b15 (runs 4-5)": (4, 5),
}
MODES = {  # what each mode ran at each sitting
    "cpu": "the CPU, one intra-op thread",
    "cuda": "CUDA, onnxruntime's plain run",
    "cuda-binding": "CUDA, I/O binding",
    "cuda-2-instances": "CUDA, two instances (runs 4-5 only)",
    "cuda-graphs": "CUDA graphs (runs 1-3 one instance, 4-5 two)",
    "cuda-tf32": "CUDA, TF32 on (runs 1-3 bound, 4-5 plain)",
}
BATCHES = (1, 64, 256)


def served(run: int, folder: Path = HERE) -> dict[tuple[str, str, int], float]:
    """One run's µs per request by (model, mode, concurrency); a failed mode is left out."""
    rows = {}
    for line in (folder / f"served-{run}.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[4] == "us/request":
            rows[parts[0], parts[1], int(parts[2].removeprefix("c="))] = float(parts[3])
    return rows


def _span(values: list[float], digits: int = 0) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def served_table(folder: Path = HERE) -> str:
    """µs per request, median (lowest-highest) of each sitting's runs, and the ratio to
    CUDA's plain run, taken within each run."""
    lines = ["| sitting | model | c | " + " | ".join(MODES) + " |",
             "|---|---|---|" + "---|" * len(MODES)]  # fmt: skip
    for sitting, runs in SITTINGS.items():
        measured = [served(run, folder) for run in runs]
        for model in ("digits-mlp", "fashion-mlp-wide"):
            for c in (1, 64):
                cells = []
                for mode in MODES:
                    got = [m[model, mode, c] for m in measured if (model, mode, c) in m]
                    ratios = [
                        m[model, mode, c] / m[model, "cuda", c]
                        for m in measured
                        if (model, mode, c) in m and (model, "cuda", c) in m
                    ]
                    if not got:
                        cells.append("-")
                    elif mode == "cuda":
                        cells.append(_span(got))
                    else:
                        cells.append(f"{_span(got)}; x{_span(ratios, 2)}")
                lines.append(f"| {sitting} | {model} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def onnxruntime_table(folder: Path = HERE) -> str:
    """bench.gpu: µs per call at three batch sizes, the largest difference from the CPU's
    outputs (batch 1024), and where CUDA first beats the CPU."""
    section = json.loads((folder / "gpu.json").read_text())
    lines = ["| model | variant | " + " | ".join(f"batch {b}, µs" for b in BATCHES)
             + " | max abs diff from CPU |",
             "|---|---|" + "---|" * (len(BATCHES) + 1)]  # fmt: skip
    for model in section["models"]:
        variants = dict.fromkeys(r["variant"] for r in model["rows"])
        for variant in variants:
            rows = {r["batch"]: r for r in model["rows"] if r["variant"] == variant}
            diff = max(r.get("max_abs_diff", 0.0) for r in rows.values())
            cells = [f"{rows[b]['us']:.0f}" for b in BATCHES]
            lines.append(
                f"| {model['model']} | {variant} | " + " | ".join(cells) + f" | {diff:.1e} |"
            )
    crossovers = ", ".join(f"{m['model']} {m['crossover']}" for m in section["models"])
    return (
        "\n".join(lines)
        + f"\n\nSmallest batch at which a CUDA variant beats the CPU: {crossovers}."
    )


if __name__ == "__main__":
    print(onnxruntime_table(), served_table(), sep="\n\n")
