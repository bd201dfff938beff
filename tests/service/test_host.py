"""The composition root: one core, the HTTP and gRPC faces started beside it as peers, and
every face describing a model the same way (``max_batch_size`` 0 and > 0 alike)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.host import Host
from service.settings import Settings
from tests.onnx_models import FEATURES, FIXED_ROWS, build_repository, write_model
from tests.service.rest.test_server import free_port

pytestmark = pytest.mark.slow  # real uvicorn and grpcio servers on loopback


class Running:
    def __init__(self, host: Host, http_port: int, grpc_port: int) -> None:
        self.host, self.http_port, self.grpc_port = host, http_port, grpc_port


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service tests' models and one without a batch axis."""
    root = build_repository(tmp_path_factory.mktemp("host_repository"))
    write_model(root, "fixed-mlp", 1, max_batch_size=0)
    return root


@pytest.fixture(scope="module")
def running(repository: Path) -> Iterator[Running]:
    http_port, grpc_port = free_port(), free_port()
    settings = Settings(model_repository=repository, grpc_port=grpc_port, warmup_runs=1)
    host = Host(settings)
    server = host.server("127.0.0.1", http_port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    assert server.started, "the host did not start"
    yield Running(host, http_port, grpc_port)
    server.should_exit = True
    thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(OSError):  # the host stopped its gRPC face with the HTTP one
        socket.create_connection(("127.0.0.1", grpc_port), timeout=5).close()


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
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    names = sorted(p.name for p in repository.iterdir())
    assert "fixed-mlp" in names
    for name in names:
        over_http = http.get_model_metadata(name)
        assert over_http == _grpc_metadata(grpc, name), name
        assert http.get_model_metadata(name, "1") == _grpc_metadata(grpc, name, "1"), name
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


def test_the_faces_share_the_hosts_core(running: Running) -> None:
    assert running.host.app.state.dataplane is running.host.core
    assert running.host.grpc is not None and running.host.grpc.plane is running.host.core


def test_a_grpc_port_in_use_refuses_to_start_in_one_line(
    repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio
    import logging

    from service.errors import StartupError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        host = Host(Settings(model_repository=repository, grpc_port=port, warmup_runs=0))

        async def start() -> None:
            async with host.lifespan():
                pass

        with (
            caplog.at_level(logging.ERROR, logger="gelu_serve"),
            pytest.raises(StartupError, match="GELU_GRPC_PORT"),
        ):
            asyncio.run(start())
    assert f"cannot start: gRPC: cannot bind 127.0.0.1:{port}" in caplog.text
    assert host.core.repository is None  # the core, started first, was stopped
