"""Instructions per in-process V1 request through the HTTP app, in one of issue 65's modes,
run by count.sh under callgrind (all threads, the spans' export included: the window ends with
the exporter flushed). Modes: off, traced-0.01, traced-1.0 (OTLP/HTTP to bench.otlp_sink in a
subprocess, not counted), nocache, hit, miss (the small model with its response cache on; miss:
every request's inputs unique), nocache-unique (no cache, the miss's unique inputs).

    python runs/lean-2026-11-28/count.py REPOSITORY REQUESTS CONCURRENCY MODE
"""

import asyncio
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from bench.asgi_path import _started  # noqa: E402


def instrument(on: bool) -> None:
    if os.environ.get("COUNT_TIMING"):  # timing run, not under callgrind
        return
    flag = "on" if on else "off"
    subprocess.run(["callgrind_control", f"--instr={flag}", str(os.getpid())], check=True,
                   capture_output=True)


def flush(app) -> None:
    tracing = app.state.dataplane.tracing
    if tracing is not None:  # the old code's Tracing has no flush of its own
        (getattr(tracing, "flush", None) or tracing.provider.force_flush)()


def main(repository: str, requests: int, concurrency: int, mode: str) -> None:
    model = "digits-mlp"
    sink = None
    scratch = tempfile.mkdtemp()
    if mode.startswith("traced-"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        sink = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", str(port)])
        atexit.register(sink.terminate)  # however the run ends
        time.sleep(1.5)
        os.environ.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                          OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                          OTEL_TRACES_SAMPLER="traceidratio",
                          OTEL_TRACES_SAMPLER_ARG=mode.split("-")[1])
    if mode in ("nocache", "hit", "miss", "nocache-unique"):
        shutil.copytree(Path(repository) / model, Path(scratch) / model)
        config = Path(scratch) / model / "config.pbtxt"
        if not mode.startswith("nocache"):
            config.write_text(config.read_text() + "response_cache { enable: true }\n")
            os.environ["GELU_RESPONSE_CACHE_BYTES"] = str(64 << 20)
        repository = scratch
    from service.rest.app import create_app
    from service.settings import Settings

    settings = Settings(model_repository=repository, grpc_port=0, log_level="warning",
                        compile_activations=False, inline_max_us=1_000_000)
    app = create_app(settings)
    loop = asyncio.new_event_loop()
    task, inbox = loop.run_until_complete(_started(app))
    path = f"/v1/models/{model}:predict"
    # The bodies are made before the window, so only the app is counted; a miss's first value
    # is unique, as make bench's miss row makes it (an integer).
    fixed = json.dumps({"instances": [[0.5] * 64]}).encode()
    unique = iter([json.dumps({"instances": [[i] + [0.5] * 63]}).encode()
                   for i in range(1, 2 * requests + concurrency + 2)])

    def body() -> bytes:
        return next(unique) if mode in ("miss", "nocache-unique") else fixed

    statuses = []
    warm_headers: list = []

    async def ask(count: int) -> None:
        for _ in range(count):
            data = body()

            async def receive(data=data):
                return {"type": "http.request", "body": data, "more_body": False}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                       (b"content-length", str(len(data)).encode()), *warm_headers]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": path,
                     "raw_path": path.encode(), "query_string": b"", "root_path": "",
                     "headers": headers, "client": ("127.0.0.1", 1),
                     "server": ("127.0.0.1", 8000), "state": {}}
            await app(scope, receive, send)

    async def together(count: int) -> None:
        share = -(-count // concurrency)
        await asyncio.gather(*(ask(share) for _ in range(concurrency)))

    # Warm-up; traced, its requests carry a parent whose trace id every ratio samples, so the
    # exporter's first export (its connection) is made before the window.
    if mode.startswith("traced-"):
        warm_headers.append((b"traceparent", b"00-" + b"0" * 31 + b"1-" + b"0" * 15 + b"1-01"))
    loop.run_until_complete(together(max(requests // 4, concurrency)))
    flush(app)
    warm_headers.clear()
    runs = app.state.dataplane.started_repository().get(model).runs.statistics
    before = runs.inference_count, runs.execution_count
    instrument(True)
    began = time.perf_counter()
    loop.run_until_complete(together(requests))
    flush(app)
    took = time.perf_counter() - began
    instrument(False)
    print(f"{mode} c={concurrency}: {took / requests * 1e6:.1f} us/request", file=sys.stderr)
    samples, batches = runs.inference_count - before[0], runs.execution_count - before[1]
    print(f"{mode} c={concurrency}: mean batch {samples / max(batches, 1):.1f} "
          f"({samples} samples in {batches} runs)", file=sys.stderr)
    assert set(statuses) == {200}, set(statuses)
    loop.run_until_complete(inbox.put({"type": "lifespan.shutdown"}))
    loop.run_until_complete(task)
    if sink is not None:
        sink.terminate()
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
