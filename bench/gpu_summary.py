"""The tables of a run of ``bench/on-gpu.sh`` on a lent GPU machine, from its files.

    python -m bench.gpu_summary FOLDER [--sitting LABEL=1,2,3 ...]

``gpu.json`` is ``python -m bench.gpu --seconds 0.2``: one call of onnxruntime in process per
variant and batch size. ``served-N.txt`` is run N's ``served.txt``: the V1 predict of one row
through the app in process (``bench/asgi_path.py``), µs per request, each mode in its own
process, one after another. A sitting is runs of one tree (each ``--sitting`` names one; by
default every run is one sitting). A mode's figure is the median over the sitting's runs, with
the lowest and highest; its ratio to CUDA's plain run is taken within each run first (the runs
drift more than the modes differ).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# bench/on-gpu.sh's served modes, models and concurrencies, in its order.
MODES = ("cpu", "cuda", "cuda-binding", "cuda-2-instances", "cuda-graphs", "cuda-tf32")
MODELS = ("digits-mlp", "fashion-mlp-wide")
CONCURRENCIES = (1, 64)
BATCHES = (1, 64, 256)
Served = dict[tuple[str, str, int], float]


def served(run: int, folder: Path) -> Served:
    """Run ``run``'s µs per request by (model, mode, concurrency); a failed mode is left out."""
    rows = {}
    for line in (folder / f"served-{run}.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[4] == "us/request":
            rows[parts[0], parts[1], int(parts[2].removeprefix("c="))] = float(parts[3])
    return rows


def all_runs(folder: Path) -> tuple[int, ...]:
    """The runs whose ``served-N.txt`` the folder holds."""
    return tuple(sorted(int(p.stem.removeprefix("served-")) for p in folder.glob("served-*.txt")))


def _span(values: list[float], digits: int = 0) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def served_table(folder: Path, sittings: dict[str, tuple[int, ...]] | None = None) -> str:
    """µs per request, median (lowest-highest) of each sitting's runs, and the ratio to
    CUDA's plain run, taken within each run."""
    runs = all_runs(folder)
    sittings = sittings or {f"runs {runs[0]}-{runs[-1]}": runs}
    lines = ["| sitting | model | c | " + " | ".join(MODES) + " |",
             "|---|---|---|" + "---|" * len(MODES)]  # fmt: skip
    for sitting, numbers in sittings.items():
        measured = [served(run, folder) for run in numbers]
        for model in MODELS:
            for c in CONCURRENCIES:
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


def onnxruntime_table(folder: Path) -> str:
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


def _sitting(text: str) -> tuple[str, tuple[int, ...]]:
    label, _, runs = text.rpartition("=")
    if not label or not runs:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=1,2,3")
    return label, tuple(int(run) for run in runs.split(","))


def main(argv: list[str] | None = None) -> None:
    """Print both tables of the folder's run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_summary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", type=Path, help="a folder of bench/on-gpu.sh's files")
    parser.add_argument(
        "--sitting",
        type=_sitting,
        action="append",
        default=[],
        help="LABEL=RUN,RUN,...: runs of one tree, a row group of its own",
    )
    args = parser.parse_args(argv)
    print(onnxruntime_table(args.folder), served_table(args.folder, dict(args.sitting)), sep="\n\n")


if __name__ == "__main__":
    main()
