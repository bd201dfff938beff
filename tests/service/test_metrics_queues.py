"""The autoscaling signals: per model version, the requests waiting to run
(``gelu_inference_pending_requests``, Triton's pending count) and those waiting or running
(``gelu_inference_in_flight_requests``), read from what holds the requests, in one process
and across workers."""

from __future__ import annotations

import ast
import asyncio
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from service.batching import Batcher, Deadline, Runs
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import NotFoundError
from service.inference import InferenceRequest, RequestInput
from service.metrics import FLUSH_SECONDS, Metrics
from service.runtime import Model
from tests.helpers import DIGITS, load_model, until
from tests.onnx_models import write_model
from tests.servers import get, running, wait_until

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = re.compile(r'^(gelu_inference_\w+)\{model="([^"]+)",version="([^"]+)"\} (\S+)$', re.M)


def gauges(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """The two gauges' samples in a scrape, by (family, model, version)."""
    text = metrics.exposition().decode()
    return {(f, m, v): float(x) for f, m, v, x in SAMPLE.findall(text)}


class Gate:
    """Holds every onnxruntime run on a worker thread until opened; says when one waits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.runs = 0
        real = Model.infer
        loop_thread = threading.get_ident()

        def infer(model: Model, inputs, outputs=None):
            if threading.get_ident() != loop_thread:  # inline runs (warm-up) pass
                self.runs += 1
                assert self.open.wait(10), "the gate was never opened"
            return real(model, inputs, outputs)

        monkeypatch.setattr(Model, "infer", infer)

    async def until_running(self, runs: int) -> None:
        await until(lambda: self.runs >= runs, f"{runs} runs started", timeout=5, every=0.005)


@pytest.fixture(scope="module")
def model(model_repository: Path) -> Model:
    return load_model(model_repository, "digits-mlp")


def started(model: Model, delay_us: int, inline: bool) -> Batcher:
    metrics = Metrics()
    batcher = Batcher(model, 64, delay_us, metrics, Runs(model, metrics), inline)
    batcher.start()
    return batcher


# ---- what the batcher counts as waiting -------------------------------------------------------


def test_requests_queued_behind_a_running_batch_are_pending(model, monkeypatch) -> None:
    """On a worker thread: the batch running is not pending, the requests queued behind it
    are; none once all are answered."""
    gate = Gate(monkeypatch)

    async def scenario() -> tuple[int, int, int]:
        batcher = started(model, 0, inline=False)
        first = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await gate.until_running(1)
        running = batcher.waiting()
        rest = [asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]})) for _ in range(5)]
        await asyncio.sleep(0.01)
        queued = batcher.waiting()
        gate.open.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        await batcher.stop()
        return running, queued, batcher.waiting()

    assert asyncio.run(scenario()) == (0, 5, 0)


def test_requests_answered_while_queued_are_not_pending(model, monkeypatch) -> None:
    """A request whose client left, or whose deadline passed, while it queued is answered at
    once and dropped by the next batch: it no longer counts as waiting."""
    gate = Gate(monkeypatch)

    async def scenario() -> tuple[int, int]:
        batcher = started(model, 0, inline=False)
        first = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await gate.until_running(1)
        rest = [asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]})) for _ in range(3)]
        soon = Deadline(time.perf_counter_ns(), 1_000)  # 1 ms
        late = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}, deadline=soon))
        await asyncio.sleep(0.05)
        rest[0].cancel()
        await asyncio.sleep(0.01)
        left = batcher.waiting()
        gate.open.set()
        await asyncio.wait_for(asyncio.gather(first, *rest, late, return_exceptions=True), 10)
        await batcher.stop()
        return left, batcher.waiting()

    assert asyncio.run(scenario()) == (2, 0)


def test_a_batch_waiting_out_its_queue_delay_is_pending(model) -> None:
    """Requests taken into a batch that waits for its queue delay on a worker thread's
    batcher are out of the queue and not running yet: pending, until the batcher stops."""

    async def scenario() -> tuple[int, int]:
        batcher = started(model, 5_000_000, inline=False)  # a delay that outlasts the test
        waiting = [asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]})) for _ in range(3)]
        await asyncio.sleep(0.05)
        gathering = batcher.waiting()
        await batcher.stop()
        await asyncio.gather(*waiting, return_exceptions=True)
        return gathering, batcher.waiting()

    assert asyncio.run(scenario()) == (3, 0)


def test_a_request_looking_for_company_on_the_loop_is_pending(model) -> None:
    """Inline, a lone request waits out the queue delay for company outside the queue, and
    the request that joins it waits in the queue: both pending until their batch runs."""

    async def scenario() -> tuple[int, int, int]:
        batcher = started(model, 200_000, inline=True)
        lead = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0.02)
        alone = batcher.waiting()
        joined = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0.02)
        both = batcher.waiting()
        await asyncio.wait_for(asyncio.gather(lead, joined), 10)
        await batcher.stop()
        return alone, both, batcher.waiting()

    assert asyncio.run(scenario()) == (1, 2, 0)


# ---- through the core: what /metrics says ---------------------------------------------------


def request() -> InferenceRequest:
    return InferenceRequest([RequestInput(DIGITS[:1], "input", "FP32")])


@pytest.mark.anyio
async def test_metrics_show_each_version_pending_and_in_flight(
    settings_factory, monkeypatch
) -> None:
    """Six requests on one version with one instance: one runs, five wait behind it. Every served
    version has both series (0 when idle), no other label appears, and both read 0 once the
    requests are answered."""
    core = DataPlane(settings_factory(inline_max_us=0, max_queue_delay_us=0))
    await core.start()
    gate = Gate(monkeypatch)
    try:
        served = {(s.model.name, s.model.version) for s in core.started_repository().all()}
        version = core.model("digits-mlp").version
        flights = [asyncio.create_task(core.infer("digits-mlp", None, request()))]
        await gate.until_running(1)  # alone in its batch: the others queue behind it
        flights += [
            asyncio.create_task(core.infer("digits-mlp", None, request())) for _ in range(5)
        ]
        await asyncio.sleep(0.01)
        with pytest.raises(NotFoundError):
            await core.infer("no-such-model", None, request())
        during = gauges(core.metrics)
        gate.open.set()
        await asyncio.gather(*flights)
        after = gauges(core.metrics)
    finally:
        gate.open.set()
        await core.stop()
    assert during["gelu_inference_pending_requests", "digits-mlp", version] == 5
    assert during["gelu_inference_in_flight_requests", "digits-mlp", version] == 6
    assert {(m, v) for _, m, v in during} == served  # the unknown model's name is not there
    assert {key for key, value in during.items() if value} == {
        ("gelu_inference_pending_requests", "digits-mlp", version),
        ("gelu_inference_in_flight_requests", "digits-mlp", version),
    }
    assert set(after) == set(during) and not any(after.values())


@pytest.mark.anyio
async def test_a_retired_version_counts_until_its_requests_are_answered(
    settings_factory, monkeypatch
) -> None:
    """Unloaded while requests run, a version stays on /metrics with them (it still serves
    them), and leaves once they are answered, as its other series do."""
    core = DataPlane(
        settings_factory(
            model_control_mode="explicit", load_models=["*"], inline_max_us=0,
            max_queue_delay_us=0,
        )
    )  # fmt: skip
    await core.start()
    gate = Gate(monkeypatch)
    try:
        version = core.model("digits-mlp").version
        flights = [asyncio.create_task(core.infer("digits-mlp", None, request()))]
        await gate.until_running(1)
        flights += [
            asyncio.create_task(core.infer("digits-mlp", None, request())) for _ in range(2)
        ]
        await asyncio.sleep(0.01)
        await ModelControl.over(core).unload("digits-mlp")
        draining = gauges(core.metrics)
        gate.open.set()
        await asyncio.gather(*flights)
        # the drain task releases the version on the loop's next turns
        key = ("gelu_inference_in_flight_requests", "digits-mlp", version)
        await until(lambda: key not in gauges(core.metrics), "the version released", 1, 0.01)
        gone = gauges(core.metrics)
    finally:
        gate.open.set()
        await core.stop()
    assert draining["gelu_inference_in_flight_requests", "digits-mlp", version] == 3
    assert draining["gelu_inference_pending_requests", "digits-mlp", version] == 2
    assert not any(model == "digits-mlp" for _, model, _ in gone)


# ---- across workers -----------------------------------------------------------------------

# In a process of its own: prometheus_client's choice of value class is process-wide.
WORKER = """
import sys, time
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from service.metrics import FLUSH_SECONDS, Metrics

def files_say():
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return sorted(line for line in generate_latest(registry).decode().splitlines()
                  if line.startswith("gelu_inference_"))

held = [("m", "1", 3, 5), ("m", "2", 0, 1)]
metrics = Metrics(multiprocess=True)
metrics.watch_queues(lambda: held)
time.sleep(3 * FLUSH_SECONDS)
print(files_say())                                  # the flushing thread wrote them
held = [("m", "2", 1, 2)]                           # version 1 is gone
print(sorted(line for line in metrics.exposition().decode().splitlines()
             if line.startswith("gelu_inference_")))  # a scrape samples first
def broken():
    raise RuntimeError("dictionary changed size during iteration")
metrics.watch_queues(broken)
time.sleep(2 * FLUSH_SECONDS)                        # skipped, and the thread goes on
metrics.watch_queues(None)
time.sleep(2 * FLUSH_SECONDS)
print(files_say())                                  # stopped: every version reads 0
"""


def test_each_worker_writes_its_gauges_before_each_flush(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        cwd=ROOT,
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    flushed, scraped, stopped = (ast.literal_eval(x) for x in done.stdout.splitlines())

    def line(family: str, version: str, value: float) -> str:
        return f'gelu_inference_{family}_requests{{model="m",version="{version}"}} {value}'

    assert flushed == sorted([line("in_flight", "1", 5.0), line("in_flight", "2", 1.0),
                              line("pending", "1", 3.0), line("pending", "2", 0.0)])  # fmt: skip
    assert scraped == sorted([line("in_flight", "1", 0.0), line("in_flight", "2", 2.0),
                              line("pending", "1", 0.0), line("pending", "2", 1.0)])  # fmt: skip
    assert stopped == sorted([line(f, v, 0.0) for f in ("in_flight", "pending") for v in "12"])
    assert "request gauges not sampled this time" in done.stderr


def test_in_flight_is_never_read_below_pending() -> None:
    """Read off the loop, a request can leave the queue between the two reads: the gauges
    still say no fewer requests are held than wait."""
    metrics = Metrics()
    metrics.watch_queues(lambda: [("m", "1", 4, 3), ("m", "1", 1, 2)])  # a reload beside it
    assert gauges(metrics) == {
        ("gelu_inference_pending_requests", "m", "1"): 5.0,
        ("gelu_inference_in_flight_requests", "m", "1"): 5.0,
    }


# ---- a real server with two workers -------------------------------------------------------


def _held(port: int) -> dict[tuple[str, str], float]:
    """The slow model's two gauges in one scrape, summed over the workers by /metrics."""
    status, body = get(port, "/metrics")
    assert status == 200
    found = {(family, version): float(value)
             for family, model, version, value in SAMPLE.findall(body.decode())
             if model == "slow"}  # fmt: skip
    assert {family for family, _ in found} == {
        "gelu_inference_pending_requests", "gelu_inference_in_flight_requests"
    }, found  # fmt: skip  # one series each: the workers' files are summed, not listed
    return found


@pytest.mark.slow
def test_two_workers_report_their_queues_summed(tmp_path: Path) -> None:
    """Under a load that queues on a wide model, the scrape sums both workers' requests held
    and waiting (each written before its worker's flush); after it, both read 0 within a few
    flushes."""
    write_model(tmp_path, "slow", 1, hidden=2048, max_batch_size=8)
    body = json.dumps({"instances": [DIGITS[0].tolist()]})
    stop = threading.Event()

    def client(port: int) -> int:
        answered = 0
        while not stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("POST", "/v1/models/slow:predict", body=body)
            assert connection.getresponse().status == 200
            connection.close()
            answered += 1
        return answered

    env = {"GELU_INLINE_MAX_US": "0", "GELU_WORKERS": "2"}
    with running(tmp_path, **env) as (port, _), ThreadPoolExecutor(48) as pool:
        clients = [pool.submit(client, port) for _ in range(48)]
        seen: list[dict[tuple[str, str], float]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen.append(_held(port))
            if seen[-1][("gelu_inference_pending_requests", "1")] > 0:
                break
            time.sleep(0.05)
        stop.set()
        assert sum(c.result(timeout=60) for c in clients) > 0
        busiest = max(seen, key=lambda s: s[("gelu_inference_in_flight_requests", "1")])
        idle = wait_until(
            lambda: (lambda held: held if not any(held.values()) else None)(_held(port)),
            timeout=10 * FLUSH_SECONDS, what="the gauges back to 0 after the load",
        )  # fmt: skip
    assert busiest[("gelu_inference_pending_requests", "1")] > 0, seen[-5:]
    in_flight = busiest[("gelu_inference_in_flight_requests", "1")]
    assert busiest[("gelu_inference_pending_requests", "1")] <= in_flight <= 2 * 256
    assert idle == {("gelu_inference_pending_requests", "1"): 0.0,
                    ("gelu_inference_in_flight_requests", "1"): 0.0}  # fmt: skip
