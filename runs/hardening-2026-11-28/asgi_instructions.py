"""Instructions per in-process V1 request at concurrency C through the HTTP app: run by count.sh under callgrind, which counts only inside operator.call (the measured requests)."""
import asyncio, json, math, operator, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.asgi_path import _started

def instrument(on):
    subprocess.run(["callgrind_control", f"--instr={'on' if on else 'off'}", str(os.getpid())], check=True, capture_output=True)

def main(repository, requests, concurrency, model="digits-mlp"):
    from contract.model_config import load_model_config
    from service.rest.app import create_app
    from service.settings import Settings

    width = 64
    settings = Settings(model_repository=repository, grpc_port=0, log_level="warning", compile_activations=False, inline_max_us=1_000_000)
    app = create_app(settings)
    loop = asyncio.new_event_loop()
    task, inbox = loop.run_until_complete(_started(app))
    path = f"/v1/models/{model}:predict"
    body = json.dumps({"instances": [[0.5] * width]}).encode()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    statuses = []
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
    def scope():
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "state": {}}
    async def ask(count):
        for _ in range(count):
            await app(scope(), receive, send)
    async def together(count):
        share = -(-count // concurrency)
        await asyncio.gather(*(ask(share) for _ in range(concurrency)))
    instrument(True)
    loop.run_until_complete(together(requests // 4))
    operator.call(loop.run_until_complete, together(requests))
    instrument(False)
    assert set(statuses) == {200}, set(statuses)
    loop.run_until_complete(inbox.put({"type": "lifespan.shutdown"}))
    loop.run_until_complete(task)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
