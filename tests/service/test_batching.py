"""The dynamic batcher on a real onnxruntime model."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvloop

import service.batching
from service.batching import (
    PATIENCE,
    QUIET_MS,
    Batcher,
    Batching,
    Deadline,
    Runs,
    Scheduler,
    _Request,
)
from service.errors import OverloadedError
from service.metrics import Metrics
from service.runtime import Model
from tests.helpers import DIGITS, load_model
from tests.onnx_models import write_variable


@pytest.fixture(scope="module")
def model(model_repository: Path) -> Model:
    return load_model(model_repository, "digits-mlp")


class Recorder:
    """Wraps a model's infer to record each run's batch size, and fail on demand."""

    def __init__(self, model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.fail = False
        real = model.infer

        def infer(inputs, outputs=None):
            self.sizes.append(len(inputs["input"]))
            if self.fail:
                raise RuntimeError("onnxruntime exploded")
            return real(inputs, outputs)

        monkeypatch.setattr(model, "infer", infer)


def run(coro):
    return asyncio.run(coro)


# A quiet that outlasts a test, from the second look in a row that finds no company: the tests
# that need one in force do not depend on how soon the machine runs them.
LONG_QUIET = (0, 60_000)


def started(
    model: Model,
    max_batch_size: int,
    delay_us: int,
    inline: bool = False,
    instances: int = 1,
    metrics: Metrics | None = None,
) -> Batcher:
    """A running batcher (call inside the event loop), with its own metrics unless given."""
    metrics = metrics or Metrics()
    runs = Runs(model, metrics)
    batcher = Batcher(model, max_batch_size, delay_us, metrics, runs, inline, instances=instances)
    batcher.start()
    return batcher


@pytest.fixture(params=[False, True], ids=["thread", "inline"])
def inline(request) -> bool:
    """Each batcher test runs with batches on a worker thread and on the event loop."""
    return request.param


def test_concurrent_requests_of_different_sizes_share_one_run(model, monkeypatch, inline) -> None:
    direct = model.infer({"input": DIGITS[:10]})
    recorder = Recorder(model, monkeypatch)
    sizes = [1, 3, 2, 4]
    offsets = np.cumsum([0, *sizes])

    async def scenario():
        batcher = started(model, 64, 50_000, inline)
        results = await asyncio.gather(*(
            batcher.infer({"input": DIGITS[a:b]}, ["probabilities"])
            for a, b in itertools.pairwise(offsets)
        ))  # fmt: skip
        await batcher.stop()
        return results

    results = run(scenario())
    assert recorder.sizes == [10]  # one onnxruntime run for all four requests
    for (a, b), result in zip(itertools.pairwise(offsets), results, strict=True):
        assert list(result) == ["probabilities"]
        np.testing.assert_allclose(result["probabilities"], direct["probabilities"][a:b], rtol=1e-6)


def test_batches_respect_the_maximum_size(model, monkeypatch, inline) -> None:
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 4, 20_000, inline)
        await asyncio.gather(*(batcher.infer({"input": DIGITS[:3]}) for _ in range(3)))
        # A request above the maximum runs alone instead of waiting forever.
        await batcher.infer({"input": DIGITS[:9]})
        await batcher.stop()

    run(scenario())
    assert recorder.sizes[:3] == [3, 3, 3] and recorder.sizes[3] == 9


def test_a_failed_batch_fails_every_request_in_it(model, monkeypatch, inline) -> None:
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 64, 20_000, inline)
        recorder.fail = True
        failed = await asyncio.gather(
            *(batcher.infer({"input": DIGITS[:2]}) for _ in range(3)), return_exceptions=True
        )
        recorder.fail = False
        after = await batcher.infer({"input": DIGITS[:2]})  # the batcher keeps serving
        await batcher.stop()
        return failed, after

    failed, after = run(scenario())
    assert recorder.sizes[0] == 6
    assert all(isinstance(e, RuntimeError) and "exploded" in str(e) for e in failed)
    assert after["logits"].shape == (2, 10)


def test_a_client_that_goes_away_does_not_disturb_the_others(model, monkeypatch, inline) -> None:
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 64, 50_000, inline)
        tasks = [asyncio.create_task(batcher.infer({"input": DIGITS[:n]})) for n in (1, 2, 4)]
        await asyncio.sleep(0.005)  # queued, the batch still gathering
        tasks[1].cancel()  # as when a client disconnects
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.stop()
        return results

    results = run(scenario())
    assert isinstance(results[1], asyncio.CancelledError)
    assert results[0]["logits"].shape == (1, 10) and results[2]["logits"].shape == (4, 10)
    assert recorder.sizes == [5]  # the departed request was never computed


@pytest.mark.parametrize("turns", range(PATIENCE + 4))
def test_a_batch_leader_that_goes_away_leaves_its_company_answered(
    model, monkeypatch, turns: int
) -> None:
    """Inline, the request that leads a batch waits outside the queue while the batcher looks
    for company; its client leaving at any turn of the look, or after it, leaves the requests
    that came answered, and nothing fails on the loop."""
    recorder = Recorder(model, monkeypatch)
    errors: list[dict] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        batcher = started(model, 64, 0, inline=True)
        leader = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0)  # it leads: the look is on
        company = [asyncio.ensure_future(batcher.infer({"input": DIGITS[:n]})) for n in (2, 3)]
        for _ in range(turns):
            await asyncio.sleep(0)
        leader.cancel()
        answers = await asyncio.wait_for(asyncio.gather(*company), 5)
        left = await asyncio.gather(leader, return_exceptions=True)
        await batcher.stop()
        return answers, left

    answers, (left,) = run(scenario())
    assert [a["logits"].shape for a in answers] == [(2, 10), (3, 10)]
    assert recorder.sizes in ([5], [6])  # without the leader, or with it if it had run
    assert isinstance(left, asyncio.CancelledError) or left["logits"].shape == (1, 10)
    assert errors == []


def test_zero_delay_runs_a_lone_request_at_once(model, monkeypatch, inline) -> None:
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 64, 0, inline)
        result = await asyncio.wait_for(batcher.infer({"input": DIGITS[:1]}), timeout=5)
        await batcher.stop()
        return result

    assert run(scenario())["logits"].shape == (1, 10)
    assert recorder.sizes == [1]


def test_zero_delay_batches_what_arrives_together_and_recovers_after_lone_requests(
    model, monkeypatch, inline
) -> None:
    """Requests queued in one loop iteration share a run; after a lone client (batches of one
    in a row), a burst of concurrent requests is batched again once the quiet ends, within
    QUIET_MS[-1] ms."""
    recorder = Recorder(model, monkeypatch)
    lone = 2 * len(QUIET_MS)

    async def scenario():
        batcher = started(model, 64, 0, inline)
        for _ in range(lone):  # a lone client
            await batcher.infer({"input": DIGITS[:1]})
        await asyncio.sleep(QUIET_MS[-1] / 1000 + 0.01)  # after the quiet's timer, if any
        for _ in range(2):  # bursts of 8 concurrent requests
            await asyncio.gather(*(batcher.infer({"input": DIGITS[i : i + 1]}) for i in range(8)))
        await batcher.stop()

    run(scenario())
    assert recorder.sizes == [1] * lone + [8, 8]  # the bursts are one run each again


async def after(iterations: int, coro_factory):
    """``coro_factory()`` awaited after ``iterations`` turns of the event loop."""
    for _ in range(iterations):
        await asyncio.sleep(0)
    return await coro_factory()


def test_zero_delay_gathers_while_requests_keep_coming(model, monkeypatch) -> None:
    """Inline, with no queue delay, a batch waits for as long as requests keep coming: a
    request arriving within PATIENCE loop iterations of the one before joins its batch; one
    arriving an iteration later than that is a batch of its own."""
    recorder = Recorder(model, monkeypatch)
    joins = 1 + PATIENCE  # PATIENCE iterations after the request before it
    arrivals = [0, 0, 1, joins, joins + PATIENCE + 1]  # the loop iteration each request comes in

    async def scenario():
        batcher = started(model, 64, 0, inline=True)
        results = await asyncio.gather(*(
            after(n, lambda i=i: batcher.infer({"input": DIGITS[i : i + 1]}))
            for i, n in enumerate(arrivals)
        ))  # fmt: skip
        await batcher.stop()
        return results

    results = run(scenario())
    assert recorder.sizes == [4, 1]
    direct = model.infer({"input": DIGITS[:5]})["probabilities"]
    for i, result in enumerate(results):  # each request its own row, in order
        np.testing.assert_allclose(result["probabilities"], direct[i : i + 1], rtol=1e-6)


@pytest.mark.parametrize("delay_us", [300, 1500])
def test_a_queue_delay_is_kept_to_the_microsecond_on_uvloop(model, inline, delay_us) -> None:
    """A request that looks for company waits its model's whole queue delay on uvloop, the
    service's loop, whose own timers round 300 µs to nothing and 1500 µs to 1 ms or 2
    (``service.alarm``)."""

    async def scenario() -> float:
        batcher = started(model, 64, delay_us, inline)
        await batcher.infer({"input": DIGITS[:1]})  # the worker thread started, the run warm
        began = time.perf_counter()
        await batcher.infer({"input": DIGITS[:1]})
        waited = time.perf_counter() - began
        await batcher.stop()
        return waited

    assert uvloop.run(scenario()) >= delay_us / 1e6


def test_zero_delay_gathering_stops_at_the_maximum_size(model, monkeypatch) -> None:
    """The batch a request leads stops gathering when the queue is full: the request that
    fills it runs it (the four queued after the leader), and the leader then runs itself with
    the one that came after."""
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 4, 0, inline=True)
        await asyncio.gather(*(
            after(n, lambda: batcher.infer({"input": DIGITS[:1]})) for n in (0, 0, 1, 1, 2, 2)
        ))  # fmt: skip
        await batcher.stop()

    run(scenario())
    assert recorder.sizes == [4, 2]


def test_an_inline_request_whose_deadline_passed_while_gathering_fails(model, monkeypatch) -> None:
    """Inline requests have no timer: one whose deadline passed while its batch gathered is
    failed as it is taken into the batch, not run late; the others run."""
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        batcher = started(model, 64, 0, inline=True)
        passed = Deadline(time.perf_counter_ns() - 10**9, 1)
        results = await asyncio.gather(
            batcher.infer({"input": DIGITS[:1]}),
            batcher.infer({"input": DIGITS[:2]}, deadline=passed),
            batcher.infer({"input": DIGITS[:3]}),
            return_exceptions=True,
        )
        await batcher.stop()
        return results

    first, late, third = run(scenario())
    assert isinstance(late, OverloadedError) and "Request timeout expired" in str(late)
    assert first["logits"].shape == (1, 10) and third["logits"].shape == (3, 10)
    assert recorder.sizes == [4]  # the late request was never computed


def test_a_queued_request_never_fails_before_its_deadline_on_uvloop(model, monkeypatch) -> None:
    """Queued behind a batch that holds the one worker thread, a request with a 1400 µs
    timeout fails, but not before 1400 µs, though uvloop's timers round that to 1 ms."""
    release = threading.Event()
    real = model.infer

    def held(inputs, outputs=None):
        release.wait(10)
        return real(inputs, outputs)

    monkeypatch.setattr(model, "infer", held)

    async def scenario() -> int:
        batcher = started(model, 64, 0)
        first = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0.01)  # its batch is running, holding the worker thread
        began = time.perf_counter_ns()
        with pytest.raises(OverloadedError, match="Request timeout expired"):
            await batcher.infer({"input": DIGITS[:1]}, deadline=Deadline(began, 1400))
        failed_after = time.perf_counter_ns() - began
        release.set()
        await first
        await batcher.stop()
        return failed_after

    assert uvloop.run(scenario()) >= 1400 * 1000


def test_a_lone_client_looks_for_company_ever_more_rarely(model, monkeypatch) -> None:
    """Driven as the data plane drives it (``bypass``, else ``infer``), each look of a lone
    client's that finds no company starts a quiet of QUIET_MS[n - 1] ms, the n-th in a row (the
    last entry from then on); in a quiet the batcher is not called; a batch with company ends
    the look count, so the next look that finds none starts no quiet."""
    recorder = Recorder(model, monkeypatch)
    quiets: list[int] = []
    bypassed = [0]

    async def scenario():
        loop = asyncio.get_running_loop()
        batcher = started(model, 64, 0, inline=True)
        timer = loop.call_later

        def call_later(delay, callback, *args):
            if callback == batcher._listen:  # the quiet this look starts
                quiets[-1] = round(delay * 1000)
            return timer(delay, callback, *args)

        monkeypatch.setattr(loop, "call_later", call_later)
        for _ in range(len(QUIET_MS) + 2):
            quiets.append(0)
            await batcher.infer({"input": DIGITS[:1]})  # a look that finds none
            while batcher.bypass:  # the quiet: the data plane runs its requests itself
                bypassed[0] += 1
                await asyncio.sleep(0.001)
        await asyncio.gather(*(batcher.infer({"input": DIGITS[i : i + 1]}) for i in range(4)))
        await batcher.infer({"input": DIGITS[:1]})
        after_burst = batcher.quiet
        await batcher.stop()
        return after_burst

    assert run(scenario()) is False
    assert quiets == [*QUIET_MS, QUIET_MS[-1], QUIET_MS[-1]]
    assert bypassed[0] > 0
    assert recorder.sizes == [1] * (len(QUIET_MS) + 2) + [4, 1]  # only the looks ran here


def test_readme_quotes_the_quiet_and_the_patience() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
    readme = " ".join(page.read_text().split())
    assert f"after {PATIENCE} iterations in a row that brought none" in readme
    assert f"for {', '.join(map(str, QUIET_MS[1:]))} ms" in readme
    assert f"pays those {PATIENCE + 1} iterations once every {QUIET_MS[-1]} ms)" in readme
    assert f"again within {QUIET_MS[-1]} ms" in readme


def test_a_lone_client_is_never_queued_inline(model, monkeypatch) -> None:
    """Inline, a lone client's requests run at once, the ones that look for company too: none
    is queued, which costs more than its run (a look awaits only its end)."""
    recorder = Recorder(model, monkeypatch)
    queued = []
    monkeypatch.setattr("service.batching._Request", lambda *a, **k: queued.append(a))

    async def scenario():
        batcher = started(model, 64, 0, inline=True)
        for _ in range(2 * len(QUIET_MS)):
            await batcher.infer({"input": DIGITS[:1]})
            await asyncio.sleep(0.001)
        await batcher.stop()

    run(scenario())
    assert recorder.sizes == [1] * (2 * len(QUIET_MS)) and queued == []


def test_bypass_only_inline_in_a_quiet(model, monkeypatch) -> None:
    """``bypass`` sends a request past the batcher only inline and in a quiet (from the second
    look in a row that found no company): a batcher on threads in a quiet still takes each
    request, and bounds the runs by its instances. The looks are in the queue-time histogram;
    a request the data plane runs itself is not (it has no queue)."""
    monkeypatch.setattr("service.batching.QUIET_MS", LONG_QUIET)
    metrics = Metrics()
    states = []

    async def scenario():
        on_threads = started(model, 64, 0)
        batcher = started(model, 64, 0, inline=True, metrics=metrics)
        for each in (on_threads, batcher):
            for _ in range(2):
                states.append((each.quiet, each.bypass))
                await each.infer({"input": DIGITS[:1]})
            states.append((each.quiet, each.bypass))
        await on_threads.stop()
        await batcher.stop()
        states.append((batcher.quiet, batcher.bypass))

    run(scenario())
    quiet, looking = (True, True), (False, False)
    assert states == [looking, looking, (True, False), looking, looking, quiet, looking]
    labels = {"model": model.name}
    assert metrics.registry.get_sample_value("gelu_batch_queue_seconds_count", labels) == 2


def test_batching_through_the_app(settings_factory) -> None:
    """Batching on and off give the same answers; /metrics shows batches and queue time."""
    from fastapi.testclient import TestClient

    from service.rest.app import create_app

    answers = []
    for batching in (True, False):
        with TestClient(create_app(settings_factory(batching=batching))) as client:
            response = client.post(
                "/v1/models/digits-mlp:predict", json={"instances": DIGITS[:5].tolist()}
            )
            answers.append([p["probabilities"] for p in response.json()["predictions"]])
            metrics = client.get("/metrics").text
            assert ('gelu_batch_queue_seconds_count{model="digits-mlp"}' in metrics) is batching
            assert 'gelu_batch_size_count{model="digits-mlp"} 1.0' in metrics
    np.testing.assert_allclose(answers[0], answers[1], rtol=1e-6)


def test_instances_run_batches_at_once(model, monkeypatch) -> None:
    """With instance_group count 2, two batches run on worker threads at the same time."""
    running, overlap = [0], [0]
    real = model.infer
    lock = threading.Lock()

    def infer(inputs, outputs=None):
        with lock:
            running[0] += 1
            overlap[0] = max(overlap[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return real(inputs, outputs)

    monkeypatch.setattr(model, "infer", infer)

    async def scenario(instances: int) -> None:
        batcher = started(model, 1, 0, instances=instances)
        await asyncio.gather(*(batcher.infer({"input": DIGITS[i : i + 1]}) for i in range(4)))
        await batcher.stop()

    for instances, expected in ((1, 1), (2, 2)):
        overlap[0] = 0
        run(scenario(instances))
        assert overlap[0] == expected


async def into_the_longest_quiet(batcher: Batcher) -> None:
    """A lone client's looks for company, each after the quiet the one before started, until
    the batcher is in its longest quiet: len(QUIET_MS) requests (as ``service.batching`` has
    it now)."""
    while batcher._lonely < len(service.batching.QUIET_MS):
        while batcher.quiet:
            await asyncio.sleep(0.001)
        await batcher.infer({"input": DIGITS[:1]})
    assert batcher.quiet


def test_a_lone_client_on_threads_skips_the_queue_in_a_quiet(model, monkeypatch) -> None:
    """On worker threads, a lone client's looks for company go through the queue and the
    gathering task; in a quiet its requests take the free instance at once, unqueued; of a burst
    that comes in a quiet, the first takes the free instance and the rest gather behind it as
    one batch, which ends the quiet: the next burst is one batch again."""
    recorder = Recorder(model, monkeypatch)
    queued = [0]

    def request(*args, **kwargs) -> _Request:
        queued[0] += 1
        return _Request(*args, **kwargs)

    monkeypatch.setattr("service.batching._Request", request)
    monkeypatch.setattr("service.batching.QUIET_MS", LONG_QUIET)

    async def scenario():
        batcher = started(model, 64, 0)
        await into_the_longest_quiet(batcher)
        looked = queued[0]
        for _ in range(3):
            await batcher.infer({"input": DIGITS[:1]})
        in_quiet = queued[0] - looked
        for _ in range(2):  # bursts of 8 concurrent requests
            await asyncio.gather(*(batcher.infer({"input": DIGITS[i : i + 1]}) for i in range(8)))
        await batcher.stop()
        return looked, in_quiet

    assert run(scenario()) == (len(LONG_QUIET), 0)
    assert recorder.sizes == [1] * (len(LONG_QUIET) + 3) + [1, 7, 8]


def test_a_client_that_leaves_a_run_alone_on_threads_holds_its_instance(model, monkeypatch) -> None:
    """A request run alone on the one instance whose client leaves meanwhile: its run finishes
    on the thread, holding the instance, and the requests that come meanwhile gather behind it
    into one batch instead of being handed to the busy thread one by one."""
    release = threading.Event()
    sizes: list[int] = []
    real = model.infer

    def infer(inputs, outputs=None):
        sizes.append(len(inputs["input"]))
        if len(sizes) == len(LONG_QUIET) + 1:  # the first run in the quiet: held
            release.wait(10)
        return real(inputs, outputs)

    monkeypatch.setattr(model, "infer", infer)
    monkeypatch.setattr("service.batching.QUIET_MS", LONG_QUIET)

    async def scenario():
        batcher = started(model, 64, 0)
        await into_the_longest_quiet(batcher)  # the next request takes the free instance
        leaving = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0.01)  # running alone, on the instance
        leaving.cancel()
        waiting = [asyncio.ensure_future(batcher.infer({"input": DIGITS[:2]}))]
        await asyncio.sleep(0.01)
        waiting.append(asyncio.ensure_future(batcher.infer({"input": DIGITS[:3]})))
        await asyncio.sleep(0.01)
        none_ran = not any(w.done() for w in waiting)
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=5)
        await batcher.stop()
        return leaving.cancelled(), none_ran, results

    left, none_ran, results = run(scenario())
    assert left and none_ran
    assert [r["logits"].shape for r in results] == [(2, 10), (3, 10)]
    assert sizes == [1] * (len(LONG_QUIET) + 1) + [5]


def test_an_inline_batcher_runs_every_batch_on_the_loop(model, monkeypatch) -> None:
    """Inline, a request that comes while a batch gathers joins it, on the loop, even when a
    full batch of one ran meanwhile and left lone runs to come (``_ran``): never a thread."""
    threads: list[threading.Thread] = []
    real = model.infer

    def infer(inputs, outputs=None):
        threads.append(threading.current_thread())
        return real(inputs, outputs)

    monkeypatch.setattr(model, "infer", infer)

    async def scenario():
        batcher = started(model, 4, 0, inline=True)
        for _ in range(2):  # two batches of one: the next request probes, and leads a batch
            await batcher.infer({"input": DIGITS[:1]})
        results = await asyncio.gather(
            batcher.infer({"input": DIGITS[:1]}),  # leads, gathering
            after(1, lambda: batcher.infer({"input": DIGITS[:4]})),  # full alone: a third of one
            after(2, lambda: batcher.infer({"input": DIGITS[:2]})),  # comes while it gathers
        )
        await batcher.stop()
        return results

    results = run(scenario())
    assert [r["logits"].shape[0] for r in results] == [1, 4, 2]
    assert threads and all(t is threading.main_thread() for t in threads), threads


@pytest.fixture(scope="module")
def variable(tmp_path_factory: pytest.TempPathFactory) -> Model:
    root = tmp_path_factory.mktemp("variable")
    write_variable(root, "varlen")
    return load_model(root, "varlen")


@pytest.mark.parametrize("delay_us", [0, 20_000])
def test_requests_of_other_shapes_never_share_a_run(
    variable, monkeypatch, inline, delay_us
) -> None:
    """Issue 62, item 2 (batch poisoning): concurrent requests of shapes [1, 3] and [1, 5] for
    a variable dim were concatenated into one run, outside its ``try``: the run's requests got
    500 or never an answer. A batch holds only requests that stack; every one is answered."""
    shapes: list[set[tuple[int, ...]]] = []
    real = variable.infer

    def infer(inputs, outputs=None):
        shapes.append({inputs["x"].shape[1:]})
        return real(inputs, outputs)

    monkeypatch.setattr(variable, "infer", infer)
    rows = [np.full((1, 3 if i % 2 else 5), i, np.float32) for i in range(16)]

    async def scenario():
        batcher = started(variable, 8, delay_us, inline)
        answers = await asyncio.wait_for(
            asyncio.gather(*(batcher.infer({"x": x}) for x in rows)), timeout=10
        )
        await batcher.stop()
        return answers

    for x, answer in zip(rows, run(scenario()), strict=True):
        np.testing.assert_array_equal(answer["y"], 2 * x)
    assert sum(len(s) for s in shapes) == len(shapes) < len(rows)  # one shape a run, batched


def test_a_request_that_fails_its_batch_fails_alone(model, monkeypatch, inline) -> None:
    """A run that fails for one request of a batch runs its requests again one by one: only
    the request that fails on its own gets the error (issue 62, "one run path")."""
    sizes: list[int] = []
    real = model.infer

    def infer(inputs, outputs=None):
        sizes.append(len(inputs["input"]))
        if (inputs["input"] < 0).any():
            raise RuntimeError("onnxruntime refused a value")
        return real(inputs, outputs)

    monkeypatch.setattr(model, "infer", infer)
    bad = -DIGITS[:1]

    async def scenario():
        batcher = started(model, 64, 20_000, inline)
        answers = await asyncio.wait_for(asyncio.gather(
            batcher.infer({"input": DIGITS[:2]}), batcher.infer({"input": bad}),
            batcher.infer({"input": DIGITS[2:5]}), return_exceptions=True,
        ), timeout=10)  # fmt: skip
        await batcher.stop()
        return answers

    good, failed, other = run(scenario())
    assert isinstance(failed, RuntimeError) and "refused" in str(failed)
    assert good["logits"].shape == (2, 10) and other["logits"].shape == (3, 10)
    assert sizes == [6, 2, 1, 3]  # the batch, then each alone


def test_every_request_taken_is_answered_whatever_fails(model, monkeypatch, inline) -> None:
    """A fault after the run (splitting its outputs) still answers every request of the batch,
    with the error, and the batcher serves on: no request waits forever."""
    calls = 0
    real = Batcher._split_and_record

    def split(self, *args):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("split went wrong")
        return real(self, *args)

    monkeypatch.setattr(Batcher, "_split_and_record", split)

    async def scenario():
        batcher = started(model, 64, 20_000, inline)
        failed = await asyncio.wait_for(asyncio.gather(
            *(batcher.infer({"input": DIGITS[:2]}) for _ in range(3)), return_exceptions=True
        ), timeout=10)  # fmt: skip
        after = await asyncio.wait_for(batcher.infer({"input": DIGITS[:1]}), timeout=10)
        await batcher.stop()
        return failed, after

    failed, after = run(scenario())
    assert all(isinstance(e, ValueError) for e in failed), failed
    assert after["logits"].shape == (1, 10)


def test_stopping_fails_a_batch_still_gathering(model) -> None:
    """Requests taken into a batch that waits out its queue delay when the batcher stops are
    failed, not left waiting."""

    async def scenario():
        batcher = started(model, 64, 5_000_000)  # a delay that outlasts the test
        waiting = asyncio.ensure_future(batcher.infer({"input": DIGITS[:1]}))
        await asyncio.sleep(0.05)
        await batcher.stop()
        return await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 5)

    (error,) = run(scenario())
    assert isinstance(error, RuntimeError) and "shutting down" in str(error)


def scheduler(model: Model, inline_batch: int, max_batch_size: int = 0) -> Scheduler:
    """A started scheduler (call inside the event loop), with its own metrics."""
    metrics = Metrics()
    built = Scheduler(model, Runs(model, metrics), metrics, inline_batch, max_batch_size)
    built.start()
    return built


@pytest.mark.parametrize("inline_batch", [0, 64], ids=["thread", "inline"])
def test_a_scheduler_without_batching_runs_each_request_alone(
    model, monkeypatch, inline_batch: int
) -> None:
    """A version that does not batch runs each request alone, on the loop within its inline
    bound or on a thread, counted as a run of one request."""
    threads: list[int] = []
    real = model.infer

    def infer(inputs, outputs=None):
        threads.append(threading.get_ident())
        return real(inputs, outputs)

    async def scenario():
        built = scheduler(model, inline_batch)
        assert built.batching is None
        answer = await built.run({"input": DIGITS[:3]}, 3, ["logits"])
        await built.stop()
        return built, answer

    monkeypatch.setattr(model, "infer", infer)
    built, answer = run(scenario())
    assert list(answer) == ["logits"] and answer["logits"].shape == (3, 10)
    assert built.runs.statistics.execution_count == 1
    assert (threads == [threading.get_ident()]) is bool(inline_batch)


def test_a_scheduler_batches_within_its_inline_bound_and_runs_larger_requests_alone(
    model, monkeypatch
) -> None:
    """Batching on, inline: requests that arrive together share one run on the loop, in
    batches within the inline bound; a request larger than the bound runs alone on a thread,
    past the batcher."""
    recorder = Recorder(model, monkeypatch)

    async def scenario():
        built = scheduler(model, inline_batch=4, max_batch_size=64)
        assert built.batching == Batching(4, True, 1)
        answers = await asyncio.gather(
            *(built.run({"input": DIGITS[i : i + 1]}, 1) for i in range(4)),
            built.run({"input": DIGITS[:9]}, 9),
        )
        await built.stop()
        return answers

    answers = run(scenario())
    assert sorted(recorder.sizes) == [4, 9]
    assert [a["logits"].shape[0] for a in answers] == [1, 1, 1, 1, 9]


def test_a_stopped_scheduler_answers_every_request(model) -> None:
    """Stopping fails what waits in a batch; a request that comes after the stop (none should:
    the repository stops a version once it has drained) is answered by a run of its own,
    never left waiting on a batcher whose gathering has ended."""

    async def scenario():
        built = Scheduler(model, Runs(model, Metrics()), Metrics(), 0, 64, 5_000_000)
        built.start()
        waiting = asyncio.ensure_future(built.run({"input": DIGITS[:1]}, 1))
        await asyncio.sleep(0.05)  # in a batch waiting out its delay
        await built.stop()
        (error,) = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 5)
        late = await asyncio.wait_for(built.run({"input": DIGITS[:2]}, 2), 5)
        return error, late, built.batching

    error, late, batching = run(scenario())
    assert isinstance(error, RuntimeError) and "shutting down" in str(error)
    assert late["logits"].shape == (2, 10) and batching is None
