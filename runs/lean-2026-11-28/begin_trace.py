"""Nanoseconds per call of the HTTP envelope's begin_trace, DirectRoutes.match and
TraceSettings.pick, in process (tracing on via the OTEL_* environment; see counts.txt).

    OTEL_TRACES_EXPORTER=console OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0 \
    OTEL_BSP_SCHEDULE_DELAY=3600000 python runs/lean-2026-11-28/begin_trace.py
"""
import asyncio, timeit, sys, os
sys.path.insert(0, os.getcwd())
from bench.asgi_path import _started
from service.rest.app import create_app
from service.settings import Settings
async def main():
    app = create_app(Settings(model_repository="model_repository", grpc_port=0, log_level="warning"))
    task, inbox = await _started(app)
    plane = app.state.dataplane
    from service.rest.routing import Envelope
    # find DirectRoutes
    env = app
    while not isinstance(env, Envelope):
        env = getattr(env, "app", None) or getattr(env, "envelope")
    direct = env.direct
    path = "/v1/models/digits-mlp:predict"
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"100")]
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers}
    direct.match(scope, path)
    n = 100000
    t = min(timeit.repeat(lambda: direct.begin_trace(scope), number=n, repeat=5))
    t0 = min(timeit.repeat(lambda: direct.match(scope, path), number=n, repeat=5))
    t1 = min(timeit.repeat(lambda: plane.trace_settings.pick("digits-mlp"), number=n, repeat=5))
    print(f"begin_trace {t/n*1e9:.0f} ns; match {t0/n*1e9:.0f} ns; pick {t1/n*1e9:.0f} ns")
    await inbox.put({"type": "lifespan.shutdown"}); await task
asyncio.run(main())
