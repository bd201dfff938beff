"""The HTTP floor: the same server stack (uvicorn + FastAPI) reading the body and answering
constant JSON, with no model, codec or metrics. What no endpoint of ours can beat."""

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

    return app
