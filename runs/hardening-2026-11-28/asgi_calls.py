"""Python calls per in-process V1 request at concurrency C (sys.setprofile): python asgi_calls.py model_repository 6400 64, run from a checkout's root."""
import asyncio, json, os, sys, collections
sys.path.insert(0, os.getcwd())
from bench.asgi_path import _started

def main(repository, requests, concurrency, model="digits-mlp"):
    from service.rest.app import create_app
    from service.settings import Settings
    settings = Settings(model_repository=repository, grpc_port=0, log_level="warning", compile_activations=False)
    app = create_app(settings)
    loop = asyncio.new_event_loop()
    task, inbox = loop.run_until_complete(_started(app))
    path = f"/v1/models/{model}:predict"
    body = json.dumps({"instances": [[0.5] * 64]}).encode()
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
    loop.run_until_complete(together(requests))
    counts = collections.Counter()
    def prof(frame, event, arg):
        if event == "call":
            c = frame.f_code
            counts[f"{c.co_filename.replace(os.getcwd()+'/','')}:{c.co_name}"] += 1
        elif event == "c_call":
            counts[f"C:{getattr(arg,'__qualname__',arg)}"] += 1
    sys.setprofile(prof)
    loop.run_until_complete(together(requests))
    sys.setprofile(None)
    assert set(statuses) == {200}, set(statuses)
    total = sum(counts.values())
    print(f"TOTAL calls/request {total/requests:.1f}")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:400]:
        print(f"{v/requests:8.3f} {k}")
    loop.run_until_complete(inbox.put({"type": "lifespan.shutdown"}))
    loop.run_until_complete(task)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
