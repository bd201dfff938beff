"""V1, KServe style: ``:predict`` with ``{"instances": [...]}``, list models, describe one."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from service import codecs
from service.errors import MethodNotAllowedError
from service.inference import ModelInfo
from service.rest.middleware import SERVED_VERSION, TRACE
from service.rest.routing import Answer, add_model_route, get_plane, read_body
from service.rest.schemas import (
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
    plane, body, trace = get_plane(request), await read_body(request), request.scope.get(TRACE)
    began = time.perf_counter_ns() if trace else 0
    decoded = await plane.codec(len(body), codecs.decode_v1, body)
    if trace is not None:
        trace.since("decode", began)
        decoded.trace = trace
    result = await plane.infer(name, version, decoded)
    request.scope[SERVED_VERSION] = result.model.version
    began = time.perf_counter_ns() if trace else 0
    content = await plane.codec(len(body), codecs.encode_v1, result)
    if trace is not None:
        trace.since("encode", began)
    return Answer(content, codecs.JSON_HEADERS)


# The inference routes come first: routing tries routes in order, on every request.
PREDICT_VERB = ":predict"
add_model_route(
    router,
    "/v1/models/{name}" + PREDICT_VERB,
    predict,
    method="POST",
    direct=True,
    response_model=PredictResponse,
    responses=responses(400, 404, 413, 503),
    openapi_extra=request_body(PredictRequest),
)


def summary(info: ModelInfo) -> dict[str, object]:
    """A model as V1 describes it: versions, task, labels, tensors, providers, metrics."""
    metadata = info.metadata()
    return {
        "name": info.name,
        "versions": info.versions,
        "latest_version": info.version,
        "ready": True,
        "platform": info.platform,
        "task": info.task,
        "activation": info.activation,
        "arch": info.arch,
        "label_names": info.label_names,
        "inputs": metadata["inputs"],
        "outputs": metadata["outputs"],
        "input_normalisation": info.input_normalisation,
        "max_batch_size": info.max_batch_size,
        "providers": info.providers,
        "provider_options": info.provider_options,
        "memory_bytes": info.memory_bytes,
        "metrics": info.metrics,
    }


@router.get("/", tags=["V1 (KServe style)"], responses=responses())
async def alive() -> Response:
    """KServe V1's liveness: 200 while the process serves HTTP."""
    return Response(codecs.dumps({"status": "alive"}), media_type=codecs.JSON)


@router.get("/v1/models", response_model=ModelList, responses=responses(503))
async def list_models(request: Request) -> Response:
    """Every model with its versions, task, tensors and providers."""
    plane = get_plane(request)
    models = [summary(plane.model_info(name)) for name in plane.model_names()]
    return Response(codecs.dumps({"models": models}), media_type=codecs.JSON)


@router.get("/v1/models/{name}", response_model=ModelSummary, responses=responses(404, 405, 503))
async def describe_model(name: str, request: Request) -> Response:
    """One model: versions, labels, input shape, normalisation, providers, metrics."""
    if name.endswith(PREDICT_VERB):  # the predict route's path, with the wrong method
        raise MethodNotAllowedError(f"{request.method} is not allowed on {PREDICT_VERB}", "POST")
    plane = get_plane(request)
    await plane.check_model_ready(name)  # KServe V1's model readiness: 404 unknown, 503 not ready
    return Response(codecs.dumps(summary(plane.model_info(name))), media_type=codecs.JSON)
