"""Raw activation evaluation: JSON for small arrays, raw float32 for large ones."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from service import codecs
from service.activations import ACTIVATIONS
from service.routes import get_plane
from service.schemas import (
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


@router.get("/v1/activations", response_model=ActivationList, responses=responses())
async def list_activations(request: Request) -> Response:
    """The functions, their formulas and derivatives, and the providers evaluating them."""
    plane = get_plane(request)
    listing = [
        {"name": a.name, "formula": a.formula, "derivative": a.derivative_formula}
        for a in ACTIVATIONS.values()
    ]
    body = {"activations": listing, "providers": plane.activations.providers}
    return Response(codecs.dumps(body), media_type="application/json")


@router.post(
    "/v1/activations/{name}",
    response_model=ActivationResponse,
    responses=responses(400, 404, 413, binary="raw little-endian float32, its shape in X-Shape"),
    openapi_extra=request_body(ActivationRequest, BINARY_BODY),
)
async def evaluate(
    name: str,
    request: Request,
    derivative: bool = Query(False, description="evaluate the derivative instead"),
    shape: str | None = Query(None, description="binary bodies: the array's shape, e.g. 1000,1000"),
) -> Response:
    """Evaluate one activation (or its derivative) elementwise on an array of any shape."""
    plane = get_plane(request)
    plane.check_activation(name)
    limit = plane.settings.max_activation_elements
    body = await request.body()
    if request.headers.get("content-type", "").startswith(codecs.OCTET_STREAM):
        x = codecs.decode_activation_binary(
            body, request.headers.get(codecs.SHAPE_HEADER, shape), limit
        )
        y = await plane.activate(name, x, derivative)
        return Response(
            y.astype("<f4", copy=False).tobytes(),
            media_type=codecs.OCTET_STREAM,
            headers={codecs.SHAPE_HEADER: ",".join(map(str, y.shape))},
        )
    x, body_derivative = codecs.decode_activation_json(body, limit)
    y = await plane.activate(name, x, derivative or body_derivative)
    payload = {
        "name": name,
        "derivative": derivative or body_derivative,
        "shape": y.shape,
        "data": y,
    }
    return Response(codecs.dumps(payload), media_type="application/json")
