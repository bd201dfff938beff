"""The names every part agrees on: files, tensors, tasks, architectures and activations."""

from __future__ import annotations

MODEL_FILENAME = "model.onnx"
CONFIG_FILENAME = "config.pbtxt"
PLATFORM = "onnxruntime_onnx"
ENSEMBLE_PLATFORM = "ensemble"  # Triton's: models run in turn, tensors mapped between them
OPSET = 20  # the first opset with a native Gelu op

INPUT_NAME = "input"
LOGITS_OUTPUT = "logits"
PROBABILITIES_OUTPUT = "probabilities"  # softmax of the logits
RECONSTRUCTION_OUTPUT = "reconstruction"
CLASSIFICATION = "classification"
RECONSTRUCTION = "reconstruction"
# Every architecture a network can have (models/networks.py builds each; the ONNX metadata and the
# service's model descriptions name it).
ARCHITECTURES = ("mlp", "autoencoder", "cnn")
OUTPUTS = {
    CLASSIFICATION: (LOGITS_OUTPUT, PROBABILITIES_OUTPUT),
    RECONSTRUCTION: (RECONSTRUCTION_OUTPUT,),
}

# Every activation a network can be trained with (models/activations.py builds each).
# gelu_stochastic is the paper's regulariser; in eval mode, and so in ONNX, it is exact GELU.
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_sigmoid", "gelu_stochastic", "silu", "relu", "elu")
# What the service's activation endpoint evaluates: every deterministic activation above
# (gelu_stochastic is exact GELU outside training) and phi, the Gaussian CDF.
EVALUATED_ACTIVATIONS = (*(a for a in ACTIVATIONS if a != "gelu_stochastic"), "phi")
