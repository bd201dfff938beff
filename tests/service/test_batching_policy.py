"""The batcher's scheduling policy (Triton's priority levels and queue policies,
``service.batching.Levels``): highest level first, each level in order; a level's
``max_queue_size``; REJECT and DELAY; clients that leave and requests that expire leave the
queue at once and never run; a run once started is never cut short."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import struct
import time
from collections import deque
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.priority import overload, write_models
from contract.model_config import QueuePolicy, SchedulingPolicy, load_model_config
from contract.names import CONFIG_FILENAME
from service.batching import Batcher, Deadline, Levels, Runs, _Request
from service.errors import OverloadedError
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.metrics import Metrics
from service.runtime import Model
from tests.helpers import ModelGate, load_model
from tests.onnx_models import write_model, write_variable
from tests.servers import free_port, get, running, wait_until

TWO_LEVELS = SchedulingPolicy(priority_levels=2, default_priority_level=2)


@pytest.fixture(scope="module")
def model(model_repository: Path) -> Model:
    return load_model(model_repository, "digits-mlp")


@pytest.fixture(scope="module")
def variable(tmp_path_factory: pytest.TempPathFactory) -> Model:
    root = tmp_path_factory.mktemp("variable")
    write_variable(root, "varlen")
    return load_model(root, "varlen")


def run(coro):
    return asyncio.run(coro)


def marked(mark: int) -> dict[str, np.ndarray]:
    """A one-row request whose every value is ``mark``: a run's rows tell which requests it
    held."""
    return {"input": np.full((1, 64), float(mark), np.float32)}


def started(
    model: Model, max_batch_size: int, scheduling: SchedulingPolicy, inline: bool = False
) -> Batcher:
    """A running batcher with ``scheduling`` (call inside the event loop), no queue delay."""
    metrics = Metrics()
    runs = Runs(model, metrics)
    batcher = Batcher(model, max_batch_size, 0, metrics, runs, inline, 1, scheduling)
    batcher.start()
    return batcher


def submit(batcher: Batcher, mark: int, level: int, **options) -> asyncio.Future:
    return asyncio.ensure_future(batcher.infer(marked(mark), level=level, **options))


def test_batches_take_the_highest_level_first_each_in_order(model, monkeypatch) -> None:
    gate = ModelGate(model, monkeypatch)

    async def scenario():
        batcher = started(model, 2, TWO_LEVELS)
        first = submit(batcher, 1, 2)
        await gate.first_running()  # the one instance is busy: the rest queue
        rest = [submit(batcher, mark, level) for mark, level in
                ((2, 2), (3, 2), (4, 1), (5, 1), (6, 2))]  # fmt: skip
        await asyncio.sleep(0.01)
        waiting = batcher.waiting()  # the pending gauge reads every level's queue
        gate.open.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        await batcher.stop()
        return answers, waiting

    answers, waiting = run(scenario())
    assert waiting == 5
    assert gate.runs == [[1], [4, 5], [2, 3], [6]]
    assert all(a["logits"].shape == (1, 10) for a in answers)


def test_inline_batches_take_the_highest_level_first(model, monkeypatch) -> None:
    """On the event loop, a batch that fills as a request arrives runs then, in that
    request's turn, the highest level's requests first (its leader, still gathering, runs
    next, as without levels)."""
    gate = ModelGate(model, monkeypatch)
    gate.open.set()

    async def scenario():
        batcher = started(model, 4, TWO_LEVELS, inline=True)
        answers = await asyncio.gather(*(
            batcher.infer(marked(mark), level=level)
            for mark, level in ((1, 2), (2, 2), (3, 1), (4, 1), (5, 2))
        ))  # fmt: skip
        await batcher.stop()
        return answers

    answers = run(scenario())
    assert gate.runs == [[3, 4, 2, 5], [1]]
    assert [int(a["logits"].shape[0]) for a in answers] == [1] * 5


def test_a_full_level_refuses_at_once_in_tritons_words(model, monkeypatch) -> None:
    """A level holding its ``max_queue_size`` refuses the next request at once ("Exceeds
    maximum queue size", after its request id, as Triton's); another level is not held by it,
    and a client that leaves frees its place at once, never to run."""
    gate = ModelGate(model, monkeypatch)
    policy = SchedulingPolicy(2, 2, QueuePolicy(max_queue_size=1), ())

    async def scenario():
        batcher = started(model, 2, policy)
        first = submit(batcher, 1, 2)
        await gate.first_running()
        leaving = submit(batcher, 2, 2)
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError) as refused:
            await batcher.infer(marked(3), level=2, request_id="r-7")
        high = submit(batcher, 4, 1)  # level 1: its own queue, no bound
        await asyncio.sleep(0)
        leaving.cancel()  # as when its client disconnects
        await asyncio.gather(leaving, return_exceptions=True)
        after = submit(batcher, 5, 2)  # the place it held is free again
        await asyncio.sleep(0.01)
        gate.open.set()
        answers = await asyncio.wait_for(asyncio.gather(first, high, after), 10)
        await batcher.stop()
        return refused.value, answers

    refused, answers = run(scenario())
    assert str(refused).startswith("[request id: r-7] Exceeds maximum queue size")
    assert refused.status_code == 503 and refused.headers == {"Retry-After": "1"}
    assert gate.runs == [[1], [4, 5]]  # the departed request never ran
    assert len(answers) == 3


def test_a_refusal_without_a_request_id_says_so_as_triton_does() -> None:
    levels = Levels(SchedulingPolicy(default_queue_policy=QueuePolicy(max_queue_size=1)))
    levels.admit(1, None)
    loop = asyncio.new_event_loop()
    try:
        levels.append(_Request(marked(0), 1, loop.create_future()))
    finally:
        loop.close()
    with pytest.raises(OverloadedError, match=r"^\[request id: <id_unknown>\] Exceeds maximum"):
        levels.admit(1, None)
    unbounded = Levels(TWO_LEVELS)  # levels with no policy of their own: no bound
    for _ in range(3):
        unbounded.admit(2, None)


def test_reject_refuses_an_expired_request_before_it_runs(model, monkeypatch) -> None:
    """REJECT: a request still queued at its deadline fails ("Request timeout expired", as
    Triton's) and leaves the queue at once, freeing its place; it never runs. A request whose
    deadline passes while it runs is answered: a run is never cut short."""
    gate = ModelGate(model, monkeypatch)
    policy = SchedulingPolicy(default_queue_policy=QueuePolicy(max_queue_size=1))

    async def scenario():
        batcher = started(model, 2, policy)
        first = submit(batcher, 1, 1, deadline=Deadline(time.perf_counter_ns(), 5_000))
        await gate.first_running()  # held past its 5 ms
        late = submit(batcher, 2, 1, deadline=Deadline(time.perf_counter_ns(), 5_000))
        await asyncio.sleep(0.05)
        refused_early = late.done()
        after = submit(batcher, 3, 1)  # the level's one place is free again
        await asyncio.sleep(0.01)
        gate.open.set()
        answers = await asyncio.wait_for(
            asyncio.gather(first, late, after, return_exceptions=True), 10
        )
        await batcher.stop()
        return refused_early, answers

    refused_early, (first, late, after) = run(scenario())
    assert refused_early  # at its deadline, not when a batch reached it
    assert first["logits"].shape == (1, 10)  # its deadline passed while it ran
    assert isinstance(late, OverloadedError) and str(late).startswith("Request timeout expired")
    assert after["logits"].shape == (1, 10)
    assert gate.runs == [[1], [3]]


def test_delay_lets_an_expired_request_wait_behind_those_in_time(model, monkeypatch) -> None:
    """DELAY: past its timeout, a request is neither refused nor eligible to time out again; it
    runs after its level's requests still in time (Triton's delayed queue), and before a lower
    level's."""
    gate = ModelGate(model, monkeypatch)

    async def scenario():
        batcher = started(model, 1, TWO_LEVELS)
        first = submit(batcher, 1, 1)
        await gate.first_running()
        now = time.perf_counter_ns()
        delayed = submit(batcher, 2, 1, deadline=Deadline(now, 1_000, delay=True))
        low = submit(batcher, 3, 2)
        await asyncio.sleep(0.02)  # the delayed one's timeout passed
        now = time.perf_counter_ns()
        in_time = [submit(batcher, m, 1, deadline=Deadline(now, 10_000_000)) for m in (4, 5)]
        await asyncio.sleep(0.01)
        gate.open.set()
        answers = await asyncio.wait_for(asyncio.gather(first, delayed, low, *in_time), 10)
        await batcher.stop()
        return answers

    answers = run(scenario())
    assert all(a["logits"].shape == (1, 10) for a in answers)  # none refused
    assert gate.runs == [[1], [4], [5], [2], [3]]


def test_a_delayed_request_is_not_refused_as_it_starts() -> None:
    """A request run without queueing checks its deadline as it starts: under DELAY, it runs
    all the same; under REJECT, it is refused."""
    long_ago = time.perf_counter_ns() - 10_000_000
    Deadline(long_ago, 1, delay=True).check()
    with pytest.raises(OverloadedError, match=r"^Request timeout expired"):
        Deadline(long_ago, 1).check()


def test_requests_of_other_shapes_keep_their_level_and_place(variable, monkeypatch) -> None:
    """Shape grouping holds with levels: a batch takes, highest level first, the requests that
    stack with its first; the others keep their level and their place."""
    shapes: list[tuple[int, ...]] = []
    real = variable.infer

    def infer(inputs, outputs=None):
        shapes.append(inputs["x"].shape)
        return real(inputs, outputs)

    monkeypatch.setattr(variable, "infer", infer)
    given = ((3, 2), (5, 2), (3, 1), (5, 1), (3, 2))  # (row length, level)

    async def scenario():
        batcher = started(variable, 8, TWO_LEVELS, inline=True)
        answers = await asyncio.wait_for(asyncio.gather(*(
            batcher.infer({"x": np.full((1, n), i, np.float32)}, level=level)
            for i, (n, level) in enumerate(given)
        )), 10)  # fmt: skip
        await batcher.stop()
        return answers

    answers = run(scenario())
    for i, ((n, _), answer) in enumerate(zip(given, answers, strict=True)):
        np.testing.assert_array_equal(answer["y"], np.full((1, n), 2 * i, np.float32))
    # Level 1's first (length 3) leads the batch with every request of its shape; then the
    # rest, level 1's first again.
    assert shapes == [(3, 3), (2, 5)]


def test_without_a_policy_the_batcher_keeps_one_plain_queue(model) -> None:
    """A model whose config.pbtxt writes no policy keeps the one deque, at its C speed: the
    default path pays nothing for levels."""
    metrics = Metrics()
    plain = Batcher(model, 8, 0, metrics, Runs(model, metrics))
    assert type(plain._pending) is deque and plain._levels is None
    levelled = Batcher(model, 8, 0, metrics, Runs(model, metrics), scheduling=TWO_LEVELS)
    assert levelled._levels is not None and levelled._pending is levelled._levels


@pytest.mark.slow  # a real server, driven by 70 clients for a few seconds
def test_under_overload_a_higher_level_holds_while_a_lower_one_is_refused(tmp_path: Path) -> None:
    """Issue 64: two copies of a compute-bound model on one server, driven at once by the same
    load (``bench.priority``): 2 clients at priority 1 and 32 at priority 2 on each. On
    ``ranked`` (two levels, the lower holding at most ``CAP`` waiting requests) the lower
    level's surplus is refused at once and the higher level's p50 and p99 stay well under those
    of the same clients on ``plain`` (one queue, where they wait behind everyone). At once, so
    both meet the shared machine's noise alike (runs/scheduling-2026-11-28/: 2.5 to 3.5 times
    under at p99, 4.3 to 4.9 at p50)."""
    write_models(tmp_path)
    env = {"GELU_INLINE_MAX_US": "0", "GELU_INTRA_OP_THREADS": "1", "GELU_LOG_LEVEL": "warning"}
    with running(tmp_path, **env) as (port, _):
        got = overload(port, high=2, low=32, seconds=4)
    ranked, plain = got["ranked"], got["plain"]
    figures = f"ranked {ranked}, plain {plain}"
    assert ranked["high"].refused == 0 and ranked["low"].refused > 0, figures
    assert plain["high"].refused == plain["low"].refused == 0, figures
    assert ranked["high"].answered > 0 and plain["high"].answered > 0, figures
    assert 1.5 * ranked["high"].p99_ms < plain["high"].p99_ms, figures
    assert 2 * ranked["high"].p50_ms < plain["high"].p50_ms, figures
    assert ranked["high"].p50_ms < ranked["low"].p50_ms, figures


@pytest.mark.slow  # a real server, both faces
def test_a_queued_request_of_a_client_that_left_never_runs_on_either_face(
    tmp_path: Path,
) -> None:
    """Through the real faces: a request whose HTTP client resets its connection, and one whose
    gRPC call is cancelled, while they wait for their batch (a queue delay of a second, on a
    model with levels), never run; the request that stayed is answered, alone in its run."""
    write_model(tmp_path, "ranked", 1, max_batch_size=8)
    path = tmp_path / "ranked" / CONFIG_FILENAME
    config = dataclasses.replace(
        load_model_config(path.read_text()), max_queue_delay_us=1_000_000, scheduling=TWO_LEVELS
    )
    path.write_text(config.to_pbtxt())
    grpc_port = free_port()
    env = {"GELU_INLINE_MAX_US": "0", "GELU_GRPC_PORT": str(grpc_port)}
    row = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}
    body = json.dumps({"inputs": [row], "parameters": {"priority": 1}}).encode()
    post = (f"POST /v2/models/ranked/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
    with running(tmp_path, **env) as (port, _):
        stays = socket.create_connection(("127.0.0.1", port), timeout=10)
        leaves = socket.create_connection(("127.0.0.1", port), timeout=10)
        stays.sendall(post)
        leaves.sendall(post)
        request = pb.ModelInferRequest(model_name="ranked")
        request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(np.full((1, 64), 0.5, "<f4").tobytes())
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request)
            time.sleep(0.3)  # all three wait for the batch's second
            leaves.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            leaves.close()  # a reset, as a client that gave up
            call.cancel()
            answer = stays.recv(65536)
        stays.close()
        stats = wait_until(lambda: ran(port), timeout=10, what="the batch ran")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert (stats["inference_count"], stats["execution_count"]) == (1, 1)


def ran(port: int) -> dict | None:
    """The model's statistics once a batch has run."""
    stats = json.loads(get(port, "/v2/models/ranked/stats")[1])["model_stats"][0]
    return stats if stats["execution_count"] else None
