"""The serving core on its own: built, started, used and stopped with no web framework; and,
through the app, what it refuses under overload (a full queue, a passed deadline) and the
queued requests of clients that left, which never run."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import onnxruntime as ort
import pytest

from service.activations import CHUNK
from service.batching import Batching
from service.dataplane import DataPlane
from service.errors import BadInputError, NotFoundError, NotReadyError, PayloadTooLargeError
from service.inference import InferenceRequest, RequestInput, RequestOutput
from service.rest.app import create_app
from service.runtime import Model
from tests.helpers import DIGITS, assert_error

V1 = "/v1/models/slow:predict"
ROW = DIGITS[0].tolist()


@pytest.mark.anyio
async def test_core_runs_inference_and_activations_without_fastapi(
    settings_factory, model_repository: Path
) -> None:
    core = DataPlane(settings_factory())
    assert not core.ready
    with pytest.raises(NotReadyError):
        core.model("digits-mlp")
    await core.start()
    try:
        assert core.ready
        assert sorted(core.model_names()) == ["digits-autoencoder", "digits-mlp", "digits-mlp-tanh"]
        x = DIGITS[:3]
        request = InferenceRequest([RequestInput(x, "input", "FP32")])
        result = await core.infer("digits-mlp", None, request)
        assert result.model.version == "2" and result.model.label_names[0] == "0"
        session = ort.InferenceSession(str(model_repository / "digits-mlp/2/model.onnx"))
        want = session.run(["probabilities"], {"input": x})[0]
        np.testing.assert_array_equal(result.outputs["probabilities"], want)
        assert list(result.outputs) == ["logits", "probabilities"]

        y = await core.activations.evaluate("gelu", np.array([-1.0, 0.0, 1.0], np.float32))
        np.testing.assert_allclose(y, [-0.15865526, 0.0, 0.8413447], rtol=1e-6)
    finally:
        await core.stop()
    assert not core.ready
    with pytest.raises(NotReadyError):
        await core.activations.evaluate("gelu", np.zeros(1, np.float32))


@pytest.mark.anyio
async def test_activations_run_one_at_a_time_per_core(
    settings_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent activation requests never evaluate more at once than the process has cores
    (each evaluation on one onnxruntime thread, the default): more would only share cores and
    hold more memory."""
    core = DataPlane(settings_factory(inline_max_us=0))  # every array on a thread
    await core.start()
    try:
        evaluator = core.activations._started()
        running, most, lock = 0, 0, threading.Lock()
        evaluate = evaluator.evaluate

        def counted(*args: object) -> np.ndarray:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            try:
                threading.Event().wait(0.02)  # long enough for the others to pile up
                return evaluate(*args)  # type: ignore[arg-type]
            finally:
                with lock:
                    running -= 1

        monkeypatch.setattr(evaluator, "evaluate", counted)
        x = np.linspace(-3, 3, 1000, dtype=np.float32)
        cores = len(os.sched_getaffinity(0))
        async with anyio.create_task_group() as group:
            for _ in range(2 * cores + 2):  # more than the cores, on any machine
                group.start_soon(core.activations.evaluate, "gelu", x)
        assert most == cores
    finally:
        await core.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("bound_us", [0, 50_000])
async def test_small_arrays_evaluate_on_the_event_loop(
    settings_factory, monkeypatch: pytest.MonkeyPatch, bound_us: int
) -> None:
    """Arrays that every kernel evaluates within GELU_INLINE_MAX_US (timed at start-up) run
    on the event loop; larger ones, and every one with a bound of 0, on a thread."""
    core = DataPlane(settings_factory(inline_max_us=bound_us))
    await core.start()
    try:
        evaluator = core.activations._started()
        threads: list[int] = []
        evaluate = evaluator.evaluate

        def recorded(*args: Any) -> np.ndarray:
            threads.append(threading.get_ident())
            return evaluate(*args)

        monkeypatch.setattr(evaluator, "evaluate", recorded)
        limit = core.activations._inline
        assert (limit == 0) if bound_us == 0 else (256 <= limit <= CHUNK)
        for size in (1, limit, limit + 1) if limit else (1, 1000):
            x = np.linspace(-3, 3, size, dtype=np.float32)
            np.testing.assert_array_equal(
                await core.activations.evaluate("gelu", x), evaluate("gelu", x)
            )
        on_loop = [t == threading.get_ident() for t in threads]
        assert on_loop == ([False, False] if bound_us == 0 else [True, True, False])
    finally:
        await core.stop()


@pytest.mark.anyio
async def test_core_checks_requests_against_the_model(settings_factory) -> None:
    core = DataPlane(settings_factory(max_activation_elements=10))
    await core.start()
    try:
        row = DIGITS[:1]
        cases = [
            (InferenceRequest([RequestInput(row, "pixels", "FP32")]), BadInputError,
             "unknown input"),
            (InferenceRequest([RequestInput(row, "input", "FP64")]), BadInputError, "FP64"),
            (InferenceRequest([RequestInput(row[:, :63], "input", "FP32")]), BadInputError,
             "does not match the model's [-1, 64]"),
            (InferenceRequest([RequestInput(np.zeros((0, 64)), None)]), BadInputError,
             "empty batch"),
            (InferenceRequest([RequestInput(np.zeros((300, 64)), None)]), PayloadTooLargeError,
             "batch of 300 is above the maximum of 256"),
            (InferenceRequest([]), BadInputError, "missing input(s) ['input']"),
            (InferenceRequest([RequestInput(row, None)], [RequestOutput("nope")]),
             BadInputError, "unknown output 'nope'"),
        ]  # fmt: skip
        for request, error, needle in cases:
            with pytest.raises(error) as caught:
                await core.infer("digits-mlp", None, request)
            assert needle in str(caught.value), (needle, caught.value)
        with pytest.raises(NotFoundError, match="unknown model 'nope'"):
            await core.infer("nope", None, InferenceRequest([RequestInput(row, None)]))
        with pytest.raises(PayloadTooLargeError, match="GELU_MAX_ACTIVATION_ELEMENTS"):
            await core.activations.evaluate("gelu", np.zeros(11, np.float32))
        with pytest.raises(NotFoundError, match="unknown activation 'swish'"):
            await core.activations.evaluate("swish", np.zeros(1, np.float32))
    finally:
        await core.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("batching", [True, False])
async def test_cheap_batches_run_on_the_loop_and_larger_ones_on_a_thread(
    settings_factory, monkeypatch, batching: bool
) -> None:
    """Batches within the inline bound (timed at start) run on the event loop; a request
    larger than that runs on a worker thread, with the same answers either way."""
    threads: list[int] = []
    real_infer = Model.infer

    def infer(self, inputs, outputs=None):
        threads.append(threading.get_ident())
        return real_infer(self, inputs, outputs)

    monkeypatch.setattr(Model, "largest_batch_within", lambda self, budget, largest: (4, 1.0))
    monkeypatch.setattr(Model, "infer", infer)
    core = DataPlane(settings_factory(batching=batching))
    await core.start()
    try:
        loop_thread = threading.get_ident()
        assert core.repository is not None
        batches = core.repository.get("digits-mlp", "2").scheduler.batching
        assert batches == (Batching(4, True, 1) if batching else None)
        threads.clear()
        small = await core.infer("digits-mlp", None, InferenceRequest([RequestInput(DIGITS[:4])]))
        large = await core.infer("digits-mlp", None, InferenceRequest([RequestInput(DIGITS[:9])]))
        assert threads[0] == loop_thread and threads[1] != loop_thread
        np.testing.assert_array_equal(small.outputs["logits"], large.outputs["logits"][:4])
    finally:
        await core.stop()


@pytest.mark.anyio
async def test_inline_bound_zero_runs_everything_on_threads(settings_factory) -> None:
    core = DataPlane(settings_factory(inline_max_us=0))
    await core.start()
    try:
        assert core.repository is not None
        batches = [s.scheduler.batching for s in core.repository.all()]
        assert not any(b and b.inline for b in batches)
        result = await core.infer("digits-mlp", None, InferenceRequest([RequestInput(DIGITS[:2])]))
        assert result.outputs["logits"].shape == (2, 10)
    finally:
        await core.stop()


# ---- overload and deadlines, through the app --------------------------------------------------


@asynccontextmanager
async def serving(settings_factory, **overrides) -> AsyncIterator[httpx.AsyncClient]:
    """An async client over the real app, its lifespan run; batches on worker threads."""
    app = create_app(settings_factory(inline_max_us=0, **overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def slow_settings(settings_factory, slow_repository: Path):
    def make(**overrides):
        return settings_factory(model_repository=slow_repository, **overrides)

    return make


async def burst(client: httpx.AsyncClient, count: int, body: dict) -> list[httpx.Response]:
    return await asyncio.gather(*(client.post(V1, json=body) for _ in range(count)))


def test_a_full_queue_answers_503_with_retry_after(settings_factory, slow_repository) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make, max_queue_size=4) as client:
            responses = await burst(client, 40, {"instances": [ROW]})
            codes = [r.status_code for r in responses]
            assert set(codes) == {200, 503}, codes
            assert codes.count(200) >= 4
            refused = next(r for r in responses if r.status_code == 503)
            assert refused.headers["retry-after"] == "1"
            assert_error(refused, 503, "GELU_MAX_QUEUE_SIZE")
            # The queue drained: the service serves again.
            assert (await client.post(V1, json={"instances": [ROW]})).status_code == 200

    asyncio.run(scenario())


def test_a_request_past_its_timeout_is_refused_not_run_late(
    settings_factory, slow_repository
) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make) as client:
            entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW}
            body = {"inputs": [entry], "parameters": {"timeout": 1}}  # 1 µs, as Triton's
            responses = await asyncio.gather(
                *(client.post("/v2/models/slow/infer", json=body) for _ in range(20))
            )
            late = [r for r in responses if r.status_code == 503]
            assert late, [r.status_code for r in responses]
            assert_error(late[0], 503, "Request timeout expired")
            assert late[0].headers["retry-after"] == "1"
            stats = (await client.get("/v2/models/slow/stats")).json()["model_stats"][0]
            # Refused requests never ran: every sample that ran belongs to a 200.
            ran = stats["inference_count"]
            assert ran == sum(r.status_code == 200 for r in responses)
            # Without a timeout the same burst runs whole.
            del body["parameters"]
            ok = await asyncio.gather(
                *(client.post("/v2/models/slow/infer", json=body) for _ in range(20))
            )
            assert {r.status_code for r in ok} == {200}

    asyncio.run(scenario())


def test_a_default_timeout_applies_to_every_request(settings_factory, slow_repository) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make, default_timeout_us=1) as client:
            codes = [r.status_code for r in await burst(client, 20, {"instances": [ROW]})]
            assert 503 in codes, codes

    asyncio.run(scenario())


def test_a_client_that_goes_away_has_its_queued_request_dropped(
    settings_factory, slow_repository
) -> None:
    """Requests cancelled while queued (as the server cancels a lost connection's) never
    run; the others are answered."""

    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make) as client:
            tasks = [
                asyncio.create_task(client.post(V1, json={"instances": [ROW] * 8}))
                for _ in range(30)
            ]
            await asyncio.sleep(0.003)  # the first batches run; the rest wait
            for task in tasks[5:]:
                task.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            answered = [r for r in done if isinstance(r, httpx.Response)]
            assert all(r.status_code == 200 for r in answered)
            stats = (await client.get("/v2/models/slow/stats")).json()["model_stats"][0]
            assert stats["inference_count"] < 30 * 8, stats["inference_count"]
            assert (await client.post(V1, json={"instances": [ROW]})).status_code == 200

    asyncio.run(scenario())
