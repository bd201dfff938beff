"""The paper's experiments: the summary's arithmetic, and a real run on a tiny budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.readme import block
from models import paper

ROOT = Path(__file__).resolve().parents[2]


def _run(activation: str, dropout: float, curve: list[float], test_loss: float) -> dict:
    job = {"experiment": "classifier", "activation": activation, "dropout": dropout, "lr": 1e-3}
    return {"job": job, "train_loss": curve, "eval": {"loss": test_loss, "accuracy": 0.5}}


def test_summary_takes_medians_per_epoch_and_orders_by_final_loss() -> None:
    study = {
        "runs": [
            _run("gelu", 0.0, [1.0, 0.30], 0.5),
            _run("gelu", 0.0, [3.0, 0.10], 0.7),
            _run("gelu", 0.0, [2.0, 0.20], 0.6),
            _run("relu", 0.0, [1.5, 0.25], 0.4),
            _run("relu", 0.5, [1.5, 0.90], 0.4),
            _run("gelu", 0.5, [1.5, 0.80], 0.9),
        ]
    }
    rows = {(r["activation"], r["dropout"]): r for r in paper.summarise(study)}
    gelu = rows["gelu", 0.0]
    assert gelu["median_curve"] == [2.0, 0.2] and gelu["seeds"] == 3
    assert gelu["final_train_loss"] == 0.2 and gelu["test_loss"] == 0.6
    order = paper.orderings(list(rows.values()))
    assert order["classifier, no dropout"]["by_train_loss"] == ["gelu", "relu"]
    assert order["classifier, no dropout"]["gelu_lowest_train_loss"] is True
    assert order["classifier, no dropout"]["gelu_lowest_test_loss"] is False
    assert order["classifier, dropout 0.5"]["by_train_loss"] == ["gelu", "relu"]


@pytest.mark.slow
def test_a_tiny_study_runs_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="training needs the [train] extra")
    out = tmp_path / "paper"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "paper", "--dataset", "digits", "--epochs", "2",
         "--seeds", "2", "--autoencoder-epochs", "1", "--lr-epochs", "1", "--workers", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    study = json.loads((out / "results.json").read_text())
    # Learning-rate trials: 3 activations x (2 classifier settings + 1 autoencoder) x 2 rates.
    assert len(study["trials"]) == 3 * 3 * 2
    # Runs: 3 activations x 2 settings x 2 seeds, and 3 autoencoders x 2 seeds (the default).
    assert len(study["runs"]) == 3 * 2 * 2 + 3 * 2
    assert all(
        len(r["train_loss"]) == 2 for r in study["runs"] if r["job"]["experiment"] == "classifier"
    )
    chosen = {(r["experiment"], r["activation"], r["dropout"]): r["lr"] for r in study["summary"]}
    assert set(chosen.values()) <= {1e-3, 1e-4} and len(chosen) == 9
    assert set(study["orderings"]) == {
        "classifier, no dropout", "classifier, dropout 0.5", "autoencoder"
    }  # fmt: skip
    table = (out / "README.md").read_text()
    assert table.count("| classifier, dropout 0.5 |") == 3 and "Does the paper's ordering" in table
    for figure in ("classifier.png", "autoencoder.png"):
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_quotes_the_committed_study() -> None:
    """The README's paper block is what docs/paper/results.json gives, byte for byte."""
    study = json.loads((ROOT / "docs" / "paper" / "results.json").read_text())
    readme = (ROOT / "docs" / "models.md").read_text()
    assert block(readme, paper.README_BLOCK) == paper.readme_block(study)
    table = (ROOT / "docs" / "paper" / "README.md").read_text()
    assert study["command"] in table and f"{study['wall_seconds'] / 60:.1f} minutes" in table
