"""MLServer's way to serve an ONNX file: a custom runtime (MLServer ships none for ONNX).

Loaded by MLServer from ``model-settings.json`` (``implementation``), in MLServer's own
environment; never imported by gelu-serve.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    """One onnxruntime session (one intra-op thread, as gelu-serve's); V2 in, probabilities out."""

    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        uri = self.settings.parameters.uri
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        (probabilities,) = self._session.run(["probabilities"], {"input": x})
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("probabilities", probabilities)],
        )
