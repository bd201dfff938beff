"""bench.invariance: the sweep finds a row whose bits follow its batch, and none where a
model's rows are computed apart; the cost table compares batch_invariant's modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from bench.invariance import Setting, main, sweep_one, ulp_distance
from contract.model_config import ModelConfig, TensorConfig
from service.repository.layout import read_config
from tests.onnx_models import write_model


def test_ulp_distance_counts_float32_steps() -> None:
    one = np.float32(1)
    after = np.nextafter(one, np.float32(2))
    tiny = np.float32(1e-45)  # the smallest subnormal
    a = np.array([one, one, 0.0, -0.0, tiny, -one], np.float32)
    b = np.array([one, after, -0.0, 0.0, -tiny, -after], np.float32)
    assert ulp_distance(a, b).tolist() == [0, 1, 0, 0, 2, 1]


def _centred(features: int = 8) -> tuple[ModelConfig, bytes]:
    """y = x - mean(x over the batch): each row's answer follows its companions."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", features])
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["mean"], keepdims=1, axes=[0]),
        helper.make_node("Sub", ["input", "mean"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "centred", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 10
    config = ModelConfig("centred", "onnxruntime_onnx", 8, (TensorConfig("input", "FP32", (8,)),),
                         (TensorConfig("y", "FP32", (8,)),), True, 0)  # fmt: skip
    return config, model.SerializeToString()


def test_the_sweep_finds_rows_that_follow_their_batch(tmp_path: Path) -> None:
    config, model = _centred()
    found = sweep_one("centred", config, model, Setting(1), trials=1, seed=0)
    assert found.rows == sum(range(1, 9)) and found.differing > 0 and found.worst_ulp > 0
    write_model(tmp_path, "m", 1, max_batch_size=8)
    model = (tmp_path / "m/1/model.onnx").read_bytes()
    apart = sweep_one("m", read_config(tmp_path / "m"), model, Setting(1), trials=2, seed=0)
    assert apart.rows == 2 * sum(range(1, 9)) and apart.differing == 0


@pytest.mark.parametrize("command", ["sweep", "cost", "served"])
def test_the_commands_print_their_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    write_model(tmp_path, "m", 1, max_batch_size=4)
    extra = {
        "sweep": ["--threads", "1", "--trials", "1"],
        "cost": ["--model", "m", "--sizes", "1,3", "--runs", "2", "--repeats", "1"],
        "served": ["--model", "m", "--clients", "4", "--seconds", "0.2", "--repeats", "1"],
    }[command]
    main([command, "--repository", str(tmp_path), *extra])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    if command == "sweep":  # the service's options, two other levels, parallel mode
        assert len(rows) == 1 + 4 and all(r.endswith("| 10 | 0 | 0 |") for r in rows[1:])
    elif command == "cost":
        assert [r.split(" | ")[0] for r in rows[1:]] == ["| 1", "| 3"]
        assert all(float(r.split(" | ")[2]) > 0 for r in rows[1:])
    else:  # each mode answered requests, off the ratios' base
        assert [r.split(" | ")[0] for r in rows[1:]] == ["| off", "| rows", "| pad"]
        assert rows[1].endswith("| 1.00 |") and all(float(r.split(" | ")[1]) > 0 for r in rows[1:])
