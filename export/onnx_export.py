"""Checkpoint -> ONNX with native ``Gelu`` ops -> validated model repository entry.

The ONNX contract (fixed names, documented in docs/models.md):

- input ``input``: float32 ``[batch, *input_shape]``;
- classifiers: outputs ``logits`` and ``probabilities`` (softmax), float32 ``[batch, classes]``;
- autoencoders: output ``reconstruction``, float32 ``[batch, *input_shape]``.

Validation fails the export loudly: ``onnx.checker``; exactly one ``Gelu`` node per GELU layer and
no decomposed Erf/Tanh pattern; onnxruntime and PyTorch agree within ``PARITY_ATOL`` at batch
sizes ``PARITY_BATCHES``.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from contract.metadata import ModelMetadata
from contract.model_config import ModelConfig, TensorConfig
from contract.names import CLASSIFICATION, INPUT_NAME, OPSET, OUTPUTS, PLATFORM
from contract.signing import sign
from export.arguments import DEFAULT_MAX_BATCH_SIZE, DEFAULT_QUEUE_DELAY_US
from export.repository import write_version
from models.activations import count_gelu_layers
from models.networks import NetworkConfig
from models.train import file_sha256, load_checkpoint

PARITY_ATOL = 1e-5
PARITY_BATCHES = (1, 7, 256)
# Ops that betray a GELU decomposed into elementary ops instead of one native Gelu node.
DECOMPOSED_GELU_OPS = frozenset({"Erf", "Tanh"})


class ExportError(ValueError):
    """The exported graph failed validation; nothing was written to the repository."""


class _Classifier(nn.Module):
    """Adds softmax probabilities beside the logits, so every client gets both."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return logits, torch.softmax(logits, dim=1)


def output_names(config: NetworkConfig) -> tuple[str, ...]:
    """The ONNX output names for a model of this config's task."""
    return OUTPUTS[config.task]


def model_config(
    name: str, config: NetworkConfig, max_batch_size: int, max_queue_delay_us: int
) -> ModelConfig:
    """Triton's config for the exported network: tensors without the batch dimension."""
    shape = (config.num_classes,) if config.task == CLASSIFICATION else config.input_shape
    return ModelConfig(
        name=name,
        platform=PLATFORM,
        max_batch_size=max_batch_size,
        inputs=(TensorConfig(INPUT_NAME, "FP32", config.input_shape),),
        outputs=tuple(TensorConfig(n, "FP32", shape) for n in output_names(config)),
        dynamic_batching=True,
        max_queue_delay_us=max_queue_delay_us,
    )


def _exportable(model: nn.Module, config: NetworkConfig) -> nn.Module:
    return _Classifier(model).eval() if config.task == CLASSIFICATION else model.eval()


def to_onnx(model: nn.Module, config: NetworkConfig, path: Path) -> None:
    """Export with the dynamo exporter at ``OPSET``: one self-contained file, dynamic batch."""
    example = torch.rand(2, *config.input_shape)  # batch 2: a batch of 1 gets specialised
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The exporter logs every step at INFO/WARNING; its failures still raise.
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        torch.onnx.export(
            _exportable(model, config),
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=list(output_names(config)),
            opset_version=OPSET,
            dynamic_shapes=({0: batch},),
            external_data=False,
            dynamo=True,
            verbose=False,
        )


def check_gelu_nodes(graph: onnx.ModelProto, expected: int) -> None:
    """Exactly ``expected`` native Gelu nodes and no decomposed GELU; else ``ExportError``."""
    ops = Counter(node.op_type for node in graph.graph.node)
    decomposed = sorted(DECOMPOSED_GELU_OPS & ops.keys())
    if decomposed:
        raise ExportError(
            f"graph holds {', '.join(decomposed)} nodes: GELU was decomposed instead of exported "
            f"as native Gelu (opset >= 20 is required)"
        )
    if ops["Gelu"] != expected:
        raise ExportError(f"expected {expected} native Gelu node(s), found {ops['Gelu']}")


def check_parity(model: nn.Module, config: NetworkConfig, path: Path) -> float:
    """Max |onnxruntime - PyTorch| over ``PARITY_BATCHES``; ``ExportError`` above the bound."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    exportable = _exportable(model, config)
    rng = np.random.default_rng(0)
    worst = 0.0
    for batch in PARITY_BATCHES:
        x = rng.random((batch, *config.input_shape), dtype=np.float32)
        with torch.no_grad():
            expected = exportable(torch.from_numpy(x))
        if isinstance(expected, torch.Tensor):
            expected = (expected,)
        got = session.run(list(output_names(config)), {INPUT_NAME: x})
        for name, want, have in zip(output_names(config), expected, got, strict=True):
            if have.shape != tuple(want.shape):
                raise ExportError(f"{name}: onnxruntime shape {have.shape} != {tuple(want.shape)}")
            diff = float(np.max(np.abs(have - want.numpy())))
            if not diff <= PARITY_ATOL:  # also catches NaN
                raise ExportError(
                    f"{name} at batch {batch}: onnxruntime and PyTorch differ by {diff:.3g} "
                    f"(> {PARITY_ATOL})"
                )
            worst = max(worst, diff)
    return worst


def validate(model: nn.Module, config: NetworkConfig, path: Path) -> float:
    """Run every check on the exported file; returns the worst parity difference."""
    graph = onnx.load(str(path))
    try:
        onnx.checker.check_model(graph, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker rejected the graph: {exc}") from None
    check_gelu_nodes(graph, count_gelu_layers(model))
    return check_parity(model, config, path)


def add_metadata(path: Path, metadata: dict[str, str]) -> None:
    """Store ``metadata`` in the ONNX file's ``metadata_props``."""
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def export_checkpoint(
    checkpoint: Path,
    repository: Path,
    name: str,
    version: int | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    sign_key: Path | None = None,
) -> Path:
    """Export ``checkpoint`` as ``repository/name/<version>/model.onnx``, signed with
    ``sign_key`` if given (before the version is moved into place); returns its path."""
    payload, model, config = load_checkpoint(checkpoint)
    config_text = model_config(name, config, max_batch_size, max_queue_delay_us).to_pbtxt()
    parity: list[float] = []

    def write_model(path: Path) -> None:
        to_onnx(model, config, path)
        metadata = ModelMetadata(
            name=name,
            version=path.parent.name,
            arch=config.arch,
            activation=config.activation,
            task=config.task,
            label_names=config.label_names,
            input_normalisation=config.normalisation,
            metrics=payload.get("metrics", {}),
            dataset=str(payload.get("dataset", "")),
            model_config=config.to_dict(),
            checkpoint_sha256=file_sha256(checkpoint),
            opset=str(OPSET),
            torch_version=torch.__version__,
        )
        add_metadata(path, metadata.to_props())
        parity.append(validate(model, config, path))
        if sign_key is not None:
            # The signature covers the model's config.pbtxt too, not yet in place here.
            sign(path.parent, sign_key, config_text.encode("utf-8"))

    onnx_path = write_version(repository, name, version, config_text, write_model)
    print(f"wrote {onnx_path}: validated, max |onnxruntime - torch| = {parity[0]:.2e}")
    return onnx_path


def run(args: argparse.Namespace) -> Path:
    """Export as ``args`` say."""
    return export_checkpoint(
        args.checkpoint,
        args.repository,
        args.name,
        args.version,
        args.max_batch_size,
        args.max_queue_delay_us,
        args.sign_key,
    )
