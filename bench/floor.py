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
