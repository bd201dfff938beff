"""The Open Inference Protocol (KServe V2) over REST, with the binary tensor data extension."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service import __version__, codecs
from service.dataplane import DataPlane, tensor_metadata
from service.routes import direct_post, get_plane
from service.schemas import (
    ERROR_RESPONSES,
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    request_body,
)

router = APIRouter(tags=["V2 (Open Inference Protocol)"], responses=ERROR_RESPONSES)
SERVER_NAME = "gelu-serve"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]
BINARY_BODY = (
    "The JSON request, then each input's raw little-endian bytes in order; the header "
    "Inference-Header-Content-Length gives the JSON's length."
)


def _json(payload: object, status_code: int = 200) -> Response:
    return Response(codecs.dumps(payload), status_code=status_code, media_type="application/json")


# The inference routes come first: routing tries routes in order, on every request.
async def _infer(request: Request, name: str, version: str | None) -> Response:
    plane = get_plane(request)
    model = plane.model(name, version)
    decoded = codecs.decode_v2(
        await request.body(),
        request.headers.get(codecs.HEADER_LENGTH),
        model,
        plane.max_batch(model),
    )
    results = await plane.infer(model, decoded.inputs, [n for n, _ in decoded.outputs])
    body, headers = codecs.encode_v2(model, decoded, results)
    return Response(body, headers=headers)


@direct_post(
    router,
    "/v2/models/{name}/infer",
    response_model=InferenceResponse,
    openapi_extra=request_body(InferenceRequest, BINARY_BODY),
)
async def infer(name: str, request: Request) -> Response:
    """Inference with the model's latest version: JSON, or JSON plus binary tensors."""
    return await _infer(request, name, None)


@direct_post(
    router,
    "/v2/models/{name}/versions/{version}/infer",
    response_model=InferenceResponse,
    openapi_extra=request_body(InferenceRequest, BINARY_BODY),
)
async def infer_version(name: str, version: str, request: Request) -> Response:
    """Inference with one version of the model."""
    return await _infer(request, name, version)


@router.get("/v2", response_model=ServerMetadata)
async def server_metadata() -> Response:
    """Server name, version and protocol extensions."""
    return _json({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


@router.get("/v2/health/live", response_model=LiveResponse)
async def live() -> Response:
    """200 while the process serves HTTP."""
    return _json({"live": True})


@router.get(
    "/v2/health/ready",
    response_model=ReadyResponse,
    responses={503: {"model": ReadyResponse, "description": "not ready"}},
)
async def ready(request: Request) -> Response:
    """200 when every model is loaded and warmed up, else 503."""
    is_ready = get_plane(request).ready
    return _json({"ready": is_ready}, 200 if is_ready else 503)


def _metadata(plane: DataPlane, name: str, version: str | None) -> Response:
    model = plane.repository.get(name, version)
    return _json(
        {
            "name": name,
            "versions": [model.version] if version else list(plane.repository.models[name]),
            "platform": model.config.platform,
            "inputs": tensor_metadata(model, inputs=True),
            "outputs": tensor_metadata(model, inputs=False),
        }
    )


@router.get("/v2/models/{name}", response_model=ModelMetadata)
async def model_metadata(name: str, request: Request) -> Response:
    """A model's versions, platform and tensors."""
    return _metadata(get_plane(request), name, None)


@router.get("/v2/models/{name}/versions/{version}", response_model=ModelMetadata)
async def model_version_metadata(name: str, version: str, request: Request) -> Response:
    """One version's platform and tensors."""
    return _metadata(get_plane(request), name, version)


def _model_ready(plane: DataPlane, name: str, version: str | None) -> Response:
    plane.model(name, version)  # 404 unknown, 503 not ready
    return _json({"name": name, "ready": True})


@router.get("/v2/models/{name}/ready", response_model=ModelReadyResponse)
async def model_ready(name: str, request: Request) -> Response:
    """200 when the model's latest version is ready."""
    return _model_ready(get_plane(request), name, None)


@router.get("/v2/models/{name}/versions/{version}/ready", response_model=ModelReadyResponse)
async def model_version_ready(name: str, version: str, request: Request) -> Response:
    """200 when this version is ready."""
    return _model_ready(get_plane(request), name, version)


def _config(plane: DataPlane, name: str, version: str | None) -> Response:
    config = plane.repository.get(name, version).config
    return _json(
        {
            "name": config.name,
            "platform": config.platform,
            "max_batch_size": config.max_batch_size,
            "input": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.dims}
                      for t in config.inputs],
            "output": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.dims}
                       for t in config.outputs],
            "dynamic_batching": {"max_queue_delay_microseconds": config.max_queue_delay_us}
            if config.dynamic_batching else None,
        }
    )  # fmt: skip


@router.get("/v2/models/{name}/config")
async def model_config(name: str, request: Request) -> Response:
    """The model's config.pbtxt as JSON (Triton's model configuration extension)."""
    return _config(get_plane(request), name, None)


@router.get("/v2/models/{name}/versions/{version}/config")
async def model_version_config(name: str, version: str, request: Request) -> Response:
    """The config.pbtxt as JSON, for one version."""
    return _config(get_plane(request), name, version)
