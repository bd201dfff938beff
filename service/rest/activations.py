"""Raw activation evaluation: JSON for small arrays, raw float32 for large ones."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from service import codecs
from service.rest.routing import Answer, get_plane
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
    """The functions, their formulas and derivatives, and the providers evaluating them."""
    plane = get_plane(request)
    listing = [
        {"name": name, "formula": formula, "derivative": derivative, "kernels": kernels}
        for name, formula, derivative, kernels in plane.activation_formulas()
    ]
    body = {"activations": listing, "providers": plane.activation_providers()}
    return Response(codecs.dumps(body), media_type=codecs.JSON)


@router.post(
    "/v1/activations/{name}",
    response_model=ActivationResponse,
    responses=responses(
        400, 404, 413, 503, binary="raw little-endian float32, its shape in X-Shape"
    ),
    openapi_extra=request_body(ActivationRequest, BINARY_BODY),
)
async def evaluate(
    name: str,
    request: Request,
    derivative: bool = Query(False, description="evaluate the derivative instead"),
    shape: str | None = Query(None, description="binary bodies: the array's shape, e.g. 1000,1000"),
    kernel: str | None = Query(
        None,
        description="accurate (the default: within 1 float32 ULP of the exact value) or "
        "native (the ONNX op an exported model runs; functions only)",
    ),
) -> Response:
    """Evaluate one activation (or its derivative) elementwise on an array of any shape."""
    plane = get_plane(request)
    plane.check_activation(name)
    body = await request.body()
    if request.headers.get("content-type", "").startswith(codecs.OCTET_STREAM):
        kernel = plane.check_kernel(name, derivative, kernel)
        x = codecs.decode_activation_binary(body, request.headers.get(codecs.SHAPE_HEADER, shape))
        y = await plane.activate(name, x, derivative, kernel)
        content, headers = codecs.encode_activation_binary(y, kernel)
        return Answer(content, headers)
    x, body_derivative, body_kernel = await plane.codec(
        len(body), codecs.decode_activation_json, body
    )
    derivative = derivative or body_derivative
    kernel = plane.check_kernel(name, derivative, kernel or body_kernel)
    y = await plane.activate(name, x, derivative, kernel)
    encoded = await plane.codec(
        len(body), codecs.encode_activation_json, name, derivative, kernel, y
    )
    return Response(encoded, media_type=codecs.JSON)
