"""Raw activation evaluation: JSON for small arrays, raw float32 for large ones."""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Request, Response

from service import codecs
from service.activations import KERNELS
from service.dataplane import DataPlane
from service.errors import BadInputError
from service.rest.middleware import TRACE
from service.rest.routing import Answer, DirectRoute, get_plane, header, read_body
from service.rest.schemas import (
    ActivationList,
    ActivationRequest,
    ActivationResponse,
    request_body,
    responses,
)

router = APIRouter(tags=["Activations"])
BINARY_BODY = (
    "Raw little-endian float32 values; the shape in the X-Shape header or the shape query "
    "parameter (default: one dimension). The answer is raw float32 with X-Shape."
)


@router.get("/v1/activations", response_model=ActivationList, responses=responses(503))
async def list_activations(request: Request) -> Response:
    """The functions, their formulas and derivatives, and what evaluates them."""
    plane = get_plane(request)
    listing = [
        {"name": name, "formula": formula, "derivative": derivative, "kernels": kernels}
        for name, formula, derivative, kernels in plane.activations.formulas()
    ]
    body = {
        "activations": listing,
        "providers": plane.activations.providers,
        "accurate_kernel": plane.activations.accurate,
    }
    return Response(codecs.dumps(body), media_type=codecs.JSON)


# Its query parameters, documented here: the route reads them itself (a direct route, see
# ``service.rest.routing``), as FastAPI would, with a 400 for one it cannot read.
QUERY_PARAMETERS = [
    {
        "name": "derivative",
        "in": "query",
        "required": False,
        "schema": {"type": "boolean", "default": False},
        "description": "evaluate the derivative instead",
    },
    {
        "name": "shape",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "binary bodies: the array's shape, e.g. 1000,1000",
    },
    {
        "name": "kernel",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": list(KERNELS)},
        "description": "accurate (the default: within 1 float32 ULP of the exact value) or "
        "native (the ONNX op an exported model runs; functions only)",
    },
]
# What FastAPI (pydantic) reads as a boolean, in any case.
BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "t": True, "y": True}
BOOLEANS |= {"false": False, "0": False, "no": False, "off": False, "f": False, "n": False}


def flag(value: str | None, name: str) -> bool:
    """A boolean query parameter (false when absent)."""
    if value is None:
        return False
    try:
        return BOOLEANS[value.lower()]
    except KeyError:
        raise BadInputError(
            f"query parameter {name!r} must be true or false, got {value!r}"
        ) from None


async def evaluate(request: Request, name: str) -> Response:
    """Evaluate one activation (or its derivative) elementwise on an array of any shape."""
    plane = get_plane(request)
    query = request.query_params
    derivative = flag(query.get("derivative"), "derivative")
    kernel = query.get("kernel")
    plane.activations.check(name)
    body = await read_body(request)
    if (header(request, b"content-type") or "").startswith(codecs.OCTET_STREAM):
        kernel = plane.activations.kernel(name, derivative, kernel)
        shape = header(request, codecs.SHAPE_HEADER_KEY) or query.get("shape")
        x = codecs.decode_activation_binary(body, shape)
        y = await _activate(request, plane, name, x, derivative, kernel)
        content, headers = codecs.encode_activation_binary(y, kernel)
        return Answer(content, headers)
    x, body_derivative, body_kernel = await plane.codec(
        len(body), codecs.decode_activation_json, body
    )
    derivative = derivative or body_derivative
    kernel = plane.activations.kernel(name, derivative, kernel or body_kernel)
    y = await _activate(request, plane, name, x, derivative, kernel)
    encoded = await plane.codec(
        len(body), codecs.encode_activation_json, name, derivative, kernel, y
    )
    return Answer(encoded, codecs.JSON_HEADERS)


async def _activate(
    request: Request, plane: DataPlane, name: str, x: np.ndarray, derivative: bool, kernel: str
) -> np.ndarray:
    """``plane.activations.evaluate``, a ``compute`` stage of a traced request."""
    trace = request.scope.get(TRACE)
    began = time.perf_counter_ns() if trace else 0
    y = await plane.activations.evaluate(name, x, derivative, kernel)
    if trace is not None:
        trace.since("compute", began)
    return y


router.add_api_route(
    "/v1/activations/{name}",
    evaluate,
    methods=["POST"],
    route_class_override=DirectRoute,
    response_model=ActivationResponse,
    responses=responses(
        400, 404, 413, 503, binary="raw little-endian float32, its shape in X-Shape"
    ),
    openapi_extra={**request_body(ActivationRequest, BINARY_BODY), "parameters": QUERY_PARAMETERS},
)
