"""Priority levels under overload (docs/scheduling.md): a higher level's latency while a lower
level's requests are refused, against the same load on one queue.

    python -m bench.priority [--seconds 4] [--high 2] [--low 32] [--server-cpus 0,1]

Serves, with ``gelu-serve serve`` (batches on worker threads, one intra-op thread), two copies of
a compute-bound model (``write_models``): ``ranked``, whose config.pbtxt gives two priority
levels, the lower (the default) holding at most ``CAP`` waiting requests, and ``plain``, one
queue. Both are driven at once, so that both meet the machine's other work alike: first by
``--high`` clients at priority 1 each, then by as many beside ``--low`` clients at priority 2
each. A client is a connection of its own with one request at a time; a refused one waits
``BACKOFF`` before its next (as a client that honours Retry-After, only sooner). It prints,
for each phase, model and level, the requests answered and refused per second, p50 and p99.
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from contract.names import CONFIG_FILENAME, MODEL_FILENAME, OPSET

CAP = 8  # the lower level's max_queue_size
BACKOFF = 0.02  # seconds a refused client waits before its next request
HIGH, LOW = 2, 32  # clients at priority 1, and beside them at priority 2
WIDTH, DEPTH, MAX_BATCH = 1024, 48, 4  # about 10 ms a batch of 4 on one core of this host
RANKED = f"""priority_levels: 2
  default_priority_level: 2
  priority_queue_policy {{ key: 2 value: {{ max_queue_size: {CAP} }} }}"""


def write_models(root: Path) -> None:
    """``ranked`` (two levels) and ``plain`` (one queue) in the repository ``root``: the same
    model, x [batch, 64] -> ``DEPTH`` layers of ``WIDTH`` (one shared weight, tanh) -> y [10]:
    a few MB on disk, tens of milliseconds of compute a batch, so that requests queue in the
    batcher rather than in the sockets."""
    rng = np.random.default_rng(0)
    weights = {
        "w_in": rng.standard_normal((64, WIDTH)) / 8,
        "w": rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH),
        "w_out": rng.standard_normal((WIDTH, 10)) / np.sqrt(WIDTH),
    }
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h0"])]
    for i in range(DEPTH):
        nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]  # fmt: skip
    nodes.append(helper.make_node("MatMul", [f"h{DEPTH}", "w_out"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "deep",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(w.astype(np.float32), n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10  # what onnxruntime here reads
    for name, batching in (("ranked", RANKED), ("plain", "")):
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / MODEL_FILENAME))
        (root / name / CONFIG_FILENAME).write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH}\n'
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
            f"dynamic_batching {{\n  {batching}\n}}\n"
        )


@dataclass(frozen=True)
class Level:
    """What one level's clients got in a phase."""

    answered: int
    refused: int  # 503s: the level's queue was full
    p50_ms: float
    p99_ms: float

    @staticmethod
    def of(rows: list[tuple[int, float]]) -> Level:
        """From each request's (status, seconds); other statuses than 200 and 503 fail."""
        odd = {status for status, _ in rows} - {200, 503}
        if odd:
            raise AssertionError(f"answers other than 200 and 503: {sorted(odd)}")
        times = np.array([s for status, s in rows if status == 200]) * 1000
        p50, p99 = np.percentile(times, [50, 99]) if len(times) else (np.nan, np.nan)
        refused = sum(status == 503 for status, _ in rows)
        return Level(len(times), refused, float(p50), float(p99))


def _client(port: int, model: str, priority: int, stop: threading.Event,
            rows: list[tuple[int, float]]) -> None:  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    entry = {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}
    body = json.dumps({"inputs": [entry], "parameters": {"priority": priority}})
    headers = {"Content-Type": "application/json"}
    try:
        while not stop.is_set():
            began = time.perf_counter()
            connection.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = connection.getresponse()
            response.read()
            rows.append((response.status, time.perf_counter() - began))
            if response.status != 200:
                time.sleep(BACKOFF)
    finally:
        connection.close()


def overload(port: int, high: int, low: int, seconds: float) -> dict[str, dict[str, Level]]:
    """Both models at once, each with ``high`` clients at priority 1 beside ``low`` at priority
    2, for ``seconds``: what each model's levels got. At once, so that both meet the same
    machine (its other work, its speed) in the same seconds."""
    stop = threading.Event()
    rows: dict[tuple[str, str], list[tuple[int, float]]] = {}
    threads = []
    for model in ("ranked", "plain"):
        for level, priority, count in (("high", 1, high), ("low", 2, low)):
            got = rows[model, level] = []
            threads += [threading.Thread(target=_client, args=(port, model, priority, stop, got))
                        for _ in range(count)]  # fmt: skip
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    answers: dict[str, dict[str, Level]] = {"ranked": {}, "plain": {}}
    for (model, level), got in rows.items():
        if got:
            answers[model][level] = Level.of(got)
    return answers


def bench_rows(
    answers: dict[str, dict[str, Level]], low: int, seconds: float, server_pid: int
) -> list[dict[str, Any]]:
    """``overload``'s answers as ``make bench`` records points (``bench.results``): a row per
    model and level, answered requests/s as its ``rps``, refused ones apart (a refusal is the
    policy at work, not an error), and ``low``, the lower-level clients beside, as its
    concurrency."""
    from bench.results import priority_scenario

    return [
        {"scenario": priority_scenario(model, level), "concurrency": low,
         "rps": got.answered / seconds, "refused_per_s": got.refused / seconds,
         "p50_ms": got.p50_ms, "p99_ms": got.p99_ms, "errors": 0, "server_pid": server_pid}
        for model, levels in answers.items()
        for level, got in levels.items()
    ]  # fmt: skip


def main() -> None:
    """Both models, each alone then under overload, as the module says."""
    from bench.launch import SERVICE_APP, server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--high", type=int, default=HIGH)
    parser.add_argument("--low", type=int, default=LOW)
    parser.add_argument("--server-cpus", default="0,1", help="taskset's list for the server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gelu-priority-") as scratch:
        write_models(Path(scratch))
        env = {"GELU_MODEL_REPOSITORY": scratch, "GELU_INLINE_MAX_US": "0",
               "GELU_INTRA_OP_THREADS": "1", "GELU_LOG_LEVEL": "warning"}  # fmt: skip
        with server(SERVICE_APP, env, 1, args.server_cpus, "/v2/health/ready") as target:
            port = int(target.url.rsplit(":", 1)[1])
            print("| low clients | model | level | answered/s | refused/s | p50 ms | p99 ms |")
            print("|---|---|---|---|---|---|---|")
            for low in (0, args.low):
                for model, levels in overload(port, args.high, low, args.seconds).items():
                    for level, got in levels.items():
                        print(f"| {low} | {model} | {level} | {got.answered / args.seconds:.0f} | "
                              f"{got.refused / args.seconds:.0f} | {got.p50_ms:.1f} | "
                              f"{got.p99_ms:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
