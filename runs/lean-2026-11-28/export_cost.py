"""CPU per sampled request's trace in the exporting thread (its span and four stages, made
into ReadableSpans and exported over OTLP/HTTP to bench.otlp_sink), in process CPU time.

    python runs/lean-2026-11-28/export_cost.py [TRACES]
"""

import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.getcwd())


def main(count: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", str(port)])
    time.sleep(1)
    os.environ.update(OTEL_TRACES_SAMPLER="always_on", OTEL_BSP_SCHEDULE_DELAY="3600000",
                      OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                      OTEL_BSP_MAX_QUEUE_SIZE=str(4 * count))
    from service.tracing import Tracing, _exporter

    tracing = Tracing([_exporter("otlp")])

    def make(n: int) -> None:
        for _ in range(n):
            traced = tracing.sample("POST /v1/models/{name}:predict")
            assert traced is not None
            began = time.perf_counter_ns()
            traced.open(began, {"http.request.method": "POST", "url.path": "/v1/models/m:predict",
                                "http.route": "/v1/models/{name}:predict",
                                "triton.model_name": "m"})
            traced.since("decode", began)
            traced.ran(began, began, 10, None)
            traced.since("encode", began)
            traced.end(200, {"http.response.status_code": 200, "gelu.request_id": "r",
                             "triton.model_version": "2"}, time.perf_counter_ns())

    try:
        make(200)
        tracing.flush()
        began = time.process_time()
        make(count)
        tracing.flush()
        took = time.process_time() - began
        print(f"{took / count * 1e6:.1f} us of CPU per trace (made, queued, exported)")
    finally:
        tracing.shutdown()
        sink.terminate()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
