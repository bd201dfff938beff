"""The HTTP floors: the same server stack (uvicorn + FastAPI) reading the body and answering
constant JSON, or echoing the body back, with no model, codec or metrics: ``/floor`` for small
inference requests, ``/echo`` for the activation endpoint's large binary bodies; and the same
constant from a pure ASGI app, no framework (``asgi_floor``): what uvicorn alone costs.

``make bench`` serves them with stock uvicorn, and also as the service serves (``--http``: its
own protocol, which writes a response's head with its body and hands a request body on with
fewer copies): the service's routes skip FastAPI's per-request layers and may pass the stock
floors, so the second says how much of that is the server rather than the app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request, Response

BODY = b'{"predictions":[{"label":"0","class_index":0}]}'
Message = MutableMapping[str, Any]
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]


def create_app() -> FastAPI:
    """``uvicorn --factory bench.floor:create_app``."""
    app = FastAPI()

    @app.post("/floor")
    async def floor(request: Request) -> Response:
        await request.body()
        return Response(BODY, media_type="application/json")

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/octet-stream")

    return app


async def asgi_floor(
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """``uvicorn bench.floor:asgi_floor``: the same constant answer with no framework, the
    request's body read whole first (the server's own cost, without FastAPI's routing)."""
    if scope["type"] != "http":  # the lifespan: nothing to start
        message = await receive()
        while message["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


def create_asgi_app() -> Callable[..., Awaitable[None]]:
    """``uvicorn --factory bench.floor:create_asgi_app``: ``asgi_floor``."""
    return asgi_floor


# The gRPC floor: grpcio's asyncio server answering every call with constant bytes, no model.
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"


async def serve_grpc(port: int) -> None:
    """``python -m bench.floor PORT``: the gRPC floor on 127.0.0.1:PORT until killed."""
    import grpc

    async def constant(request: bytes, context: object) -> bytes:
        return BODY

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(constant)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_http(port: int, workers: int = 1) -> None:
    """``python -m bench.floor --http PORT [WORKERS]``: the HTTP floor served as the service
    serves (its uvicorn protocol and options, ``service.rest.server.http_options``; with several
    workers, the service's supervisor and each worker on its own ``SO_REUSEPORT`` socket), to
    tell what the service's own server saves from what its app does. SIGTERM stops every
    worker."""
    if workers == 1:
        _serve_http("127.0.0.1", port, workers)
        return
    from service.host import supervise

    supervise("127.0.0.1", port, workers, _serve_http)


def _serve_http(host: str, port: int, workers: int) -> None:
    import uvicorn

    from service.host import reuse_port_socket
    from service.rest.server import http_options
    from service.settings import load_settings

    options = http_options(load_settings())
    config = uvicorn.Config(create_app(), host=host, port=port, log_level="warning", **options)
    sockets = [reuse_port_socket(host, port)] if workers > 1 else None
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    import asyncio
    import sys

    if sys.argv[1] == "--http":
        serve_http(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    else:
        asyncio.run(serve_grpc(int(sys.argv[1])))
