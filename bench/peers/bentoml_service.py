"""BentoML's way to serve an ONNX file: a service class with an adaptive-batching API.

Run by ``bentoml serve bentoml_service:DigitsModel`` in BentoML's own environment, with the
model file in ``GELU_PEER_MODEL``; never imported by gelu-serve.
"""

from __future__ import annotations

import os

import bentoml
import numpy as np
import onnxruntime as ort

MAX_BATCH_SIZE = int(os.environ.get("GELU_PEER_MAX_BATCH", "256"))


@bentoml.service(workers=1, logging={"access": {"enabled": False}})  # as the others: no access log
class DigitsModel:
    """One onnxruntime session (one intra-op thread, as gelu-serve's)."""

    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            os.environ["GELU_PEER_MODEL"], options, providers=["CPUExecutionProvider"]
        )

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH_SIZE, max_latency_ms=1000)
    def predict(self, instances: np.ndarray) -> np.ndarray:
        """Probabilities for a batch of instances."""
        (probabilities,) = self.session.run(["probabilities"], {"input": instances.astype("f4")})
        return probabilities
