"""Pydantic models of every request and response body, for OpenAPI at ``/docs``.

Request bodies are parsed by ``service.codecs`` (orjson + numpy, far cheaper than validating
nested float lists through pydantic); these models document them, and ``request_body()``
puts a model's schema into a route's OpenAPI entry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Number = float | int
NestedNumbers = list[Any]  # numbers or nested lists of numbers, row-major


class ErrorResponse(BaseModel):
    """Every error: 4xx for a client's mistake, 5xx for the service's."""

    error: str = Field(examples=["unknown model 'nope'"])


# ---- V1 -------------------------------------------------------------------------------------


class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(examples=["FP32"])
    shape: list[int] = Field(description="-1 for the variable batch dimension")


class ModelSummary(BaseModel):
    """A model as V1 describes it: its versions and what a client needs to call it."""

    name: str
    versions: list[str]
    latest_version: str
    ready: bool
    platform: str
    task: str = Field(description="classification or reconstruction")
    activation: str
    arch: str
    label_names: list[str]
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    input_normalisation: dict[str, float] = Field(
        description="raw sample / divide_by = the input the model expects"
    )
    max_batch_size: int
    providers: list[str] = Field(description="execution providers the session really uses")
    provider_options: dict[str, dict[str, str]] = Field(
        description="each of those providers' options in force, as onnxruntime reports them "
        "(the CUDA provider's from the GELU_CUDA_* settings)"
    )
    memory_bytes: int = Field(
        description="resident memory the latest version's session took when it loaded, measured"
    )
    metrics: dict[str, float] = Field(description="training metrics of the latest version")


class ModelList(BaseModel):
    models: list[ModelSummary]


class ModelNames(BaseModel):
    models: list[str]


class PredictRequest(BaseModel):
    """KServe V1: one instance per row, each of the model's input shape."""

    instances: list[NestedNumbers] = Field(examples=[[[0.0] * 64]])


class ClassPrediction(BaseModel):
    label: str
    class_index: int
    probabilities: list[float]


class ReconstructionPrediction(BaseModel):
    reconstruction: NestedNumbers
    error: float = Field(description="mean squared error of the reconstruction")


class PredictResponse(BaseModel):
    predictions: list[ClassPrediction | ReconstructionPrediction]


# ---- Open Inference Protocol (V2) -----------------------------------------------------------


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool


class RepositoryIndexRequest(BaseModel):
    ready: bool = Field(False, description="only the versions that are ready")


class RepositoryControlRequest(BaseModel):
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="Triton's load overrides (config, file:<path>) are refused with 400: a "
        "model loads from its directory in the repository; other parameters are ignored",
    )


class RepositoryIndexEntry(BaseModel):
    name: str
    version: str | None = None
    state: str | None = Field(None, description="READY or UNAVAILABLE")
    reason: str | None = Field(None, description="why a version is unavailable")


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = Field(
        None,
        description="binary_data_size: bytes of this tensor after the JSON header; "
        "shared_memory_* are refused (400): no shared memory",
    )
    data: NestedNumbers | None = Field(None, description="flat or nested, row-major")


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(
        None,
        description="binary_data: true to receive this output as raw bytes; classification: "
        "N for the top N classes as BYTES 'score:index:label' (Triton's classification "
        "extension); shared_memory_* are refused (400): no shared memory",
    )


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = Field(
        None,
        description="binary_data_output: true for every output as raw bytes; timeout: the "
        "longest the request may wait in the model's queue, in microseconds (Triton's); "
        "priority and sequence_* are refused (400)",
    )
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Number] | list[str] | None = Field(
        None, description="numbers; strings for a classification output (BYTES)"
    )


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[ResponseOutput]


# ---- activations ----------------------------------------------------------------------------


class ActivationInfo(BaseModel):
    name: str
    formula: str
    derivative: str
    kernels: list[str] = Field(description="kernels for the function; derivatives: accurate")


class ActivationList(BaseModel):
    activations: list[ActivationInfo]
    providers: list[str] = Field(description="the native kernel's execution providers")
    accurate_kernel: str = Field(
        description="how the accurate kernel runs: compiled for this CPU, or on onnxruntime",
        examples=["compiled for znver4 (LLVM 22)"],
    )


class ActivationRequest(BaseModel):
    data: NestedNumbers | Number = Field(examples=[[-1.0, 0.0, 1.0]])
    derivative: bool = False
    kernel: Literal["accurate", "native"] = "accurate"


class ActivationResponse(BaseModel):
    name: str
    derivative: bool
    kernel: Literal["accurate", "native"]
    shape: list[int]
    data: NestedNumbers | Number


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace ``$ref``s into ``$defs`` with the definitions (OpenAPI has no local ``$defs``)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def request_body(
    model: type[BaseModel], binary: str | None = None, required: bool = True
) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that the route parses itself."""
    content: dict[str, Any] = {
        "application/json": {"schema": _inline_refs(model.model_json_schema())}
    }
    if binary:
        content[BINARY_MEDIA_TYPE] = {
            "schema": {"type": "string", "format": "binary", "description": binary}
        }
    return {"requestBody": {"required": required, "content": content}}


# What each error status means, wherever an operation can answer it; the body is always
# ``ErrorResponse``. FastAPI's own 422 never happens here (see ``service.rest.openapi``).
ERROR_DESCRIPTIONS = {
    400: "malformed or mismatched input, or an invalid query parameter",
    401: "the repository API is restricted (GELU_CONTROL_TOKEN): no or a wrong bearer token",
    404: "unknown model, version or activation",
    405: "the route does not take this method (Allow names those it does)",
    413: "body, batch or array above the maximum",
    415: "a Content-Encoding other than gzip, deflate or identity",
    431: "request headers above GELU_MAX_HEADER_BYTES or GELU_MAX_HEADERS",
    500: "internal error (a bug: please report it)",
    503: "the model or service is not ready, the model's queue is full, or the request's "
    "timeout passed while it queued (with Retry-After)",
}
BINARY_MEDIA_TYPE = "application/octet-stream"


def responses(*codes: int, binary: str | None = None) -> dict[int | str, dict[str, Any]]:
    """An operation's OpenAPI ``responses``: the error ``codes`` it can answer (500 always),
    and, with ``binary``, the raw-bytes form of its 200 beside the JSON one."""
    documented: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[code]}
        for code in sorted({*codes, 500})
    }
    if binary:
        documented[200] = {
            "description": "JSON, or raw bytes when asked for: " + binary,
            "content": {BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        }
    return documented
