"""bench.gpu: the GPU section's runners and its crossover."""

from __future__ import annotations

from pathlib import Path

from bench import gpu


def test_the_gpu_section_runs_its_binding_path_on_a_cpu(model_repository: Path) -> None:
    """bench.gpu's I/O-binding runner answers as a plain session does (exercised here on the
    CPU; on CUDA the same code binds device buffers), and without CUDA the section says why."""
    section = gpu.measure(model_repository, ["digits-mlp"], 0.001, ("cpu", "cpu-binding"))
    (model,) = section["models"]
    assert {r["variant"] for r in model["rows"]} == {"CPU", "CPU + I/O binding"}
    largest = [r for r in model["rows"] if r["batch"] == max(gpu.BATCHES)]
    assert [r["max_abs_diff"] for r in largest] == [0.0, 0.0]
    assert model["crossover"] is None  # no CUDA variant to pass the CPU
    if "CUDAExecutionProvider" not in gpu.ort.get_available_providers():
        assert "offers no CUDAExecutionProvider" in gpu.measure(model_repository, [], 0)["skipped"]


def test_the_crossover_is_the_first_batch_cuda_answers_more_rows() -> None:
    cpu, cuda = [(1, 10), (8, 50), (64, 90)], [(1, 2), (8, 60), (64, 9)]
    rows = [{"variant": "CPU", "batch": b, "rows_per_s": r} for b, r in cpu]
    rows += [{"variant": "CUDA", "batch": b, "rows_per_s": r} for b, r in cuda]
    assert gpu.crossover(rows) == 8
    assert gpu.crossover(rows[:3]) is None
