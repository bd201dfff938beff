"""The core's readiness (``DataPlane.ready``, ``check_model_ready``) as both faces answer it,
in every model control mode: docs/serving.md's "Readiness". Server readiness is read on HTTP
(``/v2/health/ready``), gRPC (``ServerReady``) and gRPC health at once; a model's on HTTP
(``/v2/models/{m}/ready``) and gRPC (``ModelReady``)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.control import ModelControl
from service.dataplane import DataPlane
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import SERVICE, GrpcServer
from service.rest.app import create_app
from tests.helpers import DIGITS, until

pytestmark = pytest.mark.anyio

READY = (200, True, "SERVING")
NOT_READY = (503, False, "NOT_SERVING")
SERVING = (200, "ready")
NOT_LOADED = (503, "not ready")  # in the repository, not serving: 503 and ready=false
UNKNOWN = (404, "NOT_FOUND")
BROKEN = 'max_batch_size: "x"\n'  # appended, a config.pbtxt the parser refuses


@dataclass
class Faces:
    """Both faces of one started core, as a client reaches them."""

    core: DataPlane
    http: httpx.AsyncClient
    stub: pb_grpc.GRPCInferenceServiceStub
    health: health_pb2_grpc.HealthStub
    samples: list[tuple[int, bool, str]] = field(default_factory=list)

    async def server(self) -> tuple[int, bool, str]:
        """Server readiness: HTTP status, gRPC ServerReady, gRPC health."""
        status = (await self.http.get("/v2/health/ready")).status_code
        ready = (await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=10)).ready
        check = await self.health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
        return status, ready, health_pb2.HealthCheckResponse.ServingStatus.Name(check.status)

    async def reads(self, want: tuple[int, bool, str]) -> None:
        """Until server readiness reads ``want`` on every face (health follows on the loop)."""

        async def read() -> bool:
            return await self.server() == want

        await until(read, f"every face reports {want}")

    async def model(self, name: str, version: str = "") -> tuple[int, str]:
        """A model's readiness: HTTP status (V2's, and KServe V1's the same), and gRPC's
        ready flag or status code."""
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
        status = (await self.http.get(path)).status_code
        if not version:
            v1 = (await self.http.get(f"/v1/models/{name}")).status_code
            assert v1 == status, (name, v1, status)
        try:
            answer = await self.stub.ModelReady(pb.ModelReadyRequest(name=name, version=version))
        except grpc.aio.AioRpcError as exc:
            return status, exc.code().name
        return status, "ready" if answer.ready else "not ready"

    async def sampled(self, operation: Awaitable[Any]) -> tuple[Any, int]:
        """``operation``'s result, with server readiness sampled on both faces for as long
        as it runs (into ``samples``), and how many samples that took."""
        task = asyncio.ensure_future(operation)
        taken = 0
        while not task.done():
            self.samples.append(await self.server())
            taken += 1
        return await task, taken

    async def infer(self, name: str) -> tuple[int, int]:
        """One request for ``name`` on each face: HTTP's status, gRPC's output count."""
        row = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}
        status = await self.http.post(f"/v2/models/{name}/infer", json={"inputs": [row]})
        request = pb.ModelInferRequest(model_name=name)
        request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(DIGITS[:1].astype("<f4").tobytes())
        answer = await self.stub.ModelInfer(request, timeout=30)
        return status.status_code, len(answer.raw_output_contents)


@asynccontextmanager
async def faces(settings_factory: Any, repository: Path, **overrides: Any) -> AsyncIterator[Faces]:
    """A core over ``repository`` started with both faces over it, on loopback."""
    settings = settings_factory(model_repository=repository, warmup_runs=0, **overrides)
    core = DataPlane(settings)
    app = create_app(core=core)
    async with app.router.lifespan_context(app):
        server = GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")
        await server.start()
        transport = httpx.ASGITransport(app=app)
        try:
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://t") as http,
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            ):
                health = health_pb2_grpc.HealthStub(channel)
                yield Faces(core, http, pb_grpc.GRPCInferenceServiceStub(channel), health)
        finally:
            await server.stop(1)


def break_config(repository: Path, name: str) -> bytes:
    """Make ``name``'s config.pbtxt one that fails to load; its old bytes."""
    config = repository / name / "config.pbtxt"
    original = config.read_bytes()
    config.write_bytes(original + BROKEN.encode())
    return original


@pytest.mark.parametrize("mode", ["none", "poll"])
async def test_every_model_of_the_repository_must_serve(
    settings_factory, repo: Path, mode: str
) -> None:
    """none and poll: the models in the repository at start. One that fails to load keeps
    the server not ready (MLServer#2056) until it loads; one that leaves the repository (poll)
    is no longer needed, and its ready answer is 404."""
    original = break_config(repo, "digits-mlp-tanh")
    overrides = {"model_control_mode": mode, "exit_on_error": False}
    async with faces(settings_factory, repo, repository_poll_seconds=0.05, **overrides) as f:
        assert await f.server() == NOT_READY
        assert await f.model("digits-mlp") == SERVING
        assert await f.model("digits-mlp-tanh") == NOT_LOADED  # failed: not ready, not unknown
        assert await f.model("nope") == UNKNOWN
        assert await f.model("digits-mlp", "9") == UNKNOWN  # a version it never had
        (repo / "digits-mlp-tanh" / "config.pbtxt").write_bytes(original)
        if mode == "none":  # nothing reads the repository again
            await asyncio.sleep(0.3)
            assert await f.server() == NOT_READY
            return
        await until(lambda: f.core.ready, "the poller loaded the fixed model")
        await f.reads(READY)
        assert await f.model("digits-mlp-tanh") == SERVING
        shutil.rmtree(repo / "digits-autoencoder")
        await until(lambda: "digits-autoencoder" not in f.core.model_names(), "unloaded")
        assert await f.server() == READY
        assert await f.model("digits-autoencoder") == UNKNOWN


async def test_explicit_loads_reloads_and_unloads_never_flip_it(settings_factory, repo) -> None:
    """explicit: GELU_LOAD_MODELS. Readiness, sampled on both faces while each operation runs,
    never flips: loading another model (Triton#7014), one that fails, reloading a configured
    one (its old version serves meanwhile), unloading another; and the operator's unload of a
    configured model takes it off what the server must serve."""
    break_config(repo, "digits-autoencoder")
    async with faces(
        settings_factory, repo, model_control_mode="explicit", load_models=["digits-mlp"]
    ) as f:
        assert await f.server() == READY
        assert await f.model("digits-mlp-tanh") == NOT_LOADED
        loaded, taken = await f.sampled(f.http.post("/v2/repository/models/digits-mlp-tanh/load"))
        assert loaded.status_code == 200 and taken
        assert await f.model("digits-mlp-tanh") == SERVING
        failed, taken = await f.sampled(
            f.http.post("/v2/repository/models/digits-autoencoder/load")
        )
        assert failed.status_code == 400 and taken
        before = f.core.started_repository().get("digits-mlp", "2")
        model_file = repo / "digits-mlp" / "2" / "model.onnx"
        stat = model_file.stat()
        os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # changed: reload
        reload = f.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="digits-mlp"))
        _, taken = await f.sampled(reload)
        assert taken
        assert f.core.started_repository().get("digits-mlp", "2") is not before  # reloaded
        unload = pb.RepositoryModelUnloadRequest(model_name="digits-mlp-tanh")
        _, taken = await f.sampled(f.stub.RepositoryModelUnload(unload))
        assert await f.model("digits-mlp-tanh") == NOT_LOADED
        assert f.samples and set(f.samples) == {READY}, set(f.samples)
        index = (await f.http.post("/v2/repository/index", json={})).json()
        assert {"name": "digits-mlp", "version": "2", "state": "READY", "reason": ""} in index
        # The operator's unload of a configured model: not ready itself, the server still is.
        assert (await f.http.post("/v2/repository/models/digits-mlp/unload")).status_code == 200
        assert await f.model("digits-mlp") == NOT_LOADED
        assert await f.server() == READY


async def test_on_demand_evictions_never_flip_it(settings_factory, repo: Path) -> None:
    """on_demand: the pinned models. Requests that load a model and evict another, sampled on
    both faces throughout, never flip it; an evicted model answers not ready (it loads again at
    its next request), not unknown."""
    async with faces(
        settings_factory, repo, model_control_mode="on_demand", pinned_models=["digits-mlp"],
        max_loaded_models=2,
    ) as f:  # fmt: skip
        assert await f.server() == READY
        for name in ["digits-mlp-tanh", "digits-autoencoder"] * 2:
            (status, outputs), taken = await f.sampled(f.infer(name))
            assert status == 200 and outputs and taken
        residency = f.core.on_demand.residency if f.core.on_demand else {}
        assert residency["digits-mlp-tanh"].evictions == 2
        assert residency["digits-autoencoder"].evictions == 1
        assert f.samples and set(f.samples) == {READY}, set(f.samples)
        assert await f.model("digits-mlp-tanh") == NOT_LOADED  # evicted, loadable
        assert await f.model("digits-autoencoder") == SERVING
        assert await f.model("digits-mlp") == SERVING  # pinned
        assert await f.model("nope") == UNKNOWN


@pytest.mark.parametrize("pinned", [[], ["digits-mlp-tanh"]])
async def test_on_demand_needs_its_pinned_models_alone(
    settings_factory, repo: Path, pinned: list[str]
) -> None:
    """With nothing pinned it is ready with nothing loaded (any model loads at its first
    request); a pinned model that fails to load keeps it not ready."""
    break_config(repo, "digits-mlp-tanh")
    async with faces(
        settings_factory, repo, model_control_mode="on_demand", pinned_models=pinned,
        exit_on_error=False,
    ) as f:  # fmt: skip
        assert await f.server() == (NOT_READY if pinned else READY)
        assert f.core.model_names() == []
        assert await f.model("digits-mlp") == NOT_LOADED
        assert await f.model("nope") == UNKNOWN


async def test_a_drain_turns_readiness_first_while_requests_complete(
    settings_factory, model_repository: Path
) -> None:
    """From the moment the core drains, the server and every model answer not ready on both
    faces, while requests already sent and new ones still complete: the models unload only
    when the service stops."""
    async with faces(settings_factory, model_repository) as f:
        assert await f.server() == READY
        sent = asyncio.gather(f.infer("digits-mlp"), f.infer("digits-autoencoder"))
        f.core.drain()
        await asyncio.sleep(0)  # gRPC health is told on the loop
        assert await f.server() == NOT_READY
        assert await f.model("digits-mlp") == NOT_LOADED  # 503 and ready=false: draining
        assert await f.model("nope") == UNKNOWN
        assert await sent == [(200, 2), (200, 1)]
        assert await f.infer("digits-mlp-tanh") == (200, 2)
        assert sorted(f.core.model_names()) == [
            "digits-autoencoder", "digits-mlp", "digits-mlp-tanh",
        ]  # fmt: skip
        v1 = await f.http.post("/v1/models/digits-mlp:predict", json={"instances": [[0.0] * 64]})
        assert v1.status_code == 200


async def test_without_strict_readiness_a_failed_model_leaves_the_server_ready(
    settings_factory, repo: Path
) -> None:
    """GELU_STRICT_READINESS=false, as Triton's --strict-readiness=false: the server is ready
    once started though a configured model failed to load; that model's own answer still
    says it does not serve, and a drain still turns the server not ready."""
    break_config(repo, "digits-mlp-tanh")
    overrides = {"exit_on_error": False, "strict_readiness": False}
    async with faces(settings_factory, repo, **overrides) as f:
        await f.reads(READY)
        assert await f.model("digits-mlp-tanh") == NOT_LOADED
        assert await f.model("digits-mlp") == SERVING
        f.core.drain()
        await f.reads(NOT_READY)
