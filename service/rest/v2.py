"""The Open Inference Protocol (KServe V2) over REST, with the binary tensor data extension."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from service import codecs
from service.errors import BadInputError
from service.logs import adopt_request_id
from service.rest.middleware import REQUEST_ID_GIVEN, SERVED_VERSION, TRACE
from service.rest.routing import (
    Answer,
    add_model_route,
    get_control,
    get_plane,
    header,
    read_body,
)
from service.rest.schemas import (
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadata,
    ModelNames,
    ModelReadyResponse,
    ReadyResponse,
    RepositoryControlRequest,
    RepositoryIndexEntry,
    RepositoryIndexRequest,
    ServerMetadata,
    request_body,
    responses,
)

router = APIRouter(tags=["V2 (Open Inference Protocol)"])
BINARY_BODY = (
    "The JSON request, then each input's raw little-endian bytes in order; the header "
    "Inference-Header-Content-Length gives the JSON's length."
)
BINARY_RESPONSE = (
    "the JSON response, then each output asked for with binary_data as raw little-endian "
    "bytes; the header Inference-Header-Content-Length gives the JSON's length."
)


def _json(payload: object, status_code: int = 200) -> Response:
    return Response(codecs.dumps(payload), status_code=status_code, media_type=codecs.JSON)


async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """Inference with the model (its latest version unless one is named): JSON, or JSON plus
    binary tensors."""
    plane, body, trace = get_plane(request), await read_body(request), request.scope.get(TRACE)
    header_length = header(request, codecs.HEADER_LENGTH_KEY)
    began = time.perf_counter_ns() if trace else 0
    decoded = await plane.codec(len(body), codecs.decode_v2, body, header_length)
    if decoded.id and not request.scope[REQUEST_ID_GIVEN]:
        adopt_request_id(decoded.id)
    if trace is not None:
        trace.since("decode", began)
        decoded.trace = trace
    result = await plane.infer(name, version, decoded)
    request.scope[SERVED_VERSION] = result.model.version
    began = time.perf_counter_ns() if trace else 0
    content, headers = await plane.codec(len(body), codecs.encode_v2, result)
    if trace is not None:
        trace.since("encode", began)
    return Answer(content, headers)


# The inference routes come first: routing tries routes in order, on every request.
add_model_route(
    router,
    "/v2/models/{name}/infer",
    infer,
    method="POST",
    direct=True,
    response_model=InferenceResponse,
    responses=responses(400, 404, 413, 503, binary=BINARY_RESPONSE),
    openapi_extra=request_body(InferenceRequest, BINARY_BODY),
)


@router.get("/v2", response_model=ServerMetadata, responses=responses())
async def server_metadata(request: Request) -> Response:
    """Server name, version and protocol extensions."""
    return _json(get_plane(request).server_metadata())


@router.get("/v2/health/live", response_model=LiveResponse, responses=responses())
async def live() -> Response:
    """200 while the process serves HTTP."""
    return _json({"live": True})


@router.get(
    "/v2/health/ready",
    response_model=ReadyResponse,
    responses={**responses(), 503: {"model": ReadyResponse, "description": "not ready"}},
)
async def ready(request: Request) -> Response:
    """200 when the models the control mode names serve and the service is not draining, else
    503 (docs/serving.md, "Readiness")."""
    is_ready = get_plane(request).ready
    return _json({"ready": is_ready}, 200 if is_ready else 503)


@router.get("/v2/models", response_model=ModelNames, responses=responses(503))
async def list_models(request: Request) -> Response:
    """The names of the models serving (as KServe's server lists them)."""
    return _json({"models": get_plane(request).model_names()})


@router.get("/v2/models/stats", responses=responses(503), tags=["V2 (Open Inference Protocol)"])
async def all_statistics(request: Request) -> Response:
    """Triton's statistics of every serving model version."""
    return _json({"model_stats": get_plane(request).statistics()})


async def model_statistics(request: Request, name: str, version: str | None = None) -> Response:
    """Triton's statistics of a model's serving versions (or of one version): requests
    succeeded and failed, queue and compute time, runs and samples, per batch size."""
    return _json({"model_stats": get_plane(request).statistics(name, version)})


async def model_metadata(request: Request, name: str, version: str | None = None) -> Response:
    """A model's versions, platform and tensors (one version's, when named)."""
    return _json(get_plane(request).model_metadata(name, version))


async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    """200 when the model (its latest version unless one is named) is ready; 503 when the
    repository holds it but it is not (not loaded, evicted, draining); 404 when it holds none."""
    await get_plane(request).check_model_ready(name, version)
    return _json({"name": name, "ready": True})


async def model_config(request: Request, name: str, version: str | None = None) -> Response:
    """The model's config.pbtxt as JSON (Triton's model configuration extension)."""
    return _json(get_plane(request).model_config(name, version))


add_model_route(
    router,
    "/v2/models/{name}",
    model_metadata,
    response_model=ModelMetadata,
    responses=responses(404, 503),
)
add_model_route(
    router,
    "/v2/models/{name}/ready",
    model_ready,
    response_model=ModelReadyResponse,
    responses=responses(404, 503),
)
add_model_route(router, "/v2/models/{name}/config", model_config, responses=responses(404, 503))
add_model_route(router, "/v2/models/{name}/stats", model_statistics, responses=responses(404, 503))


# ---- Triton's model repository extension ------------------------------------------------------


@router.post(
    "/v2/repository/index",
    response_model=list[RepositoryIndexEntry],
    responses=responses(400, 401, 503),
    openapi_extra=request_body(RepositoryIndexRequest, required=False),
    tags=["Model repository (Triton)"],
)
async def repository_index(request: Request) -> Response:
    """Every model in the repository, each version's state and the reason it is unavailable."""
    shape = '{"ready": true|false}'
    ready = (await _optional_object(request, shape)).get("ready", False)
    if not isinstance(ready, bool):
        raise BadInputError(f"body must be a JSON object {shape}")
    return _json(await get_control(request).index(ready))


@router.post(
    "/v2/repository/models/{name}/load",
    openapi_extra=request_body(RepositoryControlRequest, required=False),
    responses=responses(400, 401, 404, 503),
    tags=["Model repository (Triton)"],
)
async def load_model(name: str, request: Request) -> Response:
    """Load or reload a model from the repository (explicit mode): its new or changed versions
    load and warm up before they take requests; those they replace finish theirs first."""
    await get_control(request).load(name, await _control_parameters(request))
    return _json({})


@router.post(
    "/v2/repository/models/{name}/unload",
    openapi_extra=request_body(RepositoryControlRequest, required=False),
    responses=responses(401, 404, 503),
    tags=["Model repository (Triton)"],
)
async def unload_model(name: str, request: Request) -> Response:
    """Stop serving a model (explicit mode); its in-flight and queued requests finish first."""
    await _control_parameters(request)  # unload_dependents: no model here has dependents
    await get_control(request).unload(name)
    return _json({})


async def _control_parameters(request: Request) -> dict[str, object]:
    """The parameters of a load or unload request."""
    shape = '{"parameters": {...}}'
    parameters = (await _optional_object(request, shape)).get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadInputError(f"body must be a JSON object {shape}")
    return parameters


async def _optional_object(request: Request, shape: str) -> dict[str, object]:
    """A repository request's body, which is optional: a JSON object ({} when empty)."""
    body = await request.body()
    payload = codecs.loads(body) if body.strip() else {}
    if not isinstance(payload, dict):
        raise BadInputError(f"body must be a JSON object {shape}")
    return payload


# ---- Triton's logging extension ---------------------------------------------------------------


@router.get("/v2/logging", responses=responses(401), tags=["Logging (Triton)"])
async def log_settings(request: Request) -> Response:
    """This process's log settings: log_info, log_warning, log_error, log_verbose_level,
    log_format (default, ISO8601 or json) and log_file (always standard error)."""
    return _json(get_plane(request).logs.settings())


@router.post("/v2/logging", responses=responses(400, 401), tags=["Logging (Triton)"])
async def update_log_settings(request: Request) -> Response:
    """Change some of the log settings, from the next log line on; the settings now."""
    plane, shape = get_plane(request), '{"log_info": true, ...}'
    return _json(plane.logs.update(await _optional_object(request, shape)))


# ---- Triton's trace extension -----------------------------------------------------------------


@router.get("/v2/trace/setting", responses=responses(401), tags=["Trace (Triton)"])
async def trace_settings(request: Request) -> Response:
    """The server's trace settings: trace_level, trace_rate, trace_count, log_frequency."""
    return _json(get_plane(request).trace_settings.reply())


@router.post("/v2/trace/setting", responses=responses(400, 401), tags=["Trace (Triton)"])
async def update_trace_settings(request: Request) -> Response:
    """Change some of the server's trace settings, from the next request on."""
    plane, shape = get_plane(request), '{"trace_level": ["TIMESTAMPS"], ...}'
    return _json(plane.trace_settings.update(await _optional_object(request, shape)))


@router.get("/v2/models/{name}/trace/setting", responses=responses(401, 404),
            tags=["Trace (Triton)"])  # fmt: skip
async def model_trace_settings(name: str, request: Request) -> Response:
    """The trace settings in force for one model (its own, else the server's)."""
    plane = get_plane(request)
    plane.model_info(name)  # 404 for a model the repository does not serve
    return _json(plane.trace_settings.reply(name))


@router.post("/v2/models/{name}/trace/setting", responses=responses(400, 401, 404),
             tags=["Trace (Triton)"])  # fmt: skip
async def update_model_trace_settings(name: str, request: Request) -> Response:
    """Change one model's own trace settings (null: the server's again)."""
    plane, shape = get_plane(request), '{"trace_rate": "10", ...}'
    plane.model_info(name)
    return _json(plane.trace_settings.update(await _optional_object(request, shape), name))
