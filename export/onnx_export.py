"""Checkpoint -> ONNX with native ``Gelu`` ops -> validated model repository entry.

The ONNX contract (fixed names, documented in the README):

- input ``input``: float32 ``[batch, *input_shape]``;
- classifiers: outputs ``logits`` and ``probabilities`` (softmax), float32 ``[batch, classes]``;
- autoencoders: output ``reconstruction``, float32 ``[batch, *input_shape]``.

Validation fails the export loudly: ``onnx.checker``; exactly one ``Gelu`` node per GELU layer and
no decomposed Erf/Tanh pattern; onnxruntime and PyTorch agree within ``PARITY_ATOL`` at batch
sizes ``PARITY_BATCHES``.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from export.arguments import DEFAULT_MAX_BATCH_SIZE, DEFAULT_QUEUE_DELAY_US
from export.repository import TensorSpec, config_pbtxt, write_version
from models.activations import count_gelu_layers
from models.networks import ModelConfig
from models.train import file_sha256, load_checkpoint

OPSET = 20
INPUT_NAME = "input"
CLASSIFIER_OUTPUTS = ("logits", "probabilities")
AUTOENCODER_OUTPUTS = ("reconstruction",)
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


def output_names(config: ModelConfig) -> tuple[str, ...]:
    """The ONNX output names for a model of this config's task."""
    return CLASSIFIER_OUTPUTS if config.task == "classification" else AUTOENCODER_OUTPUTS


def tensor_specs(config: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs without the batch dimension, for ``config.pbtxt``."""
    inputs = [TensorSpec(INPUT_NAME, config.input_shape)]
    if config.task == "classification":
        outputs = [TensorSpec(n, (config.num_classes,)) for n in CLASSIFIER_OUTPUTS]
    else:
        outputs = [TensorSpec(n, config.input_shape) for n in AUTOENCODER_OUTPUTS]
    return inputs, outputs


def _exportable(model: nn.Module, config: ModelConfig) -> nn.Module:
    return _Classifier(model).eval() if config.task == "classification" else model.eval()


def to_onnx(model: nn.Module, config: ModelConfig, path: Path) -> None:
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


def check_parity(model: nn.Module, config: ModelConfig, path: Path) -> float:
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


def validate(model: nn.Module, config: ModelConfig, path: Path) -> float:
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
) -> Path:
    """Export ``checkpoint`` as ``repository/name/<version>/model.onnx``; returns its path."""
    payload, model, config = load_checkpoint(checkpoint)
    inputs, outputs = tensor_specs(config)
    config_text = config_pbtxt(name, inputs, outputs, max_batch_size, max_queue_delay_us)
    parity: list[float] = []

    def write_model(path: Path) -> None:
        to_onnx(model, config, path)
        add_metadata(
            path,
            {
                "name": name,
                "version": path.parent.name,
                "arch": config.arch,
                "activation": config.activation,
                "task": config.task,
                "model_config": json.dumps(config.to_dict()),
                "label_names": json.dumps(list(config.label_names)),
                "input_normalisation": json.dumps(config.normalisation),
                "metrics": json.dumps(payload.get("metrics", {})),
                "dataset": str(payload.get("dataset", "")),
                "checkpoint_sha256": file_sha256(checkpoint),
                "opset": str(OPSET),
                "torch_version": torch.__version__,
            },
        )
        parity.append(validate(model, config, path))

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
    )
