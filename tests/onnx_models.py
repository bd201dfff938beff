"""Tiny ONNX models built with ``onnx.helper`` (no torch): the service tests' repository.

Each follows the repository contract exactly as export writes it: native ``Gelu`` layers,
``config.pbtxt`` and ``metadata_props``. Weights are seeded random numbers: the service tests
check what the service does with a model, not what the model learned.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from contract.metadata import ModelMetadata
from contract.model_config import ModelConfig, TensorConfig
from contract.names import (
    CLASSIFICATION,
    CONFIG_FILENAME,
    INPUT_NAME,
    LOGITS_OUTPUT,
    MODEL_FILENAME,
    OPSET,
    PLATFORM,
    PROBABILITIES_OUTPUT,
    RECONSTRUCTION,
    RECONSTRUCTION_OUTPUT,
)
from service.activations import IR_VERSION


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    """onnx's default IR is newer than onnxruntime-gpu 1.31 reads (a GPU run, 2026-11-28)."""
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )


FEATURES = 64
CLASSES = 10
# The rows of a model without a batch axis (``max_batch_size: 0``): its shapes are fixed.
FIXED_ROWS = 2


def _graph(
    sizes: list[int], approximate: str, head: str, seed: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[str]]:
    """Linear layers of ``sizes`` with Gelu between them, then ``head`` on the last one."""
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    value = INPUT_NAME
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [value, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        ]
        value = f"a{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Gelu", [value], [f"g{i}"], approximate=approximate))
            value = f"g{i}"
    if head == CLASSIFICATION:
        nodes += [
            helper.make_node("Identity", [value], [LOGITS_OUTPUT]),
            helper.make_node("Softmax", [value], [PROBABILITIES_OUTPUT], axis=1),
        ]
        return nodes, weights, [LOGITS_OUTPUT, PROBABILITIES_OUTPUT]
    nodes.append(helper.make_node("Sigmoid", [value], [RECONSTRUCTION_OUTPUT]))
    return nodes, weights, [RECONSTRUCTION_OUTPUT]


def write_model(
    repository: Path,
    name: str,
    version: int,
    task: str = CLASSIFICATION,
    approximate: str = "none",
    max_batch_size: int = 256,
    seed: int = 0,
    hidden: int = 32,
) -> Path:
    """One version of one model, with its config.pbtxt; returns the model.onnx path. A large
    ``hidden`` makes a classifier slow enough that cutting its requests short would show.
    With ``max_batch_size`` 0 the model has no batch axis: it takes ``FIXED_ROWS`` rows."""
    if task == CLASSIFICATION:
        sizes, out_dims = [FEATURES, hidden, hidden, CLASSES], (CLASSES,)
    else:
        sizes, out_dims = [FEATURES, 32, 8, 32, FEATURES], (FEATURES,)
    nodes, weights, outputs = _graph(sizes, approximate, task, seed + version)
    lead: list[str | int] = ["batch"] if max_batch_size else [FIXED_ROWS]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [*lead, FEATURES])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [*lead, out_dims[0]])
         for o in outputs],
        initializer=weights,
    )  # fmt: skip
    model = _model(graph, OPSET)
    model.ir_version = 10  # onnxruntime 1.31 reads IR versions up to 13; helper makes 14
    metadata = ModelMetadata(
        name=name,
        version=str(version),
        arch="mlp" if task == CLASSIFICATION else "autoencoder",
        activation="gelu" if approximate == "none" else "gelu_tanh",
        task=task,
        label_names=tuple(str(i) for i in range(CLASSES)) if task == CLASSIFICATION else (),
        input_normalisation={"divide_by": 16.0},
        metrics={"val_accuracy": 0.5} if task == CLASSIFICATION else {"val_mse": 0.05},
        dataset="digits",
    )
    for key, value in metadata.to_props().items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model, full_check=True)
    path = repository / name / str(version) / MODEL_FILENAME
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
    fixed = () if max_batch_size else (FIXED_ROWS,)
    config = ModelConfig(
        name=name,
        platform=PLATFORM,
        max_batch_size=max_batch_size,
        inputs=(TensorConfig(INPUT_NAME, "FP32", (*fixed, FEATURES)),),
        outputs=tuple(TensorConfig(o, "FP32", (*fixed, *out_dims)) for o in outputs),
        dynamic_batching=bool(max_batch_size),
        max_queue_delay_us=0,
    )
    (repository / name / CONFIG_FILENAME).write_text(config.to_pbtxt())
    return path


def build_repository(root: Path) -> Path:
    """The service tests' repository: a classifier with two versions, a tanh classifier and
    an autoencoder, named as the default models are."""
    write_model(root, "digits-mlp", 1)
    write_model(root, "digits-mlp", 2)
    write_model(root, "digits-mlp-tanh", 1, approximate="tanh")
    write_model(root, "digits-autoencoder", 1, task=RECONSTRUCTION)
    return root


# A model with a variable dim (``dims: [ -1 ]``) that batches: y = factor * x, of any row
# length (issue 62's batch-poisoning case).
VARIABLE_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""


def write_scaling(folder: Path, factor: float) -> None:
    """``folder/model.onnx``: y = factor * x, of any batch and row length."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "factor"], ["y"])],
        "scaling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
        initializer=[numpy_helper.from_array(np.array(factor, np.float32), "factor")],
    )
    model = _model(graph, OPSET)
    model.ir_version = 10  # what onnxruntime here reads
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / MODEL_FILENAME))


def write_variable(repository: Path, name: str, factor: float = 2.0) -> Path:
    """A batching model named ``name`` with a variable dim (``VARIABLE_CONFIG``)."""
    write_scaling(repository / name / "1", factor)
    (repository / name / CONFIG_FILENAME).write_text(VARIABLE_CONFIG.format(name=name))
    return repository / name


def write_foreign(repository: Path, name: str, shape: list, op: str) -> None:
    """An ONNX file not exported by this project, ``op`` of an input of ``shape``: no
    config.pbtxt, no metadata_props."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], name, [x], [y])
    model = _model(graph, 20)
    model.ir_version = 10
    (repository / name / "1").mkdir(parents=True)
    onnx.save(model, str(repository / name / "1" / MODEL_FILENAME))


def adding(weight: onnx.TensorProto) -> onnx.ModelProto:
    """y = x + w, ``weight`` the initializer w (and x of its shape)."""
    shape = list(weight.dims)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    add = helper.make_node("Add", ["x", weight.name], ["y"])
    graph = helper.make_graph([add], "adding", [x], [y], [weight])
    return _model(graph, 20)
