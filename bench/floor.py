"""The HTTP floors: the same server stack (uvicorn + FastAPI) reading the body and answering
constant JSON, or echoing the body back, with no model, codec or metrics. What no endpoint of
ours can beat: ``/floor`` for small inference requests, ``/echo`` for the activation endpoint's
large binary bodies."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

BODY = b'{"predictions":[{"label":"0","class_index":0}]}'


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


if __name__ == "__main__":
    import asyncio
    import sys

    asyncio.run(serve_grpc(int(sys.argv[1])))
