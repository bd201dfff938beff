"""Measuring one point, and what ``make bench`` measures in process: load from wrk or
``bench.grpc_load`` with the server's CPU use, the steal and the probe's readings; the requests
driven; the compute floor, the serving core's stages, the activation kernels; the environment."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.arguments import ROOT
from bench.floor import GRPC_METHOD
from bench.grpc_load import STREAM_METHOD, run_grpc
from bench.launch import Server, connection
from bench.proc import UsageMeter, check_pinned, cpu_model
from bench.results import SMALL
from bench.speed import HostSpeed
from bench.wrk import Request, run_wrk

GRPC_PREFIX = "grpc:"  # a Request whose path starts so is a gRPC call of that method


MAX_STEAL = 0.15  # cores; a point taken under more is measured again


ATTEMPTS = 3


# The in-process kernel row on arrays not in cache: this many copies of the body, in turn
# (32 MB of 1e6-value bodies; on this project's host arrays up to 8 MB stayed in cache).
COLD_ARRAYS = 8


# What a run measures; a change elsewhere (docs, README, tests) leaves it the commit's run.
CODE = ("service", "bench", "contract", "export", "models", "cli.py", "pyproject.toml")


T = TypeVar("T")


def ask(
    target: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request to ``target`` on a connection of its own: the answer's status and body."""
    conn = connection(int(target.url.rsplit(":", 1)[1]), target.tls, timeout=30)
    try:
        conn.request(method, path, body, headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def batch_totals(target: Server) -> tuple[float, float]:
    """(samples, runs) the service's models have run so far, from ``gelu_batch_size``'s sums
    and counts on its /metrics (over every worker)."""
    _, metrics = ask(target, "GET", "/metrics")
    samples = runs = 0.0
    for line in metrics.decode().splitlines():
        if line.startswith("gelu_batch_size_sum{"):
            samples += float(line.rsplit(" ", 1)[1])
        elif line.startswith("gelu_batch_size_count{"):
            runs += float(line.rsplit(" ", 1)[1])
    return samples, runs


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
    while the steal exceeds ``MAX_STEAL`` cores, keeping the least stolen. No other server is
    paused: each idles as it would beside any other."""
    best: dict[str, Any] = {}
    for attempt in range(1, ATTEMPTS + 1):
        threads = check_pinned(target.pid, target.cpus)
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


def answer(target: Server, request: Request) -> np.ndarray:
    """The probabilities ``target`` answers to one ``request``: a V2 JSON answer's
    ``probabilities`` output, or a JSON list (BentoML's)."""
    status, body = ask(target, "POST", request.path, request.body, request.headers)
    if status != 200:
        raise AssertionError(f"{target.url}{request.path} answered {status}: {body!r}")
    decoded = json.loads(body)
    if isinstance(decoded, dict):  # V2
        (output,) = [o for o in decoded["outputs"] if o["name"] == "probabilities"]
        return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    return np.asarray(decoded, dtype=np.float32)


def reference(model_file: Path, x: np.ndarray) -> np.ndarray:
    """The model's probabilities for ``x``, from onnxruntime in this process."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(["probabilities"], {"input": x.astype(np.float32)})
    return np.asarray(probabilities)


def drive_order(groups: list[list[T]], round_index: int, rounds: int) -> list[T]:
    """The scenarios of pass ``round_index`` of ``rounds``, in the order driven. Each pass
    starts at a different group, so that no scenario is always driven just after the same one
    (a peer that leaves the core's caches cold, say); a group's scenarios (batching on and off
    of one protocol) are driven one right after the other, in the other order every other
    pass."""
    shift = round_index * len(groups) // rounds
    flip = round_index % 2 == 1
    return [s for g in groups[shift:] + groups[:shift] for s in (g[::-1] if flip else g)]


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
                "check inputs": timed(lambda: model.checked_inputs(request.inputs, 0)),
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
