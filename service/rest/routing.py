"""How the HTTP routes are registered, and how they reach the serving core.

Routes take the core from the app's state with ``get_plane(request)``. The inference
routes use ``DirectRoute``: FastAPI's per-request dependency resolution was most of a small
model's request time (py-spy under wrk; see docs/benchmarks.md). ``add_model_route`` registers
one endpoint on a model's path and on its ``/versions/{version}`` form.
"""

from __future__ import annotations

import inspect
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
        # The endpoint itself, not the signature-only wrapper of an unversioned path: the
        # wrapper is for OpenAPI, and one call fewer on the hot path.
        endpoint = getattr(self.endpoint, "__wrapped__", self.endpoint)

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return handler


def _without_version(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with its ``version`` parameter left at its default, so that FastAPI
    documents no ``version`` parameter on the unversioned path."""

    async def unversioned(**kwargs: Any) -> Response:
        return await endpoint(**kwargs)

    signature = inspect.signature(endpoint, eval_str=True)
    parameters = [p for p in signature.parameters.values() if p.name != "version"]
    unversioned.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    unversioned.__name__ = endpoint.__name__
    unversioned.__doc__ = endpoint.__doc__
    unversioned.__wrapped__ = endpoint  # type: ignore[attr-defined]
    return unversioned


def add_model_route(
    router: APIRouter,
    path: str,
    endpoint: Endpoint,
    method: str = "GET",
    direct: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``endpoint`` (which takes ``version: str | None = None``) on ``path`` and on
    ``path`` with ``/versions/{version}`` after ``{name}``; ``direct`` uses DirectRoute."""
    route_class = DirectRoute if direct else APIRoute
    for route_path, function in (
        (path, _without_version(endpoint)),
        (path.replace("{name}", "{name}/versions/{version}"), endpoint),
    ):
        router.add_api_route(
            route_path, function, methods=[method], route_class_override=route_class, **kwargs
        )
