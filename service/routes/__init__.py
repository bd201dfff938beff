"""HTTP faces over the data plane: V1 (KServe style), V2 (Open Inference Protocol), activations.

Routes take the data plane from the app's state with ``get_plane(request)``, and the inference
routes use ``DirectRoute``: FastAPI's per-request dependency resolution was most of a small
model's request time (py-spy under wrk; see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from service.dataplane import DataPlane

Endpoint = Callable[..., Awaitable[Response]]


def get_plane(request: Request) -> DataPlane:
    """The app's data plane, set by the lifespan."""
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


class DirectRoute(APIRoute):
    """An APIRoute whose endpoint is called with the request and its path parameters (as
    strings) and returns a Response itself: no dependency resolution, no response validation.
    OpenAPI still comes from the endpoint's signature and the route's declarations."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return handler


def direct_post(router: APIRouter, path: str, **kwargs: Any) -> Callable[[Endpoint], Endpoint]:
    """``@router.post(path, ...)`` with ``DirectRoute``, for the hot inference endpoints."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=DirectRoute, **kwargs
        )
        return endpoint

    return register
