"""Instructions per call of the HTTP envelope's begin_trace for a request sampled out (no
propagator header), counted by callgrind: N calls, less N calls of a function that does
nothing, over N. Run by begin_trace_count.sh from a checkout's root.

    valgrind --tool=callgrind --instr-atstart=no python runs/lean-2026-11-28/begin_trace_count.py N
"""

import asyncio
import os
import subprocess
import sys

sys.path.insert(0, os.getcwd())
os.environ.update(OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="traceidratio",
                  OTEL_TRACES_SAMPLER_ARG="0", OTEL_BSP_SCHEDULE_DELAY="3600000")
from bench.asgi_path import _started  # noqa: E402
from service.rest.app import create_app  # noqa: E402
from service.rest.routing import Envelope  # noqa: E402
from service.settings import Settings  # noqa: E402


async def main(n: int) -> None:
    app = create_app(Settings(model_repository="model_repository", grpc_port=0,
                              log_level="warning"))
    task, inbox = await _started(app)
    envelope = app
    while not isinstance(envelope, Envelope):
        envelope = getattr(envelope, "app", None) or envelope.envelope
    direct = envelope.direct
    path = "/v1/models/digits-mlp:predict"
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", b"100")]
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "",
             "headers": headers}
    direct.match(scope, path)
    assert direct.begin_trace(scope) is None
    mode = os.environ.get("COUNT_WHAT", "begin_trace")

    def nothing(scope: dict) -> None:
        return None

    call = direct.begin_trace if mode == "begin_trace" else nothing
    subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True,
                   capture_output=True)
    for _ in range(n):
        call(scope)
    subprocess.run(["callgrind_control", "--instr=off", str(os.getpid())], check=True,
                   capture_output=True)
    await inbox.put({"type": "lifespan.shutdown"})
    await task


asyncio.run(main(int(sys.argv[1])))
