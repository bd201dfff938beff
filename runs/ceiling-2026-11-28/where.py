"""Where a small request's work goes in a real server process: the floors' and the service's.

    python runs/ceiling-2026-11-28/where.py count   TARGET REQUESTS CONCURRENCY OUT
    python runs/ceiling-2026-11-28/where.py profile TARGET REQUESTS CONCURRENCY OUT
    python runs/ceiling-2026-11-28/where.py cpu     TARGET REQUESTS CONCURRENCY OUT

run from a checkout's root, with model_repository/ beside it. TARGET is one of asgi-floor
(bench.floor's pure ASGI app on stock uvicorn, make bench's "asgi floor"), floor-served
(bench.floor's FastAPI floor on the service's own protocol), v1, v2-json, grpc (the service,
digits-mlp, batching on, one worker), grpc-floor (bench.floor's constant gRPC answer).

The server runs in its own process, as make bench runs it; a client in this process (asyncio,
keep-alive connections, or one grpc.aio channel) keeps CONCURRENCY requests in flight, warms
the server with REQUESTS / 4, then measures REQUESTS.

``count``: the server runs under callgrind with instrumentation off, turned on
(``callgrind_control``) for the measured requests only; prints instructions per request, the
part of them in each shared object (the interpreter, httptools, uvloop, numpy, onnxruntime ...)
and, for the service, the mean batch. Under callgrind the server is some 50 times slower than
the client, so it is saturated: what it counts is what a request costs at the throughput
ceiling. ``profile``: the server runs natively under cProfile (loop thread only), switched on
and off by SIGUSR1 / SIGUSR2 around the measured requests; prints self time per request
grouped by stage (``STAGES``). cProfile's cost per Python call inflates call-heavy stages, so
its shares split the interpreter's lump; the instruction counts give the totals. ``cpu``: the
server natively, no profiler; its user and system CPU time per request (``/proc/PID/stat``),
for the kernel's part (socket reads and writes, epoll), which callgrind does not see.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import os
import pstats
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(target: str, port: int, grpc_port: int) -> tuple[list[str], dict[str, str]]:
    env = {
        "GELU_MODEL_REPOSITORY": "model_repository",
        "GELU_LOG_LEVEL": "warning",
        "GELU_DRAIN_SECONDS": "0",
        "GELU_BATCHING": "true",
        "GELU_GRPC_PORT": str(grpc_port),
        # Timed at start-up, the inline bound would read valgrind's slowness: keep the runs
        # on the loop, where they are natively (digits-mlp's batches run in tens of µs).
        "GELU_INLINE_MAX_US": "1000000",
        "GELU_COMPILE_ACTIVATIONS": "false",
        # Under callgrind a queue's 10 s deadline passes (503) before a warm-up's batches run;
        # the deadline is still checked, only later.
        "GELU_DEFAULT_TIMEOUT_US": "600000000",
        "GELU_HEADER_TIMEOUT_SECONDS": "600",
        "GELU_BODY_TIMEOUT_SECONDS": "600",
    }
    if target == "asgi-floor":
        args = ["-m", "uvicorn", "--factory", "bench.floor:create_asgi_app", "--port", str(port),
                "--no-access-log", "--log-level", "warning"]  # fmt: skip
    elif target == "floor-served":
        args = ["-m", "bench.floor", "--http", str(port)]
    elif target == "grpc-floor":
        args = ["-m", "bench.floor", str(grpc_port)]
    else:
        args = ["-m", "cli", "serve", "--port", str(port), "--workers", "1"]
    return args, env


def requests_for(target: str) -> tuple[bytes, str]:
    """The raw request (HTTP/1.1 bytes, or the gRPC message) and the gRPC method."""
    from bench.measure import requests_for as bodies
    from bench.measure import sample_inputs as sample

    small = bodies("digits-mlp", sample(64))
    if target.startswith("grpc"):
        return small["grpc"].body, "/inference.GRPCInferenceService/ModelInfer"
    kind = "v2-json" if target == "v2-json" else "v1"
    path = "/floor" if "floor" in target else small[kind].path
    body = small[kind].body
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body, ""


async def drive_http(port: int, raw: bytes, requests: int, concurrency: int) -> None:
    async def user(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
        writer.close()

    share = -(-requests // concurrency)
    await asyncio.gather(*(user(share) for _ in range(concurrency)))


async def drive_grpc(port: int, body: bytes, method: str, requests: int, concurrency: int) -> None:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(method)

        async def user(count: int) -> None:
            for _ in range(count):
                await call(body, timeout=600)

        share = -(-requests // concurrency)
        await asyncio.gather(*(user(share) for _ in range(concurrency)))


def drive(target: str, port: int, grpc_port: int, requests: int, concurrency: int) -> None:
    raw, method = requests_for(target)
    if method:
        asyncio.run(drive_grpc(grpc_port, raw, method, requests, concurrency))
    else:
        asyncio.run(drive_http(port, raw, requests, concurrency))


def batches(port: int) -> tuple[float, float]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    samples = runs = 0.0
    for line in text.splitlines():
        if line.startswith("gelu_batch_size_sum{"):
            samples += float(line.rsplit(" ", 1)[1])
        elif line.startswith("gelu_batch_size_count{"):
            runs += float(line.rsplit(" ", 1)[1])
    return samples, runs


def wait_ready(target: str, port: int, grpc_port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            probe = grpc_port if target == "grpc-floor" else port
            with socket.create_connection(("127.0.0.1", probe), timeout=1):
                pass
            if target in ("v1", "v2-json", "grpc"):
                import http.client

                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("GET", "/v2/health/ready")
                ok = conn.getresponse().status == 200
                conn.close()
                if not ok:
                    raise OSError
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("not ready")


def run(mode: str, target: str, requests: int, concurrency: int, out: Path) -> None:
    port = grpc_port = free_port()
    while grpc_port == port:  # the kernel may hand a closed port out again
        grpc_port = free_port()
    args, env = command(target, port, grpc_port)
    if mode == "count":
        prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=yes",
                  f"--callgrind-out-file={out}"]  # fmt: skip
        argv = [*prefix, PY, *args]
    elif mode == "cpu":
        argv = [PY, *args]
    else:
        argv = [PY, str(HERE / "where.py"), "serve-profiled", str(out), *args]
    log = open(f"{out}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=log)
    service = target in ("v1", "v2-json", "grpc")
    try:
        wait_ready(target, port, grpc_port, process)
        drive(target, port, grpc_port, max(requests // 4, concurrency), concurrency)
        before = batches(port) if service else (0.0, 0.0)
        toggle(mode, process.pid, True)
        cpu, began = cpu_times(process.pid), time.perf_counter()
        drive(target, port, grpc_port, requests, concurrency)
        took = time.perf_counter() - began
        cpu = [b - a for a, b in zip(cpu, cpu_times(process.pid), strict=True)]
        toggle(mode, process.pid, False)
        after = batches(port) if service else (0.0, 0.0)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=600)
        log.close()
    served = -(-requests // concurrency) * concurrency
    load = os.getloadavg()[0]
    print(f"# {mode} {target} {served} requests at c={concurrency}, {took:.1f} s, load {load:.1f}")
    if service:
        samples, runs = (a - b for a, b in zip(after, before, strict=True))
        print(f"mean batch {samples / runs:.1f}" if runs else "mean batch -")
    if mode == "count":
        report_objects(out, served)
    elif mode == "cpu":
        user, system = (t / served * 1e6 for t in cpu)
        print(f"cpu µs/request {user + system:.1f}: user {user:.1f}, system {system:.1f}")
    else:
        report_stages(out, served)


def cpu_times(pid: int) -> list[float]:
    """The process's user and system CPU seconds so far (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return [int(fields[11]) / tick, int(fields[12]) / tick]


def toggle(mode: str, pid: int, on: bool) -> None:
    if mode == "cpu":
        return
    if mode == "count":
        subprocess.run(["callgrind_control", f"--instr={'on' if on else 'off'}", str(pid)],
                       check=True, capture_output=True)  # fmt: skip
    else:
        os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)
        time.sleep(1)  # the stats written


def objects(profile: Path) -> tuple[int, collections.Counter[str]]:
    """The totals line of a callgrind profile and its self cost per shared object (a call's
    line, inclusive, is the callee's and skipped)."""
    names: dict[str, str] = {}
    ob, skip, total = "?", False, 0
    by = collections.Counter[str]()
    for line in profile.read_text(errors="replace").splitlines():
        if line.startswith("ob="):
            found = re.match(r"ob=\((\d+)\)(?: (.*))?", line)
            if found:
                if found.group(2):
                    names[found.group(1)] = found.group(2)
                ob = names.get(found.group(1), "?")
            else:
                ob = line[3:]
        elif line.startswith("cob="):  # names an object too (compressed: named once)
            found = re.match(r"cob=\((\d+)\) (.*)", line)
            if found:
                names[found.group(1)] = found.group(2)
        elif line.startswith("calls="):
            skip = True
        elif line.startswith("totals:"):
            total = int(line.split()[1])
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip:
                skip = False
                continue
            parts = line.split()
            if len(parts) > 1:
                by[ob] += int(parts[1])
    return total, by


OBJECTS = (  # shared object -> what it is
    ("httptools", "httptools (HTTP parsing)"),
    ("uvloop", "uvloop (event loop)"),
    ("_asyncio", "asyncio C"),
    ("_json", "json C (decode/encode)"),
    ("orjson", "json C (decode/encode)"),
    ("numpy", "numpy"),
    ("onnxruntime", "onnxruntime"),
    ("cygrpc", "grpc core"),
    ("grpc", "grpc core"),
    ("protobuf", "protobuf"),
    ("_message", "protobuf"),
    ("pydantic", "pydantic-core"),
    ("libc.so", "libc"),
    ("libm.so", "libc"),
    ("ld-linux", "libc"),
    ("libstdc++", "libstdc++"),
    ("python", "CPython interpreter"),
)


def report_objects(out: Path, served: int) -> None:
    total, by = objects(out)
    grouped = collections.Counter[str]()
    for name, cost in by.items():
        base = name.rsplit("/", 1)[-1]
        what = next((w for key, w in OBJECTS if key in base or key in name), f"other: {base}")
        grouped[what] += cost
    print(f"instructions/request {total / served:.0f}")
    for what, cost in grouped.most_common():
        print(f"{cost / served:10.0f} {cost / total:6.1%}  {what}")


STAGES = (  # (a profiled function's file or name contains, the stage it is in), first match
    ("onnxruntime", "onnxruntime run"),
    ("service/onnxrt.py", "onnxruntime run"),
    ("service/runtime.py", "onnxruntime run"),
    ("service/batching.py", "batcher"),
    ("httptools.parser", "HTTP parsing (httptools/h11)"),
    ("h11/", "HTTP parsing (httptools/h11)"),
    ("transport", "socket I/O (transport write/close, syscalls)"),
    ("uvicorn/protocols", "HTTP server (protocol)"),
    ("service/rest/protocol.py", "HTTP server (protocol)"),
    ("service/rest/connection.py", "HTTP server (protocol)"),
    ("service/rest/server.py", "HTTP server (protocol)"),
    ("uvicorn/", "HTTP server (protocol)"),
    ("bench/floor.py", "app (floor)"),
    ("service/rest/middleware.py", "envelope (auth, metrics, log, trace)"),
    ("service/auth.py", "envelope (auth, metrics, log, trace)"),
    ("service/metrics.py", "envelope (auth, metrics, log, trace)"),
    ("service/logs.py", "envelope (auth, metrics, log, trace)"),
    ("service/tracing.py", "envelope (auth, metrics, log, trace)"),
    ("service/trace_settings.py", "envelope (auth, metrics, log, trace)"),
    ("service/alarm.py", "envelope (auth, metrics, log, trace)"),
    ("prometheus_client", "envelope (auth, metrics, log, trace)"),
    ("logging/", "envelope (auth, metrics, log, trace)"),
    ("opentelemetry", "envelope (auth, metrics, log, trace)"),
    ("service/rest/routing.py", "ASGI routing (service/rest)"),
    ("service/rest/app.py", "ASGI routing (service/rest)"),
    ("starlette", "ASGI routing (Starlette/FastAPI)"),
    ("fastapi", "ASGI routing (Starlette/FastAPI)"),
    ("service/codecs.py", "codec (JSON/proto <-> numpy)"),
    ("service/rest/v1.py", "codec (JSON/proto <-> numpy)"),
    ("service/rest/v2.py", "codec (JSON/proto <-> numpy)"),
    ("service/rest/body.py", "codec (JSON/proto <-> numpy)"),
    ("service/rest/schemas.py", "codec (JSON/proto <-> numpy)"),
    ("service/grpc/codec.py", "codec (JSON/proto <-> numpy)"),
    ("json", "codec (JSON/proto <-> numpy)"),
    ("numpy", "codec (JSON/proto <-> numpy)"),
    ("google/protobuf", "codec (JSON/proto <-> numpy)"),
    ("SerializeToString", "codec (JSON/proto <-> numpy)"),
    ("FromString", "codec (JSON/proto <-> numpy)"),
    ("ParseFromString", "codec (JSON/proto <-> numpy)"),
    ("service/grpc/", "gRPC face (servicer)"),
    ("grpc", "gRPC server (grpcio)"),
    ("service/dataplane.py", "core (lookup, checks)"),
    ("service/inference.py", "core (lookup, checks)"),
    ("service/repository", "core (lookup, checks)"),
    ("service/cache.py", "core (lookup, checks)"),
    ("service/statistics.py", "core (lookup, checks)"),
    ("service/control.py", "core (lookup, checks)"),
    ("asyncio", "event loop (asyncio/uvloop)"),
    ("uvloop", "event loop (asyncio/uvloop)"),
    ("run_until_complete", "event loop (asyncio/uvloop)"),
    ("run_forever", "event loop (asyncio/uvloop)"),
    ("contextvars", "event loop (asyncio/uvloop)"),
)


def stage_of(key: tuple[str, int, str]) -> str:
    filename, _, name = key
    where = f"{filename}:{name}"
    return next((stage for part, stage in STAGES if part in where), f"other: {where}")


def report_stages(out: Path, served: int) -> None:
    """Self time per request by stage; a builtin's (len, dict.get ...) is its callers', shared
    by their calls; then the functions that take most."""
    stats = pstats.Stats(str(out))
    by, calls = collections.Counter[str](), collections.Counter[str]()
    other = collections.Counter[str]()
    for key, (_, ncalls, tottime, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(key)
        shares = [(stage, tottime)]
        if stage.startswith("other: ") and key[0] == "~" and callers:
            whole = sum(c[1] for c in callers.values()) or 1
            shares = [(stage_of(k), tottime * c[1] / whole) for k, c in callers.items()]
        for where, cost in shares:
            if where.startswith("other: "):
                other[where] += cost
                where = "other"
            by[where] += cost
        calls[stage if not stage.startswith("other: ") else "other"] += ncalls
    total = sum(by.values())
    print(f"profiled µs/request {total / served * 1e6:.1f} (cProfile's cost included)")
    for stage, cost in by.most_common():
        print(f"{cost / served * 1e6:8.1f} µs {cost / total:6.1%} {calls[stage] / served:7.1f} calls  {stage}")
    for stage, cost in other.most_common(6):
        print(f"{'':8} {cost / served * 1e6:8.2f} µs  {stage}")
    print("# the functions with the most self time, µs/request (self, cumulative) and calls/request")
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:20]  # type: ignore[attr-defined]
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in top:
        short = re.sub(r".*/(site-packages|python3\.11)/", "", filename).replace(os.getcwd() + "/", "")
        print(f"{tottime / served * 1e6:8.1f} {cumtime / served * 1e6:8.1f} {ncalls / served:6.1f}  {short}:{line}({name})")


def serve_profiled(out: str, args: list[str]) -> None:
    """The server (``python -m MODULE ARGS``) under a cProfile that SIGUSR1 starts and SIGUSR2
    stops and writes to ``out``."""
    import runpy

    # The thread's CPU time: on a loaded host a wall clock would charge other processes'
    # turns to whatever function was running when the loop thread lost the CPU.
    profiler = cProfile.Profile(time.thread_time)
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR2, stop)
    assert args[0] == "-m"
    sys.argv = [args[1], *args[2:]]
    sys.path.insert(0, os.getcwd())
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve-profiled":
        serve_profiled(sys.argv[2], sys.argv[3:])
    else:
        sys.path.insert(0, os.getcwd())
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
