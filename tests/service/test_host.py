"""The composition root: one core and one model control, the HTTP and gRPC faces started beside
it as peers and stopped before it, and every face describing a model the same way
(``max_batch_size`` 0 and > 0 alike)."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.dataplane import DataPlane
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import SERVICE
from service.host import STOPPED, Host
from service.settings import Settings
from tests.onnx_models import FEATURES, FIXED_ROWS, build_repository, write_model
from tests.servers import free_port, get, on_thread, post, probed, refusal, wait_until

pytestmark = pytest.mark.slow  # real uvicorn and grpcio servers on loopback


def listens(port: int) -> bool:
    """Whether something accepts connections on loopback ``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


class RecordedCore(DataPlane):
    """The core, recording when it starts and stops and whether the faces listened then."""

    def __init__(self, settings: Settings, ports: tuple[int, int]) -> None:
        super().__init__(settings)
        self.ports = ports
        self.events: list[tuple[str, bool, bool]] = []

    async def start(self) -> None:
        self.events.append(("start", *map(listens, self.ports)))  # type: ignore[arg-type]
        await super().start()

    async def stop(self) -> None:
        self.events.append(("stop", *map(listens, self.ports)))  # type: ignore[arg-type]
        await super().stop()


class Running:
    """A host serving in a thread of this process (``servers.on_thread``: the test stops it
    with ``Host.stop``)."""

    def __init__(self, settings: Settings) -> None:
        self.http_port, self.grpc_port = free_port(), settings.grpc_port
        self.core = RecordedCore(settings, (self.http_port, self.grpc_port))
        self.host = Host(settings, self.core)
        self.thread = on_thread(partial(self.host.run, "127.0.0.1", self.http_port), self.http_port)

    def stop(self, signum: int) -> None:
        self.host.stop(signum)
        self.thread.join(60)
        assert not self.thread.is_alive()

    def stub(self) -> pb_grpc.GRPCInferenceServiceStub:
        return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.grpc_address))

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service tests' models and one without a batch axis."""
    root = build_repository(tmp_path_factory.mktemp("host_repository"))
    write_model(root, "fixed-mlp", 1, max_batch_size=0)
    return root


@pytest.fixture(scope="module")
def running(repository: Path) -> Iterator[Running]:
    settings = Settings(model_repository=repository, grpc_port=free_port(), warmup_runs=1)
    served = Running(settings)
    yield served
    served.stop(signal.SIGINT)
    # The faces stopped before the core, and neither listens after.
    assert served.core.events == [("start", False, False), ("stop", False, False)]
    assert not listens(served.http_port) and not listens(served.grpc_port)


def _grpc_metadata(client: object, name: str, version: str = "") -> dict:
    """tritonclient.grpc's metadata as JSON, its int64 shapes (strings in JSON) as ints."""
    metadata = client.get_model_metadata(name, version, as_json=True)  # type: ignore[attr-defined]
    for key in ("inputs", "outputs"):
        for tensor in metadata[key]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]
    return metadata


def test_every_face_describes_every_model_alike(running: Running, repository: Path) -> None:
    import httpx
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
    grpc_client = grpcclient.InferenceServerClient(running.grpc_address)
    names = sorted(p.name for p in repository.iterdir())
    assert "fixed-mlp" in names
    for name in names:
        over_http = http.get_model_metadata(name)
        assert over_http == _grpc_metadata(grpc_client, name), name
        assert http.get_model_metadata(name, "1") == _grpc_metadata(grpc_client, name, "1"), name
        v1 = httpx.get(f"http://127.0.0.1:{running.http_port}/v1/models/{name}").json()
        assert (v1["inputs"], v1["outputs"]) == (over_http["inputs"], over_http["outputs"])
        expected = [FIXED_ROWS, FEATURES] if name == "fixed-mlp" else [-1, FEATURES]
        assert over_http["inputs"][0]["shape"] == expected, name


def test_a_model_without_a_batch_axis_serves_on_both_faces(running: Running) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = np.random.default_rng(0).random((FIXED_ROWS, FEATURES), dtype=np.float32)
    answers = []
    for module, port in ((httpclient, running.http_port), (grpcclient, running.grpc_port)):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = module.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answers.append(client.infer("fixed-mlp", [tensor]).as_numpy("probabilities"))
    assert answers[0].shape == (FIXED_ROWS, 10)
    np.testing.assert_array_equal(answers[0], answers[1])


def test_the_faces_share_the_hosts_core_and_control(running: Running) -> None:
    host = running.host
    assert host.app.state.dataplane is host.core and host.app.state.control is host.control
    assert host.grpc is not None and host.grpc.plane is host.core
    assert host.grpc.servicers[SERVICE].control is host.control
    # The host started the core once, itself: the app's lifespan did not run under it.
    assert [event for event, *_ in running.core.events] == ["start"]


def test_model_control_on_one_face_is_seen_by_the_other(repository: Path) -> None:
    settings = Settings(
        model_repository=repository,
        grpc_port=free_port(),
        warmup_runs=0,
        model_control_mode="explicit",
        load_models=["digits-mlp"],
    )
    served = Running(settings)
    try:
        stub = served.stub()
        assert not stub.ModelReady(pb.ModelReadyRequest(name="fixed-mlp")).ready
        status, _ = post(served.http_port, "/v2/repository/models/fixed-mlp/load")
        assert status == 200
        assert stub.ModelReady(pb.ModelReadyRequest(name="fixed-mlp")).ready
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="fixed-mlp"))
        assert get(served.http_port, "/v2/models/fixed-mlp/ready")[0] == 503  # not loaded
    finally:
        served.stop(signal.SIGINT)


def test_sigterm_drains_both_faces_then_stops_them_before_the_core(repository: Path) -> None:
    """SIGTERM: readiness turns 503 on HTTP and NOT_SERVING on gRPC at once, while both still
    serve; after the drain both faces stop, and only then the core."""
    settings = Settings(
        model_repository=repository, grpc_port=free_port(), warmup_runs=0, drain_seconds=2
    )
    served = Running(settings)
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(served.grpc_address))
    check = health_pb2.HealthCheckRequest(service=SERVICE)
    stub = served.stub()
    assert health.Check(check).status == health_pb2.HealthCheckResponse.SERVING
    began = time.monotonic()
    served.host.stop(signal.SIGTERM)
    # Bounds, not judgements: past the drain there is no draining left to see.
    wait_until(
        lambda: get(served.http_port, "/v2/health/ready")[0] == 503,
        timeout=settings.drain_seconds,
    )
    wait_until(
        lambda: health.Check(check).status == health_pb2.HealthCheckResponse.NOT_SERVING,
        timeout=settings.drain_seconds,
    )
    assert not stub.ServerReady(pb.ServerReadyRequest()).ready
    # Draining, both faces still serve, and the core has not been stopped.
    assert get(served.http_port, "/v2/health/live")[0] == 200
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ModelMetadata(pb.ModelMetadataRequest(name="fixed-mlp")).name == "fixed-mlp"
    assert served.core.events == [("start", False, False)] and served.thread.is_alive()
    served.thread.join(30)
    assert not served.thread.is_alive()
    assert time.monotonic() - began >= settings.drain_seconds
    assert served.core.events == [("start", False, False), ("stop", False, False)]


@pytest.mark.parametrize("taken_face", ["grpc", "http"])
def test_a_port_in_use_stops_start_up_in_one_line(repository: Path, taken_face: str) -> None:
    env = {"GELU_MODEL_REPOSITORY": str(repository), "GELU_WARMUP_RUNS": "0"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if taken_face == "grpc":
            result = refusal({**env, "GELU_GRPC_PORT": str(port)}, port=free_port())
            needle = f"cannot start: gRPC: cannot bind 127.0.0.1:{port}"
        else:
            result = refusal({**env, "GELU_GRPC_PORT": str(free_port())}, port=port)
            needle = f"('127.0.0.1', {port}): address already in use"
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    assert len([line for line in output.splitlines() if needle in line]) == 1, output
    assert STOPPED not in output  # it never served


def test_sigterm_stops_a_served_process_with_both_faces(repository: Path) -> None:
    """`gelu-serve serve` with both faces: SIGTERM drains (logged once), both faces close, the
    core stops last, and the process exits 0."""
    grpc_port = free_port()
    env = {"GELU_WARMUP_RUNS": "0", "GELU_GRPC_PORT": str(grpc_port), "GELU_DRAIN_SECONDS": "0.5"}
    with probed(repository, None, env) as (http_port, process):
        stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        assert stub.ServerReady(pb.ServerReadyRequest()).ready
    output = process.output  # type: ignore[attr-defined]  # no traceback in it: the harness
    assert process.returncode == 0, output
    lines = output.splitlines()
    drained = [i for i, line in enumerate(lines) if "draining for 0.5 s" in line]
    stopped = [i for i, line in enumerate(lines) if STOPPED in line]
    assert len(drained) == 1 and len(stopped) == 1 and drained[0] < stopped[0], output
    assert not listens(http_port) and not listens(grpc_port)
