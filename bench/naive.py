"""The naive app: what most users write first, and what a serving framework must beat.

FastAPI with a pydantic request model, a sync endpoint (run in FastAPI's thread pool) calling
``session.run`` once per request, and a dict answer validated by FastAPI. The session gets one
intra-op thread, as the service's do, so both use the same cores.

    GELU_NAIVE_MODEL=model_repository/digits-mlp/1/model.onnx \
        uvicorn --factory bench.naive:create_app
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel


class PredictRequest(BaseModel):
    instances: list[list[float]]


class Prediction(BaseModel):
    class_index: int
    probabilities: list[float]


class PredictResponse(BaseModel):
    predictions: list[Prediction]


def create_app() -> FastAPI:
    """``uvicorn --factory bench.naive:create_app``; the model from ``GELU_NAIVE_MODEL``."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        os.environ["GELU_NAIVE_MODEL"], options, providers=["CPUExecutionProvider"]
    )
    app = FastAPI()

    @app.get("/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v1/models/{name}:predict")
    def predict(name: str, request: PredictRequest) -> PredictResponse:
        x = np.asarray(request.instances, dtype=np.float32)
        probabilities = session.run(["probabilities"], {"input": x})[0]
        return PredictResponse(
            predictions=[
                Prediction(class_index=int(row.argmax()), probabilities=row.tolist())
                for row in probabilities
            ]
        )

    return app
