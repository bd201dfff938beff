"""V1, KServe style: list models, describe one, ``:predict`` with ``{"instances": [...]}``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service import codecs
from service.routes import Plane
from service.runtime import check_batch
from service.schemas import (
    ERROR_RESPONSES,
    ModelList,
    ModelSummary,
    PredictRequest,
    PredictResponse,
    request_body,
)

router = APIRouter(tags=["V1 (KServe style)"], responses=ERROR_RESPONSES)


@router.get("/v1/models", response_model=ModelList)
async def list_models(plane: Plane) -> Response:
    """Every model with its versions, task, tensors and providers."""
    return Response(
        codecs.dumps({"models": [plane.summary(n) for n in plane.repository.models]}),
        media_type="application/json",
    )


@router.get("/v1/models/{name}", response_model=ModelSummary)
async def describe_model(name: str, plane: Plane) -> Response:
    """One model: versions, labels, input shape, normalisation, providers, metrics."""
    plane.model(name)
    return Response(codecs.dumps(plane.summary(name)), media_type="application/json")


async def _predict(request: Request, plane: Plane, name: str, version: str | None) -> Response:
    model = plane.model(name, version)
    inputs = codecs.decode_v1(await request.body(), model)
    check_batch(model, len(next(iter(inputs.values()))), plane.max_batch(model))
    outputs = await plane.infer(model, inputs)
    return Response(codecs.encode_v1(model, outputs, inputs), media_type="application/json")


@router.post(
    "/v1/models/{name}:predict",
    response_model=PredictResponse,
    openapi_extra=request_body(PredictRequest),
)
async def predict(name: str, request: Request, plane: Plane) -> Response:
    """Predict with the model's latest version."""
    return await _predict(request, plane, name, None)


@router.post(
    "/v1/models/{name}/versions/{version}:predict",
    response_model=PredictResponse,
    openapi_extra=request_body(PredictRequest),
)
async def predict_version(name: str, version: str, request: Request, plane: Plane) -> Response:
    """Predict with one version of the model."""
    return await _predict(request, plane, name, version)
