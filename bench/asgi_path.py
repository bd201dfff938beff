"""What one V1 predict costs through the HTTP app, in process: no server, no socket, no
client, so two revisions can be set side by side where wrk's noise is larger than their
difference.

    python bench/asgi_path.py REPOSITORY [REQUESTS [CONCURRENCY [MODEL]]]
    PYTHONPATH=OTHER_CHECKOUT python bench/asgi_path.py REPOSITORY   # another revision's app

It starts the app's lifespan (models loaded and warmed), then calls the app directly with
one small request at a time (``REQUESTS``, default 20,000) and prints the mean microseconds
per request over the second half (the first warms caches). With ``CONCURRENCY`` above 1, as
many requests are in flight (the batcher sees them together) and the figure is the time per
request of them all. ``MODEL`` (default digits-mlp) is any model with one FP32 input; the
settings are the environment's (``GELU_PROVIDERS=cuda,cpu``, say). The app is whatever
``service.rest.app`` the interpreter imports, so the same script times any revision that has
``create_app(settings)``.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any


async def _started(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    """The app's lifespan, started; its task and the queue that stops it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    ready = asyncio.get_running_loop().create_future()
    await inbox.put({"type": "lifespan.startup"})

    async def send(message: dict[str, Any]) -> None:
        if message["type"].startswith("lifespan.startup") and not ready.done():
            ready.set_result(message["type"])

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, send))
    if await ready != "lifespan.startup.complete":
        raise RuntimeError("the app did not start")
    return task, inbox


async def main(
    repository: str, requests: int, concurrency: int = 1, model: str = "digits-mlp"
) -> float:
    from contract.model_config import load_model_config
    from service.rest.app import create_app
    from service.settings import Settings

    config = load_model_config((Path(repository) / model / "config.pbtxt").read_bytes())
    width = math.prod(config.inputs[0].dims)
    settings = Settings(model_repository=repository, grpc_port=0, log_level="warning")
    app = create_app(settings)
    task, inbox = await _started(app)
    path = f"/v1/models/{model}:predict"
    body = json.dumps({"instances": [[0.5] * width]}).encode()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    def scope() -> dict[str, Any]:
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": "POST", "scheme": "http", "path": path,
                "raw_path": path.encode(), "query_string": b"",
                "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 8000), "state": {}}  # fmt: skip

    async def ask(count: int) -> None:
        for _ in range(count):
            await app(scope(), receive, send)

    async def together(count: int) -> None:
        share = -(-count // concurrency)
        await asyncio.gather(*(ask(share) for _ in range(concurrency)))

    half = requests // 2
    await together(half)
    began = time.perf_counter()
    await together(requests - half)
    took = time.perf_counter() - began
    assert set(statuses) == {200}, set(statuses)
    await inbox.put({"type": "lifespan.shutdown"})
    await task
    return took / (-(-(requests - half) // concurrency) * concurrency) * 1e6


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    model = sys.argv[4] if len(sys.argv) > 4 else "digits-mlp"
    print(f"{asyncio.run(main(sys.argv[1], count, concurrency, model)):.2f} us/request")
