"""models.train: deterministic training, the checkpoint round trip, the threads it takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.networks import ConfigError  # noqa: E402
from models.train import CheckpointError, load_checkpoint  # noqa: E402
from tests.training import train_quick  # noqa: E402


def test_training_is_deterministic(tmp_path: Path) -> None:
    a = train_quick(tmp_path / "a.pt", "--hidden", "16", "--seed", "3")
    b = train_quick(tmp_path / "b.pt", "--hidden", "16", "--seed", "3")
    state_a, state_b = (load_checkpoint(p)[1].state_dict() for p in (a, b))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_checkpoint_round_trip(checkpoints: dict[str, Path]) -> None:
    payload, model, config = load_checkpoint(checkpoints["mlp"])
    assert config.arch == "mlp" and config.activation == "gelu"
    assert config.label_names == tuple(str(i) for i in range(10))
    assert config.normalisation == {"divide_by": 16.0}
    assert len(payload["history"]) == 2 and "val_accuracy" in payload["metrics"]
    assert not model.training
    again = load_checkpoint(checkpoints["mlp"])[1]
    x = torch.rand(5, 64)
    assert torch.equal(model(x), again(x))


def test_corrupt_and_foreign_checkpoints_are_refused(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(checkpoints["mlp"].read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(corrupt)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="not a gelu-serve checkpoint"):
        load_checkpoint(foreign)


def test_mismatched_checkpoint_is_refused(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    payload = torch.load(checkpoints["mlp"], weights_only=True)
    payload["model_config"]["hidden"] = [16, 16]
    mismatched = tmp_path / "mismatched.pt"
    torch.save(payload, mismatched)
    with pytest.raises(CheckpointError, match="weights do not match its model config"):
        load_checkpoint(mismatched)
    payload["model_config"]["arch"] = "rnn"
    torch.save(payload, mismatched)
    with pytest.raises(ConfigError, match="unknown architecture 'rnn'"):
        load_checkpoint(mismatched)


def test_threads_follow_the_work_per_step() -> None:
    from models.train import SINGLE_THREAD_WORK, pick_threads

    cores = len(os.sched_getaffinity(0))
    assert pick_threads(3, 10, 10) == 3  # asked for
    assert pick_threads(0, 125_194, 32) == 1  # the default digits MLP
    assert pick_threads(0, SINGLE_THREAD_WORK, 1) == cores  # the 784-3x2048-10 class


def test_training_a_small_network_uses_one_thread(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    train_quick(tmp_path / "m.pt", "--arch", "mlp", "--hidden", "16")
    assert torch.get_num_threads() == 1
