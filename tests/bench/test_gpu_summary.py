"""bench.gpu_summary: the tables of bench/on-gpu.sh's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_summary


def _served(folder: Path, run: int, cuda: float, graphs: float | None) -> None:
    lines = ["digits-mlp cpu c=1 100.00 us/request", f"digits-mlp cuda c=1 {cuda:.2f} us/request"]
    if graphs is not None:
        lines.append(f"digits-mlp cuda-graphs c=1 {graphs:.2f} us/request")
    else:  # a mode that failed prints its error, not a figure
        lines.append("digits-mlp cuda-graphs c=1 Traceback (most recent call last):")
    (folder / f"served-{run}.txt").write_text("\n".join(lines) + "\n")


def test_a_run_is_read_by_model_mode_and_concurrency(tmp_path: Path) -> None:
    _served(tmp_path, 1, 400.0, None)
    assert gpu_summary.served(1, tmp_path) == {
        ("digits-mlp", "cpu", 1): 100.0,
        ("digits-mlp", "cuda", 1): 400.0,
    }


def test_ratios_are_taken_within_each_run(tmp_path: Path) -> None:
    # CUDA drifts from run to run; graphs stay at half of it in each run.
    _served(tmp_path, 1, 400.0, 200.0)
    _served(tmp_path, 2, 200.0, 100.0)
    _served(tmp_path, 3, 300.0, None)
    table = gpu_summary.served_table(tmp_path, {"both": (1, 2), "third": (3,)})
    row = next(line for line in table.splitlines() if line.startswith("| both | digits-mlp | 1 |"))
    cells = [cell.strip() for cell in row.split("|")[4:-1]]
    assert dict(zip(gpu_summary.MODES, cells, strict=True)) == {
        "cpu": "100 (100-100); x0.38 (0.25-0.50)",
        "cuda": "300 (200-400)",
        "cuda-binding": "-",
        "cuda-2-instances": "-",
        "cuda-graphs": "150 (100-200); x0.50 (0.50-0.50)",
        "cuda-tf32": "-",
    }
    third = next(line for line in table.splitlines() if line.startswith("| third | digits-mlp | 1"))
    assert "| 100; x0.33 | 300 | - | - | - | - |" in third
    # unnamed, every run is one sitting
    assert "| runs 1-3 | digits-mlp | 1 |" in gpu_summary.served_table(tmp_path)


def test_the_onnxruntime_table_and_where_cuda_first_wins(tmp_path: Path) -> None:
    rows = [{"variant": variant, "batch": batch, "us": us * batch, "max_abs_diff": diff}
            for variant, us, diff in (("CPU", 2.0, 0.0), ("CUDA", 1.0, 3e-6))
            for batch in (1, 64, 256)]  # fmt: skip
    (tmp_path / "gpu.json").write_text(
        json.dumps({"models": [{"model": "m", "rows": rows, "crossover": 1}]})
    )
    assert gpu_summary.onnxruntime_table(tmp_path).splitlines()[2:] == [
        "| m | CPU | 2 | 128 | 512 | 0.0e+00 |",
        "| m | CUDA | 1 | 64 | 256 | 3.0e-06 |",
        "",
        "Smallest batch at which a CUDA variant beats the CPU: m 1.",
    ]


def test_the_command_names_its_sittings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _served(tmp_path, 1, 400.0, 200.0)
    _served(tmp_path, 2, 200.0, 100.0)
    (tmp_path / "gpu.json").write_text(json.dumps({"models": []}))
    gpu_summary.main([str(tmp_path), "--sitting", "at abc1234 (runs 1-2)=1,2"])
    assert "| at abc1234 (runs 1-2) | digits-mlp | 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_summary.main([str(tmp_path), "--sitting", "1,2"])
    assert "expected LABEL=1,2,3" in capsys.readouterr().err
