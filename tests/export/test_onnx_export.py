"""Export: native Gelu nodes, the validator, parity, metadata and the repository layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from torch import nn  # noqa: E402

from export.onnx_export import (  # noqa: E402
    PARITY_ATOL,
    ExportError,
    check_gelu_nodes,
    check_parity,
    export_checkpoint,
)
from models.activations import make_activation  # noqa: E402
from models.train import file_sha256, load_checkpoint  # noqa: E402


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


@pytest.mark.slow  # training (the validator's own tests are fast)
def test_default_repository_layout(trained_repository: Path) -> None:
    assert sorted(p.name for p in trained_repository.iterdir()) == [
        "digits-autoencoder", "digits-mlp", "digits-mlp-tanh"
    ]  # fmt: skip
    assert sorted(p.name for p in (trained_repository / "digits-mlp").iterdir()) == [
        "1", "2", "config.pbtxt"
    ]  # fmt: skip
    config = (trained_repository / "digits-mlp" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config
    assert "max_batch_size: 256" in config and "dims: [ 64 ]" in config


@pytest.mark.slow  # training
@pytest.mark.parametrize(
    ("model", "approximate", "count"),
    [("digits-mlp", "none", 2), ("digits-mlp-tanh", "tanh", 1), ("digits-autoencoder", "none", 2)],
)
def test_gelu_layers_become_native_gelu_nodes(
    trained_repository: Path, model: str, approximate: str, count: int
) -> None:
    graph = onnx.load(str(trained_repository / model / "1" / "model.onnx"))
    gelus = [n for n in graph.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == count
    for node in gelus:
        attrs = {a.name: a.s.decode() for a in node.attribute}
        assert attrs.get("approximate", "none") == approximate
    assert not {"Erf", "Tanh"} & {n.op_type for n in graph.graph.node}
    assert graph.opset_import[0].version >= 20


@pytest.mark.slow  # training
def test_cnn_exports_with_native_gelu(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    path = export_checkpoint(checkpoints["cnn"], tmp_path, "digits-cnn")
    assert ops(path).count("Gelu") == 2
    assert "dims: [ 1, 8, 8 ]" in (tmp_path / "digits-cnn" / "config.pbtxt").read_text()


def _legacy_export(module: nn.Module, path: Path, opset: int) -> Path:
    torch.onnx.export(module.eval(), (torch.rand(2, 4),), str(path), opset_version=opset,
                      dynamo=False)  # fmt: skip
    return path


@pytest.mark.parametrize(("activation", "op"), [("gelu", "Erf"), ("gelu_tanh", "Tanh")])
def test_validator_refuses_decomposed_gelu(tmp_path: Path, activation: str, op: str) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), make_activation(activation))
    path = _legacy_export(net, tmp_path / "old.onnx", opset=18)
    assert op in ops(path)  # opset 18 has no Gelu: the exporter decomposes it
    with pytest.raises(ExportError, match=f"{op} nodes: GELU was decomposed"):
        check_gelu_nodes(onnx.load(str(path)), expected=1)


def test_validator_counts_gelu_nodes(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), make_activation("gelu"))
    graph = onnx.load(str(_legacy_export(net, tmp_path / "m.onnx", opset=20)))
    check_gelu_nodes(graph, expected=1)
    with pytest.raises(ExportError, match="expected 2 native Gelu node"):
        check_gelu_nodes(graph, expected=2)


@pytest.mark.slow  # training
def test_parity_check_catches_a_wrong_graph(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    _, model, config = load_checkpoint(checkpoints["mlp"])
    path = export_checkpoint(checkpoints["mlp"], tmp_path, "m")
    assert check_parity(model, config, path) <= PARITY_ATOL
    with torch.no_grad():
        model.net[1].bias += 1e-3  # type: ignore[index, union-attr]  # the graph no longer matches the model
    with pytest.raises(ExportError, match="onnxruntime and PyTorch differ"):
        check_parity(model, config, path)


@pytest.mark.slow  # training
@pytest.mark.parametrize("batch", [1, 7, 256])
def test_onnxruntime_matches_pytorch(
    trained_repository: Path, checkpoints: dict[str, Path], batch: int
) -> None:
    _, model, _ = load_checkpoint(checkpoints["mlp"])
    session = ort.InferenceSession(str(trained_repository / "digits-mlp" / "1" / "model.onnx"))
    x = np.random.default_rng(batch).random((batch, 64), dtype=np.float32)
    logits, probs = session.run(["logits", "probabilities"], {"input": x})
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(logits - want)) <= 1e-5
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow  # training
def test_metadata(trained_repository: Path, checkpoints: dict[str, Path]) -> None:
    graph = onnx.load(str(trained_repository / "digits-mlp" / "2" / "model.onnx"))
    meta = {p.key: p.value for p in graph.metadata_props}
    assert meta["name"] == "digits-mlp" and meta["version"] == "2"
    assert meta["activation"] == "gelu" and meta["task"] == "classification"
    assert json.loads(meta["label_names"]) == [str(i) for i in range(10)]
    assert json.loads(meta["input_normalisation"]) == {"divide_by": 16.0}
    assert "val_accuracy" in json.loads(meta["metrics"])
    assert meta["checkpoint_sha256"] == file_sha256(checkpoints["mlp"])


@pytest.mark.slow  # training
def test_export_signs_what_it_writes(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    """--sign-key: the version carries a signature the service verifies, made before the
    version was moved into place."""
    pytest.importorskip("model_signing")  # the [signing] extra
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from service.repository.layout import read_version
    from service.signing import Verifier

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "owner.key", tmp_path / "owner.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    path = export_checkpoint(checkpoints["mlp"], tmp_path / "repo", "m", sign_key=private)
    assert (path.parent / "model.sig").is_file()
    read = read_version(path.parent.parent, 1, None, whole=True)
    assert sorted(read.files) == ["1/model.onnx", "config.pbtxt"]  # what the signature covers
    Verifier(public).check(read.files, read.signature, "m/1")  # passes
