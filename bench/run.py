"""``make bench``: the inference path under load, against the HTTP and compute floors.

In one run on this machine: start the service (and a floor app) as real uvicorn processes,
drive them with wrk pinned to its own core at each concurrency, and report requests/s, p50, p99
and errors for V1 predict and V2 infer (JSON and binary) with batching on and off, the HTTP
floor, onnxruntime's in-process ``session.run`` (the compute floor), a larger model where
batching matters, and raw activation evaluation of 1e6 values (JSON and binary) in MB/s.
Writes ``benchmarks.md``, ``benchmarks.json`` and ``benchmarks.png``. Absolute figures move
with the machine's neighbours; compare the ratios, which are taken within one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.wrk import Request, run_wrk

ROOT = Path(__file__).resolve().parents[1]
ACTIVATION_VALUES = 1_000_000

# Targets from issue 4, as ratios within one run.
TARGET_FLOOR_RATIO = 0.6
TARGET_BATCHING_GAIN = 2.0
TARGET_TAIL_RATIO = 3.0
TARGET_ACTIVATION_MBS = 300.0


@dataclass
class Results:
    """Everything one run measured, as written to benchmarks.json."""

    environment: dict[str, Any]
    http: list[dict[str, Any]] = field(default_factory=list)
    compute: dict[str, Any] = field(default_factory=dict)
    activations: list[dict[str, Any]] = field(default_factory=list)

    def rps(self, scenario: str, concurrency: int) -> float:
        for row in self.http:
            if row["scenario"] == scenario and row["concurrency"] == concurrency:
                return float(row["rps"])
        return float("nan")

    def row(self, scenario: str, concurrency: int) -> dict[str, Any]:
        return next(
            r for r in self.http if r["scenario"] == scenario and r["concurrency"] == concurrency
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(
    app: str, env: dict[str, str], workers: int, cpus: str | None, ready_path: str
) -> Iterator[str]:
    """A uvicorn process (pinned to ``cpus``), ready; stopped with SIGTERM on exit."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        app,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{app} exited with {process.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", ready_path)
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{app} not ready")
            time.sleep(0.2)
        time.sleep(0.5 * workers)  # let every worker finish its start-up
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def sample_inputs(n_features: int) -> np.ndarray:
    """Real samples when the model's data is at hand (digits), else a fixed random batch."""
    if n_features == 64:
        from sklearn.datasets import load_digits

        return (load_digits().data[:1] / 16.0).astype(np.float32)
    return np.random.default_rng(0).random((1, n_features), dtype=np.float32)


def requests_for(model: str, x: np.ndarray) -> dict[str, Request]:
    """V1 JSON, V2 JSON and V2 binary requests carrying ``x``."""
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


def activation_throughput(base_url: str, seconds: float, values: int) -> list[dict[str, Any]]:
    """MB/s of float32 input through ``/v1/activations/gelu``, one client, JSON and binary."""
    host, port = base_url.removeprefix("http://").split(":")
    x = np.linspace(-5, 5, values, dtype="<f4")
    bodies = {
        "binary": (x.tobytes(), {"Content-Type": "application/octet-stream"}),
        "json": (json.dumps({"data": x.tolist()}).encode(), {"Content-Type": "application/json"}),
    }
    rows = []
    for kind, (body, headers) in bodies.items():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        count = errors = 0
        start = time.perf_counter()
        while count == 0 or time.perf_counter() - start < seconds:
            conn.request("POST", "/v1/activations/gelu", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            errors += response.status != 200
            count += 1
        elapsed = time.perf_counter() - start
        rows.append(
            {
                "format": kind,
                "values": values,
                "requests": count,
                "errors": errors,
                "request_bytes": len(body),
                "seconds_per_request": elapsed / count,
                "input_mb_per_s": x.nbytes * count / elapsed / 1e6,
            }
        )
    return rows


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
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "wrk": (wrk.stdout or wrk.stderr).splitlines()[0],
        "workers": args.workers,
        "server_cpus": args.server_cpus,
        "client_cpu": args.client_cpu,
        "seconds_per_run": args.seconds,
    }


def run(args: argparse.Namespace) -> Results:
    """Every measurement, in one run."""
    repository = Path(args.repository).resolve()
    large = ensure_models(repository, large=not args.smoke)
    command = "gelu-serve bench " + " ".join(a for a in sys.argv[1:] if a != "bench")
    results = Results(environment(args, command))
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})  # this process drives the activation runs
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    x = sample_inputs(64)
    small = requests_for("digits-mlp", x)
    big = requests_for(large, sample_inputs(64 if large == "digits-autoencoder" else 784))
    base_env = {
        "GELU_MODEL_REPOSITORY": str(repository),
        "GELU_LOG_LEVEL": "warning",
        "GELU_MAX_BODY_BYTES": str(64 << 20),
    }

    floor = Request("/floor", small["v1"].body, small["v1"].headers)
    service = "service.rest.app:create_app"
    ready = "/v2/health/ready"
    on_env = {**base_env, "GELU_BATCHING": "true"}
    off_env = {**base_env, "GELU_BATCHING": "false"}
    # All three servers run at once (idle when not driven), and at each concurrency every
    # scenario is driven back to back: the ratios compare runs taken within a minute.
    with (
        server("bench.floor:create_app", {}, args.workers, args.server_cpus, "/docs") as floor_url,
        server(service, on_env, args.workers, args.server_cpus, ready) as on_url,
        server(service, off_env, args.workers, args.server_cpus, ready) as off_url,
    ):
        scenarios = [("http floor", floor_url, floor)]
        scenarios += [(f"{k} predict, batching on", on_url, small[k]) for k in small]
        scenarios += [(f"{k} predict, batching off", off_url, small[k]) for k in ("v1", "v2-json")]
        if not args.smoke:
            scenarios += [
                (f"{large} v2-binary, batching on", on_url, big["v2-binary"]),
                (f"{large} v2-binary, batching off", off_url, big["v2-binary"]),
            ]
        for c in concurrencies:
            for scenario, url, request in scenarios:
                row = run_wrk(url, request, c, args.seconds, args.client_cpu)
                row.update(scenario=scenario, concurrency=c)
                results.http.append(row)
                print(
                    f"{scenario:40s} c={c:<3d} {row['rps']:7.0f} req/s  p50 {row['p50_ms']:6.2f} "
                    f"ms  p99 {row['p99_ms']:6.2f} ms  errors {row['errors']}",
                    flush=True,
                )
        results.activations = activation_throughput(on_url, args.seconds, args.activation_values)
        for row in results.activations:
            print(
                f"activation gelu {row['format']:6s} {row['input_mb_per_s']:8.1f} MB/s "
                f"of float32 input, errors {row['errors']}",
                flush=True,
            )
    order = {name: i for i, (name, _, _) in enumerate(scenarios)}
    results.http.sort(key=lambda r: (order[r["scenario"]], r["concurrency"]))
    results.compute = compute_floor(repository / "digits-mlp" / "1" / "model.onnx", args.seconds)
    results.environment["large_model"] = large
    return results


def targets(results: Results, large: str) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 4's targets that this run measured."""
    top = max(r["concurrency"] for r in results.http)
    rows = []
    floor = results.rps("http floor", top)
    for kind in ("v1", "v2-json", "v2-binary"):
        rps = results.rps(f"{kind} predict, batching on", top)
        ratio = rps / floor
        rows.append(
            (
                f"{kind} predict at c={top} >= {TARGET_FLOOR_RATIO:.0%} of the HTTP floor",
                f"{ratio:.0%} ({rps:.0f} / {floor:.0f} req/s)",
                ratio >= TARGET_FLOOR_RATIO,
            )
        )
        row = results.row(f"{kind} predict, batching on", top)
        tail = row["p99_ms"] / row["p50_ms"]
        rows.append(
            (
                f"{kind} predict at c={top}: p99 <= {TARGET_TAIL_RATIO:g}x p50",
                f"{tail:.2f}x ({row['p99_ms']:.1f} / {row['p50_ms']:.1f} ms)",
                tail <= TARGET_TAIL_RATIO,
            )
        )
    on = results.rps(f"{large} v2-binary, batching on", top)
    off = results.rps(f"{large} v2-binary, batching off", top)
    if on == on and off == off:  # both measured (not NaN)
        rows.append(
            (
                f"{large} at c={top}: batching on >= {TARGET_BATCHING_GAIN:g}x off",
                f"{on / off:.2f}x ({on:.0f} / {off:.0f} req/s)",
                on / off >= TARGET_BATCHING_GAIN,
            )
        )
    binary = next((a for a in results.activations if a["format"] == "binary"), None)
    if binary:
        mbs = binary["input_mb_per_s"]
        rows.append(
            (
                f"activation, 1e6 float32 binary >= {TARGET_ACTIVATION_MBS:g} MB/s",
                f"{mbs:.0f} MB/s",
                mbs >= TARGET_ACTIVATION_MBS,
            )
        )
    errors = sum(r["errors"] for r in results.http)
    rows.append(("zero errors", f"{errors} errors", errors == 0))
    return rows


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
        f"- machine: {env['machine']}",
        f"- versions: Python {env['python']}, onnxruntime {env['onnxruntime']}, "
        f"FastAPI {env['fastapi']}, uvicorn {env['uvicorn']}, {env['wrk']}",
        f"- servers: {env['workers']} uvicorn process(es) on CPU(s) {env['server_cpus']}; "
        f"wrk (1 thread) and the activation client on CPU {env['client_cpu']}; "
        f"{env['seconds_per_run']} s per run",
        "- the machine is shared and noisy: absolute figures move between runs. The floor and "
        "the service with batching on and off run side by side, and at each concurrency every "
        "scenario is driven back to back, so each ratio compares runs about a minute apart",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for target, measured, met in targets(results, env["large_model"]):
        lines.append(f"| {target} | {measured} | {'yes' if met else '**no**'} |")
    lines += [
        "",
        "## HTTP, wrk",
        "",
        "| scenario | concurrency | req/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|",
    ]
    for r in results.http:
        lines.append(
            f"| {r['scenario']} | {r['concurrency']} | {r['rps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |"
        )
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
    lines += [
        "",
        "## Raw activation evaluation (`gelu`, one client, sequential requests)",
        "",
        "| format | values | request bytes | ms per request | MB/s of float32 input | errors |",
        "|---|---|---|---|---|---|",
    ]
    for a in results.activations:
        lines.append(
            f"| {a['format']} | {a['values']} | {a['request_bytes']} | "
            f"{a['seconds_per_request'] * 1e3:.1f} | {a['input_mb_per_s']:.0f} | "
            f"{a['errors']} |"
        )
    lines += ["", "![requests per second by scenario and concurrency](benchmarks.png)", ""]
    (out / "benchmarks.md").write_text("\n".join(lines))
    plot(results, out / "benchmarks.png")


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
        f"{results.environment['workers']} server process(es)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options."""
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run (5)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections (1,16,64)")
    parser.add_argument("--workers", type=int, default=1, help="server processes (1)")
    parser.add_argument("--server-cpus", default="0", help="taskset CPU list of servers (0)")
    parser.add_argument("--client-cpu", type=int, default=1, help="CPU of wrk and client (1)")
    parser.add_argument("--repository", default="model_repository", help="model repository")
    parser.add_argument(
        "--activation-values",
        type=int,
        default=ACTIVATION_VALUES,
        help="values per activation request (1e6)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="report directory (docs)")
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds: no larger model, for the tests"
    )


def report(args: argparse.Namespace) -> None:
    """Measure, write the report, print each target as met or missed."""
    results = run(args)
    write_report(results, args.out)
    for target, measured, met in targets(results, results.environment["large_model"]):
        print(f"{'met ' if met else 'MISS'} {target}: {measured}")
    print(f"wrote {args.out}/benchmarks.md, benchmarks.json, benchmarks.png")


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.run``."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    report(parser.parse_args(argv))


if __name__ == "__main__":
    main()
