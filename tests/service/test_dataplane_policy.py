"""Triton's schedule policy through the core and the HTTP face, in process: the ``priority``
and ``timeout`` request parameters (V2 JSON and binary) under a model's config.pbtxt policy,
a level's ``max_queue_size``, a request's timeout only where the policy lets it override, a
gRPC deadline as the timeout when it comes sooner, and clients that leave."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from contract.model_config import QueuePolicy, SchedulingPolicy, load_model_config
from contract.names import CONFIG_FILENAME
from service.errors import DeadlineExceededError
from service.inference import InferenceRequest, RequestInput
from service.rest.app import create_app
from tests.helpers import Gate, assert_error, until
from tests.onnx_models import write_model

# Level 1 refuses a request 200 ms after it came, or sooner if the request says so; level 2
# (the default) holds at most one waiting request, with the server's timeout.
RANKED = SchedulingPolicy(
    priority_levels=2,
    default_priority_level=2,
    priority_queue_policy=(
        (1, QueuePolicy(default_timeout_us=200_000, allow_timeout_override=True)),
        (2, QueuePolicy(max_queue_size=1)),
    ),
)
# One queue whose timeout a request may not change.
STRICT = SchedulingPolicy(default_queue_policy=QueuePolicy(default_timeout_us=10_000_000))


def with_policy(root: Path, name: str, scheduling: SchedulingPolicy) -> None:
    """A small classifier batching up to 4, whose config.pbtxt gives ``scheduling``."""
    write_model(root, name, 1, max_batch_size=4)
    path = root / name / CONFIG_FILENAME
    config = load_model_config(path.read_text())
    path.write_text(dataclasses.replace(config, scheduling=scheduling).to_pbtxt())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("policies")
    with_policy(root, "ranked", RANKED)
    with_policy(root, "strict", STRICT)
    write_model(root, "plain", 1, max_batch_size=4)
    return root


@asynccontextmanager
async def serving(settings_factory, repository: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An async client over the real app, its lifespan run; batches on worker threads."""
    app = create_app(settings_factory(model_repository=repository, inline_max_us=0))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def body(mark: int, **parameters) -> dict:
    entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [float(mark)] * 64}
    return {"inputs": [entry], "parameters": parameters}


def infer(client: httpx.AsyncClient, model: str, mark: int, **parameters) -> asyncio.Future:
    return asyncio.ensure_future(
        client.post(f"/v2/models/{model}/infer", json=body(mark, **parameters))
    )


def plane_of(client: httpx.AsyncClient):
    return client.app.state.dataplane  # type: ignore[attr-defined]


def test_priority_and_timeout_travel_in_v2_json_and_binary(settings_factory, repository) -> None:
    async def scenario() -> list[httpx.Response]:
        async with serving(settings_factory, repository) as client:
            x = np.full((1, 64), 0.5, np.float32)
            header = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                  "parameters": {"binary_data_size": x.nbytes}}],
                      "parameters": {"priority": 1, "timeout": 5_000_000}}  # fmt: skip
            text = json.dumps(header).encode()
            binary = await client.post(
                "/v2/models/ranked/infer",
                content=text + x.tobytes(),
                headers={"Inference-Header-Content-Length": str(len(text)),
                         "Content-Type": "application/octet-stream"},
            )  # fmt: skip
            answers = [binary]
            for model in ("ranked", "strict", "plain"):  # a model without levels takes any
                for priority in (0, 1, 2, 7):
                    answers.append(await infer(client, model, 1, priority=priority, timeout=0))
            return answers

    for answer in asyncio.run(scenario()):
        assert answer.status_code == 200, answer.text


def test_requests_run_highest_level_first(settings_factory, repository, monkeypatch) -> None:
    """Priority 1 is the highest level; 0 is the model's default level (2 here)."""

    async def scenario() -> list[list[int]]:
        async with serving(settings_factory, repository) as client:
            gate = Gate(plane_of(client), "ranked", monkeypatch)
            first = infer(client, "ranked", 1)
            await gate.first_running()
            low = infer(client, "ranked", 2, priority=0)
            await gate.queued(1)
            high = [infer(client, "ranked", mark, priority=1) for mark in (3, 4, 5, 6)]
            await gate.queued(5)
            gate.open.set()
            answers = await asyncio.gather(first, low, *high)
            assert [a.status_code for a in answers] == [200] * 6
            return gate.runs

    assert asyncio.run(scenario()) == [[1], [3, 4, 5, 6], [2]]  # batches of up to 4


def test_a_full_level_answers_503_in_tritons_words(
    settings_factory, repository, monkeypatch
) -> None:
    async def scenario() -> tuple[httpx.Response, list[list[int]]]:
        async with serving(settings_factory, repository) as client:
            gate = Gate(plane_of(client), "ranked", monkeypatch)
            first = infer(client, "ranked", 1)
            await gate.first_running()
            held = infer(client, "ranked", 2)  # level 2's one place
            await gate.queued(1)
            refused = await client.post("/v2/models/ranked/infer", json={**body(3), "id": "r-42"})
            high = infer(client, "ranked", 4, priority=1)  # level 1 is not full
            await gate.queued(2)
            gate.open.set()
            answers = await asyncio.gather(first, held, high)
            assert [a.status_code for a in answers] == [200] * 3
            return refused, gate.runs

    refused, runs = asyncio.run(scenario())
    assert_error(refused, 503, "[request id: r-42] Exceeds maximum queue size")
    assert refused.headers["retry-after"] == "1"
    assert runs == [[1], [4, 2]]


def test_a_request_shortens_its_timeout_only_where_the_policy_allows(
    settings_factory, repository, monkeypatch
) -> None:
    """Level 1 of ``ranked`` allows a request's own, shorter timeout: past it, 503 "Request
    timeout expired" before it runs. ``strict`` does not: a request's 1 ms is ignored and it
    runs, later than that, within the policy's 10 s."""

    async def scenario() -> tuple[httpx.Response, httpx.Response, list[list[int]], list[list[int]]]:
        async with serving(settings_factory, repository) as client:
            plane = plane_of(client)
            ranked = Gate(plane, "ranked", monkeypatch)
            strict = Gate(plane, "strict", monkeypatch)
            holding = [infer(client, "ranked", 1), infer(client, "strict", 1)]
            await ranked.first_running()
            await strict.first_running()
            short = infer(client, "ranked", 2, priority=1, timeout=1_000)
            ignored = infer(client, "strict", 2, timeout=1_000)
            # refused at 1 ms, while the instance is still busy
            await until(short.done, "the short request refused", every=0.001)
            await strict.queued(1)
            await asyncio.sleep(0.01)  # past its 1 ms, still queued
            ranked.open.set()
            strict.open.set()
            await asyncio.gather(*holding)
            return await short, await ignored, ranked.runs, strict.runs

    short, ignored, ranked_runs, strict_runs = asyncio.run(scenario())
    assert_error(short, 503, "Request timeout expired: not started within 1000 µs")
    assert "queue policy in config.pbtxt" in short.json()["error"]
    assert ranked_runs == [[1]]  # refused before it ran
    assert ignored.status_code == 200 and strict_runs == [[1], [2]]


def test_a_client_deadline_sooner_than_the_timeout_is_the_deadline(
    settings_factory, repository, monkeypatch
) -> None:
    """A client's own deadline (a gRPC call's) that comes before the policy's timeout is the
    request's deadline, refused at it whatever the action; a later one changes nothing."""

    async def scenario() -> list[Any]:
        async with serving(settings_factory, repository) as client:
            plane = plane_of(client)
            gate = Gate(plane, "ranked", monkeypatch)
            holding = infer(client, "ranked", 1)
            await gate.first_running()

            def request(mark: int, seconds: float) -> InferenceRequest:
                array = np.full((1, 64), float(mark), np.float32)
                given = InferenceRequest([RequestInput(array, "input", "FP32")], priority=1)
                given.client_deadline_ns = time.perf_counter_ns() + int(seconds * 1e9)
                return given

            soon = asyncio.ensure_future(plane.infer("ranked", None, request(2, 0.01)))
            late = asyncio.ensure_future(plane.infer("ranked", None, request(3, 60)))
            await until(soon.done, "the request due soon answered", every=0.001)
            await gate.queued(1)
            gate.open.set()
            answers = await asyncio.gather(holding, soon, late, return_exceptions=True)
            return [*answers, gate.runs]

    _, soon, late, runs = asyncio.run(scenario())
    assert isinstance(soon, DeadlineExceededError) and "its gRPC deadline" in str(soon)
    assert late.outputs["logits"].shape == (1, 10)
    assert runs == [[1], [3]]


def test_a_queued_request_whose_client_left_never_runs(
    settings_factory, repository, monkeypatch
) -> None:
    """The HTTP face cancels the request of a client that left: queued, it leaves the queue at
    once (its level's place is free again), and never runs."""

    async def scenario() -> tuple[int, list[list[int]]]:
        async with serving(settings_factory, repository) as client:
            gate = Gate(plane_of(client), "ranked", monkeypatch)
            first = infer(client, "ranked", 1)
            await gate.first_running()
            leaving = infer(client, "ranked", 2)  # level 2's one place
            await gate.queued(1)
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            after = infer(client, "ranked", 3)  # admitted: the place is free
            await gate.queued(1)
            gate.open.set()
            answers = await asyncio.gather(first, after)
            return answers[1].status_code, gate.runs

    status, runs = asyncio.run(scenario())
    assert status == 200 and runs == [[1], [3]]


def test_the_configuration_and_the_extension_say_so(settings_factory, repository) -> None:
    async def scenario() -> tuple[dict, dict, list[str]]:
        async with serving(settings_factory, repository) as client:
            ranked = (await client.get("/v2/models/ranked/config")).json()
            plain = (await client.get("/v2/models/plain/config")).json()
            extensions = (await client.get("/v2")).json()["extensions"]
            return ranked, plain, extensions

    ranked, plain, extensions = asyncio.run(scenario())
    batching = ranked["dynamic_batching"]
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 2
    assert batching["priority_queue_policy"]["2"]["max_queue_size"] == 1
    assert batching["priority_queue_policy"]["1"]["allow_timeout_override"] is True
    assert "priority_levels" not in plain["dynamic_batching"]
    assert "schedule_policy" in extensions
