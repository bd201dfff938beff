"""``make bench``: the inference path under load, against the HTTP floor, the naive app and the
compute floor, every figure with the CPU it took.

In one run on this machine: start the service (batching on and off), the HTTP floor app (by stock
uvicorn, and as the service serves) and the naive app as real uvicorn processes, each pinned to one
core with every thread checked (see ``bench.proc``); drive them with wrk pinned to the other core
at each concurrency, recording requests/s, p50, p99, errors, the server's CPU use, the
hypervisor's steal (repeating points taken under high steal) and a probe's reading of the host's
speed (``bench.speed``) per point. Then two worker processes against one, the larger model where
batching matters, raw activation evaluation of 1e6 values against a 4 MB echo, onnxruntime's
in-process ``session.run`` (the compute floor) and where a request's time goes. Writes
``benchmarks.md``, ``benchmarks.json`` and ``benchmarks.png``. Absolute figures move with the
machine's neighbours; compare the ratios, which are taken within one run, each round counted
when the probe read the host at one speed for both of its points.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import http.client
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench import instructions
from bench.arguments import ACTIVATION_VALUES, ROOT
from bench.floor import GRPC_METHOD
from bench.grpc_load import STREAM_METHOD, run_grpc
from bench.proc import UsageMeter, check_pinned, cpu_list, cpu_model, paused, pin_tree
from bench.speed import HostSpeed, apart
from bench.wrk import Request, run_wrk
from contract.model_config import load_model_config

SMALL = "digits-mlp"

# Issue 10's targets, as ratios within one run.
TARGET_FLOOR_RATIO = 0.85  # small model, c=64, one process: each protocol against the floor
TARGET_TAIL_VS_FLOOR = 2.0  # its p99 against the floor's p99
TARGET_NAIVE_RATIO = 2.5  # V1 against the naive app, c=64, one process and two
SERVICE_APP = "service.rest.app:create_app"
GRPC_PREFIX = "grpc:"  # a Request whose path starts so is a gRPC call of that method
TARGET_WORKERS_GAIN = 1.8  # two workers on two cores against one on one
TARGET_BATCHING_GAIN = 4.0  # larger model, c=64: batching on against off
TARGET_ACTIVATION_RATIO = 0.8  # 1e6 float32 binary against the 4 MB echo, c=1 and c=4
# The in-process kernel row on arrays not in cache: this many copies of the body, in turn
# (32 MB of 1e6-value bodies; on this project's host arrays up to 8 MB stayed in cache).
COLD_ARRAYS = 8
TARGET_PEER_RATIO = 5.0  # V2 JSON against MLServer's V2 JSON, c=64, one process each
PEER_MLSERVER, PEER_BENTOML = "MLServer 1.7.1", "BentoML 1.4"
PEERS = (PEER_MLSERVER, PEER_BENTOML)
MAX_STEAL = 0.15  # cores; a point taken under more is measured again
HOST_MATCH = 1.15  # two points whose probe readings (bench.speed) differ by more: not one speed
ATTEMPTS = 3
# What a run measures; a change elsewhere (docs, README, tests) leaves it the commit's run.
CODE = ("service", "bench", "contract", "export", "models", "cli.py", "pyproject.toml")
T = TypeVar("T")


@dataclass
class Results:
    """Everything one run measured, as written to benchmarks.json."""

    environment: dict[str, Any]
    http: list[dict[str, Any]] = field(default_factory=list)
    compute: dict[str, Any] = field(default_factory=dict)
    activations: list[dict[str, Any]] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, float] = field(default_factory=dict)  # ms per activation call, in process
    instructions: dict[str, float] = field(default_factory=dict)  # per request, by state

    def find(self, rows: list[dict[str, Any]], scenario: str, concurrency: int) -> dict[str, Any]:
        """The row of ``scenario`` at ``concurrency``; empty when it was not measured."""
        return next(
            (r for r in rows if r["scenario"] == scenario and r["concurrency"] == concurrency), {}
        )

    def rps(self, scenario: str, concurrency: int) -> float:
        return float(self.find(self.http, scenario, concurrency).get("rps", float("nan")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Every server process alive in this run; all but the one measured are paused at each point.
LIVE: set[int] = set()


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it, its process, and the CPUs all its threads use."""

    url: str
    pid: int
    cpus: set[int]
    grpc: str | None = None  # host:port of its gRPC face, if it has one
    batches: bool = False  # the service: its /metrics counts the samples and runs of batches


Scenario = tuple[str, Server, Request]  # a point's name, the server driven and the request


def batch_totals(target: Server) -> tuple[float, float]:
    """(samples, runs) the service's models have run so far, from ``gelu_batch_size``'s sums
    and counts on its /metrics (over every worker)."""
    conn = http.client.HTTPConnection(target.url.removeprefix("http://"), timeout=30)
    conn.request("GET", "/metrics")
    samples = runs = 0.0
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("gelu_batch_size_sum{"):
            samples += float(line.rsplit(" ", 1)[1])
        elif line.startswith("gelu_batch_size_count{"):
            runs += float(line.rsplit(" ", 1)[1])
    conn.close()
    return samples, runs


@contextmanager
def server(
    app: str, env: dict[str, str], workers: int, cpus: str, ready_path: str
) -> Iterator[Server]:
    """A uvicorn process serving ``app`` (see ``serve``); the service itself runs as it is
    deployed, ``gelu-serve serve`` (uvicorn with the service's connection limits)."""
    port = _free_port()
    command = [
        sys.executable, "-m", "uvicorn", "--factory", app, "--port", str(port),
        "--workers", str(workers), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    grpc_address = None
    if app == SERVICE_APP:
        command = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
        command += ["--workers", str(workers)]
        grpc_port = _free_port()
        env = {**env, "GELU_GRPC_PORT": str(grpc_port)}
        grpc_address = f"127.0.0.1:{grpc_port}"
    with serve(command, env, cpus, port, ready_path, settle=0.5 * workers) as started:
        yield dataclasses.replace(started, grpc=grpc_address, batches=app == SERVICE_APP)


FLOOR_AS_SERVED = "http floor, served as the service serves"
FLOOR_AS_SERVED_TWO = f"{FLOOR_AS_SERVED}, --workers 2"
FLOOR_AS_SERVED_ONE = f"{FLOOR_AS_SERVED}, --workers 1"  # the 2-worker rows' twin
TWO_WORKERS = "v1 predict, gelu-serve serve --workers 2"
ONE_WORKER = "v1 predict, gelu-serve serve --workers 1"  # the 2-worker rows' twin
TWO_WORKERS_OFF = "v1 predict, batching off, gelu-serve serve --workers 2"
ONE_WORKER_OFF = "v1 predict, batching off, gelu-serve serve --workers 1"
ECHO_AS_SERVED = "echo floor, served as the service serves"
# A second server as batching off's, driven right after it: how far apart two identical servers
# measure, beside the ratio of batching on and off, which at c=1 run the same path.
OFF_AGAIN = "v1 predict, batching off, a second server"


@contextmanager
def floor_as_served(cpus: str, workers: int = 1) -> Iterator[Server]:
    """``bench.floor``'s HTTP floor with the service's own uvicorn protocol and options (and,
    with several workers, its own ``SO_REUSEPORT`` socket each, as the service's)."""
    port = _free_port()
    command = [sys.executable, "-m", "bench.floor", "--http", str(port), str(workers)]
    with serve(command, {}, cpus, port, "/docs", settle=0.5 * workers) as started:
        yield started


@contextmanager
def grpc_floor(cpus: str) -> Iterator[Server]:
    """``bench.floor``'s gRPC floor on ``cpus``, answering (every thread pinned there)."""
    import grpc

    port = _free_port()
    command = ["taskset", "-c", cpus, sys.executable, "-m", "bench.floor", str(port)]
    process = subprocess.Popen(command, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        pinned = cpu_list(cpus)
        pin_tree(process.pid, pinned)
        LIVE.add(process.pid)
        yield Server("", process.pid, pinned, address)
    finally:
        LIVE.discard(process.pid)
        process.terminate()
        process.wait(timeout=30)


def drive(
    target: Server, request: Request, connections: int, seconds: float, cpu: int | None
) -> dict[str, Any]:
    """One point of load on ``target``: wrk for HTTP, ``bench.grpc_load`` for gRPC requests
    (their path is ``grpc:`` and the method)."""
    if request.path.startswith(GRPC_PREFIX):
        assert target.grpc is not None, "a gRPC request to a server without gRPC"
        method = request.path.removeprefix(GRPC_PREFIX)
        return run_grpc(target.grpc, method, request.body, connections, seconds, cpu)
    return run_wrk(target.url, request, connections, seconds, cpu)


@contextmanager
def serve(
    command: list[str], env: dict[str, str], cpus: str, port: int, ready_path: str, settle: float
) -> Iterator[Server]:
    """``command`` on ``cpus`` with every thread pinned there, ready; SIGTERM on exit.

    ``taskset`` pins the threads that exist at start; onnxruntime sets its thread pools'
    affinity itself, and servers start worker processes, so every thread of the process tree is
    pinned again once the server is ready (and checked before each point by ``measure``).
    """
    process = subprocess.Popen(
        ["taskset", "-c", cpus, *command], cwd=ROOT, env={**os.environ, **env}
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", ready_path)
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command[0]} not ready")
            time.sleep(0.2)
        time.sleep(settle)  # let every worker finish its start-up
        pinned = cpu_list(cpus)
        pin_tree(process.pid, pinned)
        LIVE.add(process.pid)
        yield Server(f"http://127.0.0.1:{port}", process.pid, pinned)
    finally:
        LIVE.discard(process.pid)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def peers(model_file: Path, max_batch_size: int, cpus: str) -> Iterator[dict[str, Server]]:
    """MLServer and BentoML serving ``model_file`` on ``cpus``, by name."""
    from bench.peers.environments import bentoml_command, mlserver_command

    ml_port, bento_port = _free_port(), _free_port()
    side_ports = (_free_port(), _free_port())
    bento, bento_env = bentoml_command(model_file, bento_port, max_batch_size)
    with (
        mlserver_command(SMALL, model_file, ml_port, max_batch_size, side_ports) as (ml, ml_env),
        serve(ml, ml_env, cpus, ml_port, "/v2/health/ready", settle=1.0) as mlserver,
        serve(bento, bento_env, cpus, bento_port, "/readyz", settle=1.0) as bentoml,
    ):
        yield {"mlserver": mlserver, "bentoml": bentoml}


def measure(
    target: Server,
    request: Request,
    connections: int,
    seconds: float,
    client_cpu: int | None,
    host: HostSpeed | None = None,
) -> dict[str, Any]:
    """One wrk point with the server's CPU use, the steal and (given ``host``) the probe's
    readings on the server's CPUs (``host_ms``); measured again (up to ``ATTEMPTS`` times)
    while the steal exceeds ``MAX_STEAL`` cores, keeping the least stolen. Every other server
    of the run is paused meanwhile (see ``paused``)."""
    best: dict[str, Any] = {}
    for attempt in range(1, ATTEMPTS + 1):
        threads = check_pinned(target.pid, target.cpus)
        with paused(pid for pid in LIVE if pid != target.pid):
            before = batch_totals(target) if target.batches else (0.0, 0.0)
            meter = UsageMeter(target.pid)
            meter.start()
            start = time.monotonic()
            row = drive(target, request, connections, seconds, client_cpu)
            host_ms = host.during(target.cpus, start, time.monotonic()) if host else {}
            usage = meter.stop()
            if target.batches:  # the mean batch the point's requests ran in
                samples, runs = (a - b for a, b in zip(batch_totals(target), before, strict=True))
                row["mean_batch"] = samples / runs if runs else 0.0
        row.update(
            server_cores=usage.server_cores,
            steal_cores=usage.steal_cores,
            server_threads=threads,
            attempts=attempt,
            cpu_us_per_request=usage.server_cores / row["rps"] * 1e6 if row["rps"] else 0.0,
            preempted_per_request=usage.preemptions / row["requests"] if row["requests"] else 0.0,
            host_ms=host_ms,
            server_pid=target.pid,
        )
        if not best or usage.steal_cores < best["steal_cores"]:
            best = row
        if usage.steal_cores <= MAX_STEAL:
            break
    best["attempts"] = attempt
    return best


def probe_text(row: dict[str, Any]) -> str:
    """A point's probe readings (``bench.speed``), CPU by CPU: ``0.57`` or ``0.57 / 0.93``."""
    readings = row.get("host_ms", {})
    return " / ".join(f"{readings[cpu]:.2f}" for cpu in sorted(readings))


def median_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario and concurrency: the round of median requests/s (the lower
    middle one for an even count), with every round's requests/s in ``rounds_rps`` and p99 in
    ``rounds_p99_ms``, and the errors of all rounds together in ``rounds_errors``."""
    taken: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        taken.setdefault((row["scenario"], row["concurrency"]), []).append(row)
    kept = []
    for measured in taken.values():
        ordered = sorted(measured, key=lambda r: r["rps"])
        median = ordered[(len(ordered) - 1) // 2]
        kept.append({
            **median,
            "rounds_rps": [r["rps"] for r in measured],
            "rounds_p99_ms": [r["p99_ms"] for r in measured],
            "rounds_errors": sum(r["errors"] for r in measured),
            "rounds_host_ms": [r.get("host_ms", {}) for r in measured],
            "rounds_server_pid": [r["server_pid"] for r in measured],
        })  # fmt: skip
    return kept


def sample_inputs(n_features: int) -> np.ndarray:
    """Real samples when the model's data is at hand (digits), else a fixed random batch."""
    if n_features == 64:
        from sklearn.datasets import load_digits

        return (load_digits().data[:1] / 16.0).astype(np.float32)
    return np.random.default_rng(0).random((1, n_features), dtype=np.float32)


def requests_for(model: str, x: np.ndarray) -> dict[str, Request]:
    """V1 JSON, V2 JSON, V2 binary and V2 gRPC (raw contents; as ModelInfer calls, and on one
    ModelStreamInfer call) requests carrying ``x``."""
    from service.grpc import inference_pb2 as pb

    grpc_request = pb.ModelInferRequest(model_name=model)
    grpc_request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    grpc_request.raw_input_contents.append(x.astype("<f4").tobytes())
    json_headers = {"Content-Type": "application/json"}
    v2_input = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    header = json.dumps(
        {
            "inputs": [{**v2_input, "parameters": {"binary_data_size": x.nbytes}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return {
        "v1": Request(
            f"/v1/models/{model}:predict",
            json.dumps({"instances": x.tolist()}).encode(),
            json_headers,
        ),
        "v2-json": Request(
            f"/v2/models/{model}/infer",
            json.dumps({"inputs": [{**v2_input, "data": x.ravel().tolist()}]}).encode(),
            json_headers,
        ),
        "v2-binary": Request(
            f"/v2/models/{model}/infer",
            header + x.astype("<f4").tobytes(),
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(header)),
            },
        ),
        "grpc": Request(GRPC_PREFIX + GRPC_METHOD, grpc_request.SerializeToString(), {}),
        "grpc-stream": Request(GRPC_PREFIX + STREAM_METHOD, grpc_request.SerializeToString(), {}),
    }


def compute_floor(model_path: Path, seconds: float) -> dict[str, Any]:
    """onnxruntime ``session.run`` in this process: calls/s at batch 1, samples/s at 64."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (tensor,) = session.get_inputs()
    result: dict[str, Any] = {"model": model_path.parent.parent.name}
    for batch in (1, 64):
        x = np.random.default_rng(0).random((batch, *tensor.shape[1:]), dtype=np.float32)
        times = []
        deadline = time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            session.run(None, {tensor.name: x})
            times.append(time.perf_counter() - start)
        per_call = float(np.median(times))
        result[f"batch{batch}_calls_per_s"] = 1 / per_call
        result[f"batch{batch}_p50_us"] = per_call * 1e6
        result[f"batch{batch}_p99_us"] = float(np.percentile(times, 99)) * 1e6
        result[f"batch{batch}_samples_per_s"] = batch / per_call
    return result


def ensure_models(repository: Path, large: bool) -> str:
    """Build the defaults (and the large model when its data is here); returns the large one."""
    from export.defaults import BENCH_MODEL, DEFAULT_MODELS, DefaultModel, build
    from models.data import FASHION_MNIST_DIR

    models: tuple[DefaultModel, ...] = DEFAULT_MODELS
    if large and not FASHION_MNIST_DIR.is_dir():
        print(
            f"{FASHION_MNIST_DIR} missing: the autoencoder stands in for the larger model "
            "(install Debian's dataset-fashion-mnist for the real one)"
        )
    elif large:
        models = (*DEFAULT_MODELS, BENCH_MODEL)
    build(repository, ROOT / "checkpoints", models)
    return BENCH_MODEL.name if BENCH_MODEL in models else "digits-autoencoder"


def environment(args: argparse.Namespace, command: str) -> dict[str, Any]:
    import fastapi
    import onnxruntime
    import uvicorn

    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores of {cpu_model()}, "
        f"{platform.platform()}",
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "wrk": (wrk.stdout or wrk.stderr).splitlines()[0],
        "server_cpus": args.server_cpus,
        "client_cpu": args.client_cpu,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "activation_values": args.activation_values,
        "commit": revision(),
    }


def revision() -> str | None:
    """The checkout's short commit, with "+changes" when the code differs from it; None
    outside a git checkout."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no", "--", *CODE],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    return head.stdout.strip() + ("+changes" if changed.strip() else "")


def activation_requests(values: int) -> dict[str, Request]:
    """The activation endpoint's binary and JSON forms, and the echo of the same bytes."""
    x = np.linspace(-5, 5, values, dtype="<f4")
    octet = {"Content-Type": "application/octet-stream"}
    return {
        "echo": Request("/echo", x.tobytes(), octet),
        "binary": Request("/v1/activations/gelu", x.tobytes(), octet),
        "native": Request("/v1/activations/gelu?kernel=native", x.tobytes(), octet),
        "json": Request(
            "/v1/activations/gelu",
            json.dumps({"data": x.tolist()}).encode(),
            {"Content-Type": "application/json"},
        ),
    }


def breakdown(repository: Path, seconds: float) -> dict[str, float]:
    """Where one small request's time goes in the serving core, in µs, timed in process with
    no HTTP: each codec, the checks, the run at batch 1 and per sample at batch 64, and the
    whole ``DataPlane.infer`` (batching off, so no event-loop hand-off)."""
    from service import codecs
    from service.dataplane import DataPlane
    from service.settings import Settings

    x = sample_inputs(64)
    bodies = requests_for(SMALL, x)
    binary = bodies["v2-binary"]
    header_length = binary.headers["Inference-Header-Content-Length"]
    per_call = seconds / 20

    def timed(function: Callable[[], object]) -> float:
        function()
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < per_call:
            function()
            calls += 1
        return elapsed / max(calls, 1) * 1e6

    async def measure_core() -> dict[str, float]:
        plane = DataPlane(Settings(model_repository=repository, batching=False, log_level="error"))
        await plane.start()
        try:
            model = plane.model(SMALL)
            request = codecs.decode_v1(bodies["v1"].body)
            result = await plane.infer(SMALL, None, request)
            v2 = codecs.decode_v2(bodies["v2-json"].body, None)
            v2_result = await plane.infer(SMALL, None, v2)
            feed = {"input": x}
            feed64 = {"input": np.repeat(x, 64, axis=0)}
            loop_calls = 2000
            start = time.perf_counter()
            for _ in range(loop_calls):
                await plane.infer(SMALL, None, request)
            infer_us = (time.perf_counter() - start) / loop_calls * 1e6
            return {
                "decode v1 JSON": timed(lambda: codecs.decode_v1(bodies["v1"].body)),
                "decode v2 JSON": timed(lambda: codecs.decode_v2(bodies["v2-json"].body, None)),
                "decode v2 binary": timed(lambda: codecs.decode_v2(binary.body, header_length)),
                "check inputs": timed(lambda: plane._check_inputs(model, request.inputs)),
                "onnxruntime run, batch of 1": timed(lambda: model.infer(feed)),
                "onnxruntime run, per sample in a batch of 64": timed(lambda: model.infer(feed64))
                / 64,
                "encode v1": timed(lambda: codecs.encode_v1(result)),
                "encode v2 JSON": timed(lambda: codecs.encode_v2(v2_result)),
                "DataPlane.infer (check, run, result), batch of 1": infer_us,
            }
        finally:
            await plane.stop()

    return asyncio.run(measure_core())


def activation_kernels(values: int) -> dict[str, float]:
    """What the activation rows' evaluation costs in process: ms for one call of each kernel
    on the activation rows' ``values`` (gelu; the median of 15), and a copy of the array. The
    accurate kernel also on copies of the array in turn, as a server at concurrency evaluates
    a body received a while ago: for 1e6 values, 32 MB, no longer in cache."""
    from bench.accuracy import evaluator
    from service.activations import NATIVE
    from service.runtime import median_us

    x = np.frombuffer(activation_requests(values)["binary"].body, "<f4")
    compiled, graphs = evaluator(compile=True), evaluator(compile=False)
    cold = itertools.cycle([x.copy() for _ in range(COLD_ARRAYS)])
    copies = f"{COLD_ARRAYS} copies of the array in turn ({COLD_ARRAYS * x.nbytes / 1e6:.3g} MB)"
    calls: dict[str, Callable[[], object]] = {
        f"accurate, {compiled.accurate}": lambda: compiled.evaluate("gelu", x),
        f"accurate, compiled, on {copies}": lambda: compiled.evaluate("gelu", next(cold)),
        "accurate, onnxruntime float64 graphs (GELU_COMPILE_ACTIVATIONS=false)": lambda: (
            graphs.evaluate("gelu", x)
        ),
        "native (onnxruntime's Gelu, float32)": lambda: compiled.evaluate("gelu", x, False, NATIVE),
        "a copy of the array (numpy)": x.copy,
    }
    return {name: median_us(call, runs=15) / 1000 for name, call in calls.items()}


def run(args: argparse.Namespace) -> Results:
    """Every measurement, in one run."""
    repository = Path(args.repository).resolve()
    large = ensure_models(repository, large=not args.smoke)
    command = "gelu-serve bench " + " ".join(a for a in sys.argv[1:] if a != "bench")
    results = Results(environment(args, command))
    every_cpu = ",".join(map(str, sorted(os.sched_getaffinity(0))))  # before pinning this one
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})  # this process: compute floor, breakdown
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    top = max(concurrencies)
    small = requests_for(SMALL, sample_inputs(64))
    big = requests_for(large, sample_inputs(64 if large == "digits-autoencoder" else 784))
    activation = activation_requests(args.activation_values)
    base_env = {
        "GELU_MODEL_REPOSITORY": str(repository),
        "GELU_LOG_LEVEL": "warning",
        "GELU_MAX_BODY_BYTES": str(64 << 20),
        "GELU_MAX_JSON_BYTES": str(64 << 20),  # the activation JSON point's body
        "GELU_DRAIN_SECONDS": "0",
        "GELU_GRPC_PORT": "0",
    }
    on_env, off_env = ({**base_env, "GELU_BATCHING": flag} for flag in ("true", "false"))
    naive_env = {"GELU_NAIVE_MODEL": str(repository / SMALL / "1" / "model.onnx")}
    service, ready = SERVICE_APP, "/v2/health/ready"

    host = HostSpeed(cpu_list(every_cpu))

    def point(
        name: str, target: Server, request: Request, c: int, rows: list[Any], pin: bool = True
    ) -> None:
        row = measure(target, request, c, args.seconds, args.client_cpu if pin else None, host)
        row.update(scenario=name, concurrency=c)
        rows.append(row)
        print(
            f"{name:42s} c={c:<3d} {row['rps']:7.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
            f"p99 {row['p99_ms']:6.2f} ms  errors {row['errors']}  server {row['server_cores']:.2f}"
            f" cores  preempted {row['preempted_per_request']:.3f}/request  "
            f"steal {row['steal_cores']:.2f}  probe {probe_text(row) or '?'} ms",
            flush=True,
        )

    # One process each, on one core (paused when not driven): the floors, the naive app and the
    # peers for the whole run, the service's servers for one pass each; at each concurrency
    # every scenario is driven back to back, so each ratio compares runs taken within a minute
    # or two, and batching on and off of one protocol one right after the other.
    cpus, workers = args.server_cpus, 1
    model_file = repository / SMALL / "1" / "model.onnx"
    small_config = load_model_config((repository / SMALL / "config.pbtxt").read_text())
    no_peers: dict[str, Server] = {}
    compared: AbstractContextManager[dict[str, Server]] = (
        peers(model_file, small_config.max_batch_size, cpus)
        if args.peers
        else nullcontext(no_peers)
    )

    def paired(
        on: Server, off: Server, again: Server
    ) -> tuple[list[list[Scenario]], list[Scenario]]:
        """The service's scenarios, in groups driven one right after the other (batching on and
        off of one protocol, in the other order every other pass: their ratio, the closest call
        of the targets at c=1, is taken between points seconds apart, and a drift of the
        machine's speed favours neither; V1's group drives a second batching-off server too,
        OFF_AGAIN), and as the report lists them: every "on" row, then every "off" one."""
        states = (("on", on), ("off", off))
        pairs = [
            [(f"{k} predict, batching {state}", target, small[k]) for state, target in states]
            for k in small
        ]
        twin = (OFF_AGAIN, again, small["v1"])
        listed = [pair[0] for pair in pairs] + [pair[1] for pair in pairs] + [twin]
        pairs[list(small).index("v1")].append(twin)
        if not args.smoke:
            pairs.append([
                (f"{large} v2-binary, batching on", on, big["v2-binary"]),
                (f"{large} v2-binary, batching off", off, big["v2-binary"]),
            ])  # fmt: skip
            listed += pairs[-1]
        return pairs, listed

    def warm(scenarios: list[Scenario]) -> None:
        """One unrecorded second for each server, with the first of its scenarios."""
        warmed: set[str] = set()
        for _, target, request in scenarios:
            if target.url not in warmed:
                drive(target, request, 8, 1, args.client_cpu)
                warmed.add(target.url)

    # The host's speed on every CPU, measured beside every point (bench.speed); only while
    # servers are driven: the in-process measurements after run on the client CPU.
    with host:
        with (
            compared as others,
            server("bench.floor:create_app", {}, workers, cpus, "/docs") as floor,
            floor_as_served(cpus) as floor_served,
            server("bench.naive:create_app", naive_env, workers, cpus, "/ready") as naive,
            grpc_floor(cpus) as floor_grpc,
        ):
            floor_request = Request("/floor", small["v1"].body, small["v1"].headers)
            alone = [
                ("http floor", floor, floor_request),
                (FLOOR_AS_SERVED, floor_served, floor_request),
                ("grpc floor", floor_grpc, small["grpc"]),
                ("naive app", naive, small["v1"]),
            ]
            if others:
                bento_request = Request("/predict", small["v1"].body, small["v1"].headers)
                alone += [
                    (f"{PEER_MLSERVER} v2-json", others["mlserver"], small["v2-json"]),
                    (f"{PEER_BENTOML}", others["bentoml"], bento_request),
                ]
            warm(alone)
            states = (on_env, off_env, off_env)  # batching on, off, and off again
            for round_index in range(args.rounds):  # whole passes: each point's rounds spread out
                # The service's three servers start afresh for each pass. Two identical servers
                # can differ by more than batching on and off do at c=1, for as long as both
                # run: ten fresh pairs of batching-off servers at c=1, six passes of 3 s each,
                # had medians of 0.90-1.02x (2026-11-26). With a pass's own processes, that
                # difference is one more pass's noise, for the median over the passes (and over
                # runs, bench.pool) to average, not one pair's for the whole run. It does not
                # make two identical servers measure alike: the first run so made read its
                # first batching-off server at 0.93x the second. Nor did two things tried
                # after, over fresh pairs of batching-off servers at c=1, six passes of 3 s
                # each (2026-11-26): one memory layout for every server (``setarch -R``,
                # PYTHONHASHSEED=0; ten pairs, log-ratio sd within a pair 0.104 against 0.087
                # as started here), and the CPUs kept from idling between requests (a
                # SCHED_IDLE spinner on each; five pairs, 0.087 against 0.093).
                with ExitStack() as stack:
                    arguments = [(service, env, workers, cpus, ready) for env in states]
                    on, off, again = started_in_turn(arguments, round_index, stack)
                    pairs, listed = paired(on, off, again)
                    scenarios = alone + listed
                    warm(listed)
                    driven = drive_order([[s] for s in alone] + pairs, round_index, args.rounds)
                    for c in concurrencies:
                        for name, target, request in driven:
                            point(name, target, request, c, results.http)
                    for c in (1, 4):
                        point("echo floor", floor, activation["echo"], c, results.activations)
                        point(ECHO_AS_SERVED, floor_served, activation["echo"], c,
                              results.activations)  # fmt: skip
                        point("gelu, float32 binary", on, activation["binary"], c,
                              results.activations)  # fmt: skip
                        point("gelu native, float32 binary", on, activation["native"], c,
                              results.activations)  # fmt: skip
                    point("gelu, JSON", on, activation["json"], 1, results.activations)
        if not args.smoke:  # two processes and wrk, all free to use every core
            port, port_off = _free_port(), _free_port()
            serve_two, serve_two_off = (
                [sys.executable, "-m", "cli", "serve", "--port", str(p), "--workers", "2"]
                for p in (port, port_off)
            )
            # Each 2-worker server beside a 1-worker twin, pinned as the rest, driven one right
            # after the other in each pass (in the other order every other pass): the ratio of two
            # against one is taken seconds apart, not a quarter of an hour.
            with (
                serve(serve_two, base_env, every_cpu, port, ready, settle=1.0) as started,
                server(service, on_env, 1, cpus, ready) as one,
                serve(serve_two_off, off_env, every_cpu, port_off, ready, settle=1.0) as two_off,
                server(service, off_env, 1, cpus, ready) as one_off,
                server("bench.naive:create_app", naive_env, 2, every_cpu, "/ready") as naive_two,
                server("bench.floor:create_app", {}, 2, every_cpu, "/docs") as floor_two,
                server("bench.floor:create_app", {}, 1, cpus, "/docs") as floor_one,
                floor_as_served(every_cpu, workers=2) as floor_served_two,
                floor_as_served(cpus) as floor_served_one,
            ):
                two = dataclasses.replace(started, batches=True)
                twins = [
                    [(TWO_WORKERS, two, small["v1"], False), (ONE_WORKER, one, small["v1"], True)],
                    [(TWO_WORKERS_OFF, two_off, small["v1"], False),
                     (ONE_WORKER_OFF, one_off, small["v1"], True)],
                    [("naive app, uvicorn --workers 2", naive_two, small["v1"], False)],
                    [("http floor, uvicorn --workers 2", floor_two, floor_request, False),
                     ("http floor, uvicorn --workers 1", floor_one, floor_request, True)],
                    [(FLOOR_AS_SERVED_TWO, floor_served_two, floor_request, False),
                     (FLOOR_AS_SERVED_ONE, floor_served_one, floor_request, True)],
                ]  # fmt: skip
                for round_index in range(args.rounds):
                    for name, target, request, pin in drive_order(twins, round_index, args.rounds):
                        point(name, target, request, top, results.http, pin=pin)
    results.http = median_rounds(results.http)
    results.activations = median_rounds(results.activations)
    order = {name: i for i, (name, _, _) in enumerate(scenarios)}
    results.http.sort(key=lambda r: (order.get(r["scenario"], len(order)), r["concurrency"]))
    results.compute = compute_floor(repository / SMALL / "1" / "model.onnx", args.seconds)
    results.breakdown = breakdown(repository, args.seconds)
    results.kernels = activation_kernels(args.activation_values)
    if not args.smoke:  # minutes under valgrind, when it is installed
        results.instructions = instructions.count(repository, sample_inputs(64)) or {}
    results.environment["large_model"] = large
    return results


def start_order(count: int, round_index: int) -> list[int]:
    """Which of ``count`` servers pass ``round_index`` starts first, second, ...: each pass
    one later in a cycle, so that over the passes each server starts in each position alike.
    The two runs that started the service's servers afresh for each pass, always batching on,
    then off, then off again, read them slowest to fastest in that order at c=1 in both: on
    0.94x and 0.93x off, and off 0.94x the second batching-off server in both (V1, medians of
    five passes each, 2026-11-26). If the position a server starts in matters, no scenario
    always has the same one."""
    return [(round_index + i) % count for i in range(count)]


def started_in_turn(
    arguments: list[tuple[str, dict[str, str], int, str, str]], round_index: int, stack: ExitStack
) -> list[Server]:
    """A server for each ``server`` arguments, started in pass ``round_index``'s order
    (``start_order``) and stopped with ``stack``; returned in the order given."""
    servers: dict[int, Server] = {}
    for i in start_order(len(arguments), round_index):
        servers[i] = stack.enter_context(server(*arguments[i]))
    return [servers[i] for i in range(len(arguments))]


def drive_order(groups: list[list[T]], round_index: int, rounds: int) -> list[T]:
    """The scenarios of pass ``round_index`` of ``rounds``, in the order driven. Each pass
    starts at a different group, so that no scenario is always driven just after the same one
    (a peer that leaves the core's caches cold, say); a group's scenarios (batching on and off
    of one protocol) are driven one right after the other, in the other order every other
    pass."""
    shift = round_index * len(groups) // rounds
    flip = round_index % 2 == 1
    return [s for g in groups[shift:] + groups[:shift] for s in (g[::-1] if flip else g)]


def by_round(
    a: dict[str, Any], b: dict[str, Any], measure: str = "rps"
) -> list[tuple[float, float | None]]:
    """a's ``measure`` (requests/s, or ``p99_ms``) over b's within each round, with how far
    apart the host's speed was for the two (``bench.speed.apart``; None if unread): each pass
    drives both a minute or two apart (batching on and off one right after the other), so a
    slow spell of the shared machine that spans the two cancels out, and the probe tells the
    spells that did not. A row without each round's ``measure`` (a report written before it
    was kept) gives its median point's, unread."""
    rounds = f"rounds_{measure}"
    if rounds not in a or rounds not in b:
        return [(a[measure] / b[measure], None)]
    unread: list[dict[str, float]] = [{}] * len(a[rounds])
    return [
        (x / y, apart(p, q))
        for x, y, p, q in zip(
            a[rounds],
            b[rounds],
            a.get("rounds_host_ms", unread),
            b.get("rounds_host_ms", unread),
            strict=True,
        )
    ]


def targets(results: Results, large: str) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 10's targets that this run measured.

    A ratio is the median of its rounds' ratios (``by_round``), counting the rounds in which
    the probe read the host at one speed for both points (within ``HOST_MATCH``), or every
    round if none did; shown beside each point's median and each round's ratio, a round not
    counted in brackets with how far apart the host was.
    """
    top = max(r["concurrency"] for r in results.http)
    concurrencies = sorted({r["concurrency"] for r in results.http})
    rows: list[tuple[str, str, bool]] = []

    def compare(
        name: str,
        a: dict[str, Any],
        b: dict[str, Any],
        goal: float,
        share: bool = False,
        unit: Callable[[dict[str, Any]], float] | None = None,
        units: str = "req/s",
        spec: str = ".0f",
        measure: str = "rps",
        at_most: bool = False,
    ) -> None:
        """A row for a against b, when both were measured; a share is shown in per cent. The
        ratio is of ``measure`` (``by_round``), and met at ``goal`` or above (``at_most``: at
        ``goal`` or below); each point is shown as ``unit`` of its row (default: ``measure``)."""
        if not (a and b):
            return

        def value(row: dict[str, Any]) -> float:
            return unit(row) if unit is not None else float(row[measure])

        rounds = [
            (ratio, far, far is None or far <= HOST_MATCH) for ratio, far in by_round(a, b, measure)
        ]
        alike = [ratio for ratio, _, counted in rounds if counted]
        middle = statistics.median(alike or [ratio for ratio, _, _ in rounds])
        form = "{:.0%}" if share else "{:.2f}x"
        if form.format(middle) == form.format(goal):  # too close to call at that precision
            form = "{:.1%}" if share else "{:.3f}x"
        shown = [
            form.format(ratio) if counted else f"({form.format(ratio)}: host {far:.2f}x apart)"
            for ratio, far, counted in rounds
        ]
        unmatched = "" if alike else "; no round read the host at one speed, all counted"
        measured = (
            f"{form.format(middle)} ({value(a):{spec}} / {value(b):{spec}} {units}; "
            f"by round {' / '.join(shown)}{unmatched})"
        )
        rows.append((name, measured, middle <= goal if at_most else middle >= goal))

    def http(scenario: str, c: int = top) -> dict[str, Any]:
        return results.find(results.http, scenario, c)

    floor, served = http("http floor"), http(FLOOR_AS_SERVED)
    for kind in ("v1", "v2-json", "v2-binary"):
        row = http(f"{kind} predict, batching on")
        compare(f"{kind} at c={top} >= {TARGET_FLOOR_RATIO:.0%} of the HTTP floor", row, floor,
                TARGET_FLOOR_RATIO, share=True)  # fmt: skip
        compare(f"{kind} at c={top} against the floor served as the service serves (no target: "
                "the app's share alone)", row, served, 0.0, share=True)  # fmt: skip
        compare(f"{kind} at c={top}: p99 <= {TARGET_TAIL_VS_FLOOR:g}x the floor's p99", row, floor,
                TARGET_TAIL_VS_FLOOR, units="ms", spec=".1f", measure="p99_ms",
                at_most=True)  # fmt: skip
        for c in concurrencies:
            compare(f"{kind} at c={c}: batching on >= off", http(f"{kind} predict, batching on", c),
                    http(f"{kind} predict, batching off", c), 1.0)  # fmt: skip
    low = concurrencies[0]
    compare(f"v1 at c={low}: batching off against a second batching-off server (no target: two "
            "identical servers, driven as on and off are)", http("v1 predict, batching off", low),
            http(OFF_AGAIN, low), 0.0)  # fmt: skip
    if counted := results.instructions:  # what the c=1 rows' timings are within noise of
        on, off = (counted[state] for state in instructions.STATES)
        rows.append((
            "in process, one request at a time: batching on's instructions per request against "
            "off's (no target: counted by callgrind, not timed)",
            f"{on / off:.3f}x ({on:,.0f} / {off:,.0f})", True,
        ))  # fmt: skip
    v1, naive = http("v1 predict, batching on"), http("naive app")
    compare(f"v1 at c={top} >= {TARGET_NAIVE_RATIO:g}x the naive app", v1, naive,
            TARGET_NAIVE_RATIO)  # fmt: skip
    # Against the 1-worker twins driven beside the 2-worker rows; runs before they were
    # measured have only the main rows, a quarter of an hour earlier.
    two = http(TWO_WORKERS)
    compare(f"v1 at c={top}: 2 workers >= {TARGET_WORKERS_GAIN:g}x 1 worker", two,
            http(ONE_WORKER) or v1, TARGET_WORKERS_GAIN)  # fmt: skip
    compare(f"v1 at c={top} with batching off: 2 workers against 1 (no target: one worker "
            "batches all the connections, each of two half of them)", http(TWO_WORKERS_OFF),
            http(ONE_WORKER_OFF), 0.0)  # fmt: skip
    compare(f"v1 at c={top}, 2 workers each: >= {TARGET_NAIVE_RATIO:g}x the naive app", two,
            http("naive app, uvicorn --workers 2"), TARGET_NAIVE_RATIO)  # fmt: skip
    compare(f"the HTTP floor at c={top}: 2 workers against 1 (no target: what this machine "
            "gives the stack)", http("http floor, uvicorn --workers 2"),
            http("http floor, uvicorn --workers 1") or floor, 0.0)  # fmt: skip
    compare(f"the HTTP floor served as the service serves at c={top}: 2 workers against 1 (no "
            "target: what this machine gives the service's server, each worker on its own "
            "socket)", http(FLOOR_AS_SERVED_TWO), http(FLOOR_AS_SERVED_ONE), 0.0)  # fmt: skip
    compare(f"v2-json at c={top} >= {TARGET_PEER_RATIO:g}x {PEER_MLSERVER}",
            http("v2-json predict, batching on"), http(f"{PEER_MLSERVER} v2-json"),
            TARGET_PEER_RATIO)  # fmt: skip
    compare(f"v1 at c={top} against {PEER_BENTOML} (no target)", v1, http(PEER_BENTOML), 0.0)
    grpc = http("grpc predict, batching on")
    compare(f"grpc at c={top} against the gRPC floor (no target)", grpc, http("grpc floor"), 0.0)
    compare(f"grpc at c={top} against v2-binary over HTTP (no target)", grpc,
            http("v2-binary predict, batching on"), 0.0)  # fmt: skip
    compare(f"grpc-stream at c={top} against grpc (no target: {top} requests in flight on one "
            f"ModelStreamInfer call, against {top} ModelInfer calls)",
            http("grpc-stream predict, batching on"), grpc, 0.0)  # fmt: skip
    compare(f"{large} at c={top}: batching on >= {TARGET_BATCHING_GAIN:g}x off",
            http(f"{large} v2-binary, batching on"), http(f"{large} v2-binary, batching off"),
            TARGET_BATCHING_GAIN)  # fmt: skip
    for c in concurrencies[:-1]:  # never slower than off, for any model (its batches on threads)
        compare(f"{large} at c={c}: batching on >= off", http(f"{large} v2-binary, batching on", c),
                http(f"{large} v2-binary, batching off", c), 1.0)  # fmt: skip
    for kernel, scenario in (("accurate", "gelu, float32 binary"),
                             ("native", "gelu native, float32 binary")):  # fmt: skip
        for c in (1, 4):
            gelu = results.find(results.activations, scenario, c)
            compare(f"activation ({kernel} kernel), 1e6 float32 binary at c={c} >= "
                    f"{TARGET_ACTIVATION_RATIO:.0%} of the echo floor", gelu,
                    results.find(results.activations, "echo floor", c), TARGET_ACTIVATION_RATIO,
                    share=True, unit=megabytes, units="MB/s")  # fmt: skip
            if kernel == "native":
                compare(f"activation (native kernel) at c={c} against the echo served as the "
                        "service serves (no target: the route's share alone)", gelu,
                        results.find(results.activations, ECHO_AS_SERVED, c), 0.0, share=True,
                        unit=megabytes, units="MB/s")  # fmt: skip
    ours: list[dict[str, Any]] = []
    for row in results.http + results.activations:
        if not row["scenario"].startswith(PEERS):
            ours.append(row)
        elif errors := row.get("rounds_errors", row["errors"]):  # a peer's, shown, no target
            rows.append((f"{row['scenario']} at c={row['concurrency']}: errors (no target)",
                         f"{errors} errors", True))  # fmt: skip
    errors = sum(r.get("rounds_errors", r["errors"]) for r in ours)
    rows.append(("zero errors (every round of every point but the peers')", f"{errors} errors",
                 errors == 0))  # fmt: skip
    return rows


def megabytes(row: dict[str, Any]) -> float:
    """MB/s of request body (float32 input for the activation rows)."""
    return float(row["rps"] * row["request_bytes"] / 1e6)


README = ROOT / "docs" / "performance.md"  # holds the targets block
README_BLOCK = ("<!-- bench-targets: generated by make bench -->\n", "<!-- /bench-targets -->\n")


def targets_table(results: Results) -> list[str]:
    """The targets as a Markdown table: target, measured, met."""
    lines = ["| target | measured | met |", "|---|---|---|"]
    for target, measured, met in targets(results, results.environment["large_model"]):
        lines.append(f"| {target} | {measured} | {'yes' if met else '**no**'} |")
    return lines


def readme_block(results: Results) -> str:
    """The README's targets block: the run's date and command, then the table."""
    env = results.environment
    lines = [f"Run of {env['date']} (`{env['command']}`):", "", *targets_table(results)]
    return README_BLOCK[0] + "\n".join(lines) + "\n" + README_BLOCK[1]


def load_results(path: Path) -> Results:
    """A run's results back from its benchmarks.json."""
    return Results(**json.loads(path.read_text()))


def rounds(row: dict[str, Any], spec: str = ".0f") -> str:
    """A point's requests/s in each of its rounds."""
    return " / ".join(format(rps, spec) for rps in row.get("rounds_rps", [row["rps"]]))


def write_report(results: Results, out: Path) -> None:
    """benchmarks.json, benchmarks.md and benchmarks.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(results.__dict__, indent=2) + "\n")
    env = results.environment
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`bench/run.py`); do not edit by hand.",
        "",
        f"- command: `{env['command']}`",
        f"- date: {env['date']}",
        f"- revision: {env.get('commit') or 'not recorded'}",
        f"- machine: {env['machine']}",
        f"- versions: Python {env['python']}, onnxruntime {env['onnxruntime']}, "
        f"FastAPI {env['fastapi']}, uvicorn {env['uvicorn']}, {env['wrk']}",
        f"- servers: one uvicorn process each, every thread pinned to CPU(s) "
        f"{env['server_cpus']} (checked before each point); wrk (1 thread) on CPU "
        f"{env['client_cpu']}; {env['seconds_per_run']} s per point; every other server of the "
        "run stopped (SIGSTOP, its whole process tree) while one is measured. The 2-worker "
        "rows: the server's two processes and wrk all free to use both cores. Every client "
        "runs as a batch job (`SCHED_BATCH`, `bench.proc.client_command`): sharing a core, it "
        "waits for the server's turn to end instead of preempting it. Stock uvicorn's workers "
        "(the naive app's and the plain floor's 2-worker rows) share one listening socket, and "
        "one of them can accept most of the connections: such a point shows near 1 server core",
        "- `server cores`: the server's CPU time over the point's wall time; `steal`: cores the "
        f"hypervisor gave other guests meanwhile (a point above {MAX_STEAL} is measured again, "
        f"up to {ATTEMPTS} times, keeping the least stolen); `probe ms`: the median time a "
        "fixed chunk of Python (under 1 ms) took on each of the server's CPUs during the "
        "point, timed every half second at real-time priority (`bench.speed`): a vCPU here can "
        "run all the while and still work 1.7 times slower, with no steal to show it. A "
        "reading may depend on the point's load too (in one trial a core never idle read "
        "faster), so only points of one kind compare: "
        "a target's round counts when its two points read within "
        f"{HOST_MATCH:.2f}x of each other on every CPU either ran on (a 2-worker point's second "
        "core against its 1-worker twin's one; the rest are shown in brackets)",
        f"- {env.get('rounds', 1)} round(s): the whole pass over every scenario and "
        "concurrency is repeated, each pass starting the scenarios at a different place, and "
        "each point reports its round of median req/s (all rounds in `rounds`). The service's "
        "three servers of the 1-worker rows (batching on, off, and off again) are new processes "
        "in each pass, started in a different order in each: two identical servers can differ "
        "by more than batching on and off do at c=1 for as long as both run",
        "- the machine is shared and noisy: absolute figures move between runs. All servers run "
        "side by side and at each concurrency every scenario is driven back to back, so a "
        "target's ratio is taken within each round, between points a minute or two apart (batching "
        "on and off one right after the other, in the other order every other round), and "
        "the median of those is reported beside each round's (`by round`), counting the "
        "rounds whose two points the probe read at one speed (the others in brackets, with how "
        "far apart; all count if none did); the 2-worker rows "
        "are measured in passes of their own after the rest, each one right beside its "
        "1-worker twin (the `--workers 1` rows, pinned as the rest), and compared with it",
        "",
        "## Targets",
        "",
        *targets_table(results),
    ]
    lines += [
        "",
        "## Inference: HTTP driven by wrk, gRPC by `bench.grpc_load`",
        "",
        "The gRPC rows are ModelInfer with raw tensor contents, from a grpcio asyncio client of "
        "our own in its own process on the client core (no gRPC load generator installs here); "
        "the grpc-stream rows send the same requests on one ModelStreamInfer call, with as many "
        "in flight as the concurrency says, the next written as each answer is read; "
        "`client_cores` in benchmarks.json is its CPU use, well under one core at every point, "
        "so the server sets the pace.",
        "",
        "`mean batch`: the samples per onnxruntime run of the service's model over the point "
        "(from its `gelu_batch_size` metric), in the round reported; blank for other servers. "
        "`preempted`: the times per request the scheduler took a core from one of the server's "
        "threads while it had work (involuntary context switches, from /proc).",
        "",
        "| scenario | concurrency | req/s | p50 ms | p99 ms | errors | server cores | "
        "CPU µs per request | mean batch | preempted | steal | probe ms | attempts | "
        "rounds (req/s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.http:
        mean_batch = f"{r['mean_batch']:.1f}" if "mean_batch" in r else ""
        lines.append(
            f"| {r['scenario']} | {r['concurrency']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['errors']} | {r['server_cores']:.2f} | "
            f"{r['cpu_us_per_request']:.0f} | {mean_batch} | "
            f"{r['preempted_per_request']:.3f} | {r['steal_cores']:.2f} | "
            f"{probe_text(r)} | {r['attempts']} | {rounds(r)} |"
        )
    lines += [
        "",
        "## Raw activation evaluation against an echo of the same body (wrk)",
        "",
        "| scenario | concurrency | request bytes | req/s | MB/s of body | p50 ms | p99 ms | "
        "errors | server cores | steal | probe ms | rounds (req/s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in results.activations:
        lines.append(
            f"| {a['scenario']} | {a['concurrency']} | {a['request_bytes']} | {a['rps']:.1f} | "
            f"{megabytes(a):.0f} | {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | {a['errors']} | "
            f"{a['server_cores']:.2f} | {a['steal_cores']:.2f} | {probe_text(a)} | "
            f"{rounds(a, '.1f')} |"
        )
    if results.kernels:
        lines += [
            "",
            "The activation kernels in process, one call on "
            f"{results.environment.get('activation_values', ACTIVATION_VALUES):,} values of "
            "gelu (ms, the median of 15; no HTTP):",
            "",
            "| kernel | ms |",
            "|---|---|",
        ]
        lines += [f"| {name} | {ms:.2f} |" for name, ms in results.kernels.items()]
    lines += where_the_time_goes(results)
    c = results.compute
    lines += [
        "",
        f"## Compute floor: onnxruntime `session.run` in process ({c['model']})",
        "",
        "| batch | calls/s | samples/s | p50 µs | p99 µs |",
        "|---|---|---|---|---|",
    ]
    for batch in (1, 64):
        lines.append(
            f"| {batch} | {c[f'batch{batch}_calls_per_s']:.0f} | "
            f"{c[f'batch{batch}_samples_per_s']:.0f} | {c[f'batch{batch}_p50_us']:.1f} | "
            f"{c[f'batch{batch}_p99_us']:.1f} |"
        )
    lines += ["", "![requests per second by scenario and concurrency](benchmarks.png)", ""]
    (out / "benchmarks.md").write_text("\n".join(lines))
    plot(results, out / "benchmarks.png")


def where_the_time_goes(results: Results) -> list[str]:
    """Server CPU per request at the top concurrency (floor, naive, service), and the serving
    core's stages timed in process."""
    top = max(r["concurrency"] for r in results.http)
    lines = [
        "",
        "## Where the time goes",
        "",
        f"Server CPU per request at c={top} (CPU time / requests; one process on one core):",
        "",
        "| scenario | CPU µs per request | above the floor |",
        "|---|---|---|",
    ]
    floor = results.find(results.http, "http floor", top).get("cpu_us_per_request", 0.0)
    for row in results.http:
        if row["concurrency"] == top and "--workers" not in row["scenario"]:
            us = row["cpu_us_per_request"]
            lines.append(f"| {row['scenario']} | {us:.0f} | {us - floor:+.0f} |")
    lines += [
        "",
        "The serving core's stages for one small request, timed in process (µs, no HTTP):",
        "",
        "| stage | µs |",
        "|---|---|",
    ]
    lines += [f"| {stage} | {us:.1f} |" for stage, us in results.breakdown.items()]
    if counted := results.instructions:
        from service.batching import QUIET_MS

        lines += [
            "",
            f"Instructions per small request in the serving core, one request at a time "
            f"({instructions.CALLS} of them: `DataPlane.infer`, batch of one, onnxruntime's run "
            "included, no HTTP), counted by callgrind (`bench/instructions.py`): a count does not "
            "move with the machine as a timing does. Batching on's are counted in a quiet "
            f"(`service/batching.py`, `QUIET_MS`): a lone client's look for company, once every "
            f"{QUIET_MS[-1]} ms, is not among them.",
            "",
            "| state | instructions per request |",
            "|---|---|",
        ]
        lines += [f"| {state} | {n:,.0f} |" for state, n in counted.items()]
    return lines


def plot(results: Results, path: Path) -> None:
    """Requests/s by scenario, one bar per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in results.http))
    concurrencies = sorted({r["concurrency"] for r in results.http})
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(scenarios) + 2))
    height = 0.8 / len(concurrencies)
    for i, c in enumerate(concurrencies):
        values = [results.rps(s, c) for s in scenarios]
        positions = [j + i * height for j in range(len(scenarios))]
        ax.barh(positions, values, height=height, label=f"c={c}")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(scenarios))], scenarios)
    ax.invert_yaxis()
    ax.set_xlabel("requests/s (wrk, loopback)")
    ax.set_title(
        f"gelu-serve, {results.environment['machine'].split(',')[1].strip()}, "
        "one server process per core"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
