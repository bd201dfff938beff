"""Triton's schedule policy on the gRPC face, in process over loopback: the ``priority`` and
``timeout`` parameters (int64 and uint64), a call's deadline as the request's timeout when it
comes sooner, and a cancelled call's request out of the queue, never run."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from contract.model_config import QueuePolicy, SchedulingPolicy, load_model_config
from contract.names import CONFIG_FILENAME
from service.control import ModelControl
from service.dataplane import DataPlane
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import GrpcServer, client_deadline
from tests.helpers import Gate
from tests.onnx_models import write_model

# Two levels, the default the lower; the lower holds at most one waiting request.
RANKED = SchedulingPolicy(2, 2, None, ((2, QueuePolicy(max_queue_size=1)),))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpc-policies")
    write_model(root, "ranked", 1, max_batch_size=4)
    path = root / "ranked" / CONFIG_FILENAME
    config = load_model_config(path.read_text())
    path.write_text(dataclasses.replace(config, scheduling=RANKED).to_pbtxt())
    return root


@asynccontextmanager
async def serving(settings) -> AsyncIterator[tuple[DataPlane, pb_grpc.GRPCInferenceServiceStub]]:
    """The core and its gRPC face, started in this loop; a stub over loopback."""
    core = DataPlane(settings)
    async with core.running():
        server = GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                yield core, pb_grpc.GRPCInferenceServiceStub(channel)
        finally:
            await server.stop(1)


def request(mark: int, **parameters: int) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="ranked")
    message.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(np.full((1, 64), float(mark), "<f4").tobytes())
    for key, value in parameters.items():
        if key.startswith("u_"):
            message.parameters[key[2:]].uint64_param = value
        else:
            message.parameters[key].int64_param = value
    return message


@pytest.fixture
def settings(settings_factory, repository: Path):
    return settings_factory(model_repository=repository, inline_max_us=0)


def test_priority_orders_requests_int64_or_uint64(settings, monkeypatch) -> None:
    async def scenario() -> list[list[int]]:
        async with serving(settings) as (core, stub):
            gate = Gate(core, "ranked", monkeypatch)
            first = asyncio.ensure_future(stub.ModelInfer(request(1)))
            await gate.first_running()
            low = asyncio.ensure_future(stub.ModelInfer(request(2, priority=2)))
            await gate.queued(1)
            high = [
                asyncio.ensure_future(stub.ModelInfer(request(3, priority=1))),
                asyncio.ensure_future(stub.ModelInfer(request(4, u_priority=1, timeout=9_000_000))),
            ]
            await gate.queued(3)
            gate.open.set()
            await asyncio.gather(first, low, *high)
            return gate.runs

    runs = asyncio.run(scenario())
    assert runs[0] == [1] and sorted(runs[1][:2]) == [3, 4] and runs[-1][-1] == 2


def test_a_full_level_is_unavailable(settings, monkeypatch) -> None:
    async def scenario() -> grpc.aio.AioRpcError:
        async with serving(settings) as (core, stub):
            gate = Gate(core, "ranked", monkeypatch)
            first = asyncio.ensure_future(stub.ModelInfer(request(1)))
            await gate.first_running()
            held = asyncio.ensure_future(stub.ModelInfer(request(2)))
            await gate.queued(1)
            refused = request(3)
            refused.id = "g-1"
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.ModelInfer(refused)
            gate.open.set()
            await asyncio.gather(first, held)
            return failed.value

    failed = asyncio.run(scenario())
    assert failed.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.details().startswith("[request id: g-1] Exceeds maximum queue size")


def test_a_call_past_its_deadline_or_cancelled_never_runs(settings, monkeypatch) -> None:
    """A queued request whose call's deadline passes, or whose client cancels the call, leaves
    the queue at once (the level's one place is free again for the next) and never runs."""

    async def scenario() -> tuple[grpc.StatusCode, list[list[int]], bool]:
        async with serving(settings) as (core, stub):
            gate = Gate(core, "ranked", monkeypatch)
            first = asyncio.ensure_future(stub.ModelInfer(request(1)))
            await gate.first_running()
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.ModelInfer(request(2), timeout=0.05)
            await gate.queued(0)  # out of the queue at its deadline
            cancelled = stub.ModelInfer(request(3))
            await gate.queued(1)
            cancelled.cancel()
            await gate.queued(0)  # out at once
            after = asyncio.ensure_future(stub.ModelInfer(request(4)))  # the place is free
            await gate.queued(1)
            gate.open.set()
            await asyncio.gather(first, after)
            return late.value.code(), gate.runs, cancelled.cancelled()

    code, runs, cancelled = asyncio.run(scenario())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and cancelled
    assert runs == [[1], [4]]


def test_a_call_deadline_is_when_its_client_stops_waiting() -> None:
    now = time.perf_counter_ns()
    soon = client_deadline(SimpleNamespace(time_remaining=lambda: 0.25))
    assert soon is not None and 0.24e9 < soon - now < 0.3e9
    assert client_deadline(SimpleNamespace(time_remaining=lambda: None)) is None
    assert client_deadline(SimpleNamespace()) is None  # a context that cannot say (Ray's)
    past = client_deadline(SimpleNamespace(time_remaining=lambda: -1.0))
    assert past is not None and past - now < 0.05e9  # already passed: no time left
