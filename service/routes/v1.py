"""V1, KServe style: ``:predict`` with ``{"instances": [...]}``, list models, describe one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service import codecs
from service.routes import add_model_route, get_plane
from service.runtime import check_batch
from service.schemas import (
    ModelList,
    ModelSummary,
    PredictRequest,
    PredictResponse,
    request_body,
    responses,
)

router = APIRouter(tags=["V1 (KServe style)"])


async def predict(request: Request, name: str, version: str | None = None) -> Response:
    """Predict with the model (its latest version unless one is named)."""
    plane = get_plane(request)
    model = plane.model(name, version)
    inputs = codecs.decode_v1(await request.body(), model)
    check_batch(model, len(next(iter(inputs.values()))), plane.max_batch(model))
    outputs = await plane.infer(model, inputs)
    return Response(codecs.encode_v1(model, outputs, inputs), media_type="application/json")


# The inference routes come first: routing tries routes in order, on every request.
add_model_route(
    router,
    "/v1/models/{name}:predict",
    predict,
    method="POST",
    direct=True,
    response_model=PredictResponse,
    responses=responses(400, 404, 413, 503),
    openapi_extra=request_body(PredictRequest),
)


@router.get("/v1/models", response_model=ModelList, responses=responses())
async def list_models(request: Request) -> Response:
    """Every model with its versions, task, tensors and providers."""
    plane = get_plane(request)
    models = [plane.summary(n) for n in plane.repository.models]
    return Response(codecs.dumps({"models": models}), media_type="application/json")


@router.get("/v1/models/{name}", response_model=ModelSummary, responses=responses(404, 503))
async def describe_model(name: str, request: Request) -> Response:
    """One model: versions, labels, input shape, normalisation, providers, metrics."""
    plane = get_plane(request)
    plane.model(name)
    return Response(codecs.dumps(plane.summary(name)), media_type="application/json")
