"""The CPU against CUDA, in process: what one call of a model costs at each batch size, on
onnxruntime plain, with I/O binding, with CUDA graphs, and with TF32 on and off.

Each variant is its own session on the model file; a call takes a float32 batch from host
memory and returns the outputs to host memory, so every copy a served request pays is in
the time. The variants' outputs are compared with the CPU's (max |difference|). Where
onnxruntime has no CUDA provider the section says so and measures nothing (``make bench`` on
a CPU machine); ``--variants cpu,cpu-binding`` exercises the same code on a CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

Call = Callable[[np.ndarray], list[np.ndarray]]


@dataclass(frozen=True)
class Variant:
    """One way of running a model: providers, their options, and how tensors are bound."""

    name: str
    provider: str
    options: dict[str, str] = field(default_factory=dict)
    binding: bool = False  # I/O binding: the input copied into a bound device buffer
    graphs: bool = False  # CUDA graphs: fixed buffers, one captured graph per batch size

    @property
    def device(self) -> str:
        return "cuda" if self.provider == CUDA else "cpu"


VARIANTS = {
    "cpu": Variant("CPU", CPU),
    "cpu-binding": Variant("CPU + I/O binding", CPU, binding=True),
    "cuda": Variant("CUDA", CUDA, {"use_tf32": "0"}),
    "cuda-tf32": Variant("CUDA, TF32 on", CUDA, {"use_tf32": "1"}),
    "cuda-binding": Variant("CUDA + I/O binding", CUDA, {"use_tf32": "0"}, binding=True),
    "cuda-graphs": Variant(
        "CUDA + I/O binding + graphs",
        CUDA,
        {"use_tf32": "0", "enable_cuda_graph": "1"},
        binding=True,
        graphs=True,
    ),
}
GPU_VARIANTS = ("cpu", "cuda", "cuda-tf32", "cuda-binding", "cuda-graphs")


def _session(model_file: Path, variant: Variant) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 0  # every core: the CPU at its best, not as served
    options.log_severity_level = 3
    providers = [variant.provider] if variant.provider == CPU else [variant.provider, CPU]
    session = ort.InferenceSession(
        str(model_file),
        options,
        providers=providers,
        provider_options=[variant.options, {}][: len(providers)],
    )
    if session.get_providers()[0] != variant.provider:
        raise RuntimeError(f"{variant.provider} did not load for {model_file}")
    return session


def runner(model_file: Path, variant: Variant, batch: int) -> Call:
    """A call of the model on ``variant`` for batches of ``batch`` rows."""
    session = _session(model_file, variant)
    (source,) = session.get_inputs()
    names = [o.name for o in session.get_outputs()]
    if not variant.binding:
        return lambda x: session.run(names, {source.name: x})
    features = [d if isinstance(d, int) else batch for d in source.shape]
    bound = ort.OrtValue.ortvalue_from_shape_and_type(
        [batch, *features[1:]], np.float32, variant.device, 0
    )
    binding = session.io_binding()
    binding.bind_ortvalue_input(source.name, bound)
    outputs: list[ort.OrtValue] = []
    for output in session.get_outputs():
        if variant.graphs:  # a captured graph replays on the same addresses
            shape = [batch, *(d if isinstance(d, int) else batch for d in output.shape[1:])]
            value = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
            outputs.append(value)
            binding.bind_ortvalue_output(output.name, value)
        else:
            binding.bind_output(output.name, variant.device)
    run_options = ort.RunOptions()
    if variant.graphs:
        run_options.add_run_config_entry("gpu_graph_id", str(batch))

    def call(x: np.ndarray) -> list[np.ndarray]:
        bound.update_inplace(x)
        session.run_with_iobinding(binding, run_options)
        if outputs:
            return [value.numpy() for value in outputs]
        return list(binding.copy_outputs_to_cpu())

    return call


def median_us(call: Call, x: np.ndarray, seconds: float) -> float:
    """The median time of one call, after warm-up (and a graph's capture), in µs."""
    for _ in range(3):
        call(x)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        call(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure_model(
    model_file: Path, variants: list[Variant], seconds: float, batches: tuple[int, ...] = BATCHES
) -> dict[str, Any]:
    """Every variant at every batch size: µs per call, rows/s, and max |difference| from the
    first variant's outputs at the largest batch."""
    features = [d for d in _session(model_file, variants[0]).get_inputs()[0].shape[1:]]
    x_all = np.random.default_rng(0).random((max(batches), *features), dtype=np.float32)
    rows: list[dict[str, Any]] = []
    reference: list[np.ndarray] = []
    for variant in variants:
        for batch in batches:
            x = np.ascontiguousarray(x_all[:batch])
            call = runner(model_file, variant, batch)
            us = median_us(call, x, seconds)
            row = {"variant": variant.name, "batch": batch, "us": us}
            row["rows_per_s"] = batch / us * 1e6
            if batch == max(batches):
                answers = call(x)
                reference = reference or answers
                row["max_abs_diff"] = max(
                    float(np.max(np.abs(a - r))) for a, r in zip(answers, reference, strict=True)
                )
            rows.append(row)
    return {"model": model_file.parent.parent.name, "rows": rows, "crossover": crossover(rows)}


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """The smallest batch at which some CUDA variant answers more rows/s than the CPU."""
    cpu = {r["batch"]: r["rows_per_s"] for r in rows if r["variant"] == VARIANTS["cpu"].name}
    for batch in sorted(cpu):
        best = max(
            (r["rows_per_s"] for r in rows if r["batch"] == batch and "CUDA" in r["variant"]),
            default=0.0,
        )
        if best > cpu[batch]:
            return batch
    return None


def measure(
    repository: Path, models: list[str], seconds: float, names: tuple[str, ...] = GPU_VARIANTS
) -> dict[str, Any]:
    """The GPU section of a run: measured where onnxruntime offers CUDA, else why not."""
    variants = [VARIANTS[n] for n in names]
    if any(v.provider == CUDA for v in variants) and CUDA not in ort.get_available_providers():
        return {"skipped": f"onnxruntime {ort.__version__} here offers no {CUDA}"}
    return {
        "onnxruntime": ort.__version__,
        "models": [
            measure_model(repository / m / "1" / "model.onnx", variants, seconds) for m in models
        ],
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.gpu``: needs only onnxruntime and numpy, so it runs on a lent GPU
    machine without the serving stack."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--models", default="digits-mlp,fashion-mlp-wide")
    parser.add_argument("--variants", default=",".join(GPU_VARIANTS), help=", ".join(VARIANTS))
    parser.add_argument("--seconds", type=float, default=0.3, help="per variant and batch")
    parser.add_argument("--out", type=Path, help="a JSON file (default: standard output)")
    args = parser.parse_args(argv)
    section = measure(
        args.repository, args.models.split(","), args.seconds, tuple(args.variants.split(","))
    )
    text = json.dumps(section, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
