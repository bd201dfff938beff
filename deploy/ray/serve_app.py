"""The service on Ray Serve: ``serve deploy deploy/ray/serve.yaml`` (or ``serve run``).

Each replica builds the service's own host (``service.host.Host``) from the ``GELU_*`` variables
of its runtime environment: its serving core, model control and HTTP app, with the same routes,
codecs, batcher, limits and errors as ``gelu-serve serve``, behind Ray's HTTP proxy (Ray's
``serve.ingress()`` without an app takes the replica's from ``__serve_build_asgi_app__``). Ray
runs that app's lifespan, which starts and stops the core, and calls the app for each request,
so every request goes through the app's one envelope (``service.rest.routing.Envelope``: request
id, credentials, metrics, access log); Ray's proxy passes the application's ``route_prefix`` as
the ASGI ``root_path`` and the whole path, and the envelope classes a request on the path less
it, as the router routes it, so any prefix guards the same routes (issue 62, item 6).

Ray's gRPC proxy (``grpc_options`` in the config) calls a replica's methods by the names of the
protocol's (``ModelInfer``, ...), with the decoded request: each is the gRPC face's own method
(``service.grpc.server.InferenceServicer``) over the replica's core and model control (the
host's, which the HTTP app serves too), its errors set on Ray's gRPC context. So HTTP and gRPC
clients reach every replica, and their requests batch together there, as in one process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from ray import serve

from service.grpc import inference_pb2 as pb
from service.grpc.server import SERVICE, InferenceServicer
from service.host import Host
from service.settings import load_settings

METHODS = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods


class _Aborted(Exception):
    """The servicer ended the call with a status (set on Ray's context)."""


class _RayContext:
    """What ``InferenceServicer`` needs of a gRPC context, on Ray's: ``abort`` sets the
    status and details Ray's proxy answers with; metadata is the call's, both ways."""

    def __init__(self, context: Any) -> None:
        self._context = context

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._context.set_code(code)
        self._context.set_details(details)
        raise _Aborted(details)

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def peer(self) -> str:
        """The client's connection, as Ray's proxy saw it: its streams' share is counted by it."""
        return str(self._context.peer())

    def set_trailing_metadata(self, metadata: Any) -> None:
        """The request id comes back as trailing metadata (Ray's proxy adds its own)."""
        self._context.set_trailing_metadata(list(metadata))

    def time_remaining(self) -> float | None:
        """The call's deadline: Ray's context carries none to the replica."""
        return None


def _grpc_method(name: str, empty: type) -> Callable[..., Awaitable[Any]]:
    """A replica method that Ray's gRPC proxy calls for the protocol's method ``name``."""

    async def call(self: Any, request: Any, grpc_context: Any = None) -> Any:
        try:
            return await getattr(self.servicer, name)(request, _RayContext(grpc_context))
        except _Aborted:
            return empty()  # Ray answers with the status set on its context

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{SERVICE}/{name} through Ray's gRPC proxy."
    return call


# The host is built in each replica when it starts, never in the process that deploys: the
# settings are the replica's, from the config's runtime_env.
@serve.ingress()
class GeluServe:
    """A replica: the host's HTTP app, and the gRPC protocol's methods over the same core."""

    def __init__(self) -> None:
        self.host = Host(load_settings())
        self.servicer = InferenceServicer(self.host.core, self.host.control)

    def __serve_build_asgi_app__(self) -> Any:
        """The replica's ASGI app; Ray runs its lifespan, which starts and stops the core."""
        return self.host.app

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], grpc_context: Any = None
    ) -> AsyncIterator[Any]:
        """The protocol's stream through Ray's gRPC proxy, which hands the replica the requests
        as they come and writes the answers it yields; a failure that ends the call
        (``triton_grpc_error``) is raised with its status set on Ray's context, which the
        proxy answers with."""
        async for answer in self.servicer.stream_answers(requests, _RayContext(grpc_context)):
            yield answer


for _method in METHODS:
    if _method.client_streaming:  # ModelStreamInfer, above
        continue
    _response = getattr(pb, _method.output_type.name)
    setattr(GeluServe, _method.name, _grpc_method(_method.name, _response))

app = serve.deployment(name="gelu-serve")(GeluServe).bind()
