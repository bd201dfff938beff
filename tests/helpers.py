"""Helpers shared by the service tests: inputs, requests, the error shape, a model loaded on
its own, the settings -> core -> app -> client chain (and a core started alone), waiting in a
coroutine, and a gate that holds a model's first run so that requests queue behind it."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pytest
    from fastapi.testclient import TestClient

    from service.dataplane import DataPlane
    from service.inference import InferenceRequest
    from service.runtime import Model
    from service.settings import Settings

# Real digits, scaled as the models expect (pixel / 16).
DIGITS: np.ndarray = np.random.default_rng(0).random((300, 64), dtype=np.float32)


def _load_digits() -> np.ndarray:
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # serving-only install: random inputs of the right shape
        return DIGITS
    return (load_digits().data[:300] / 16.0).astype(np.float32)


DIGITS = _load_digits()


def assert_error(response, status: int, needle: str) -> None:
    """A 4xx/5xx with exactly the one error shape, whose message says what was wrong."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"], body
    assert needle in body["error"], body["error"]


def digits_request(rows: int = 1, timeout_us: int | None = None) -> InferenceRequest:
    """The first ``rows`` digits for the test models' ``input``, waiting at most ``timeout_us``
    (the V2 ``timeout`` parameter)."""
    from service.inference import InferenceRequest, RequestInput

    return InferenceRequest([RequestInput(DIGITS[:rows], "input", "FP32")], timeout_us=timeout_us)


def load_model(repository: Path, name: str, version: int | None = None, warmup: int = 1) -> Model:
    """One version of a repository's model (default: the highest), loaded on the CPU."""
    from service.onnxrt import OnnxRuntime, SessionFactory, session_options
    from service.repository.layout import load_version, read_config, version_dirs

    sessions = SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False)
    model_dir = repository / name
    chosen = version or max(version_dirs(model_dir))
    return load_version(model_dir, chosen, read_config(model_dir), OnnxRuntime(sessions), warmup)


# One row of the test models' input, as a JSON list.
ROW = [0.5] * 64


def v2_body(**changes: Any) -> dict[str, Any]:
    """A V2 JSON body of one ``ROW`` for the test models' ``input``, ``changes`` made to its
    entry."""
    entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW, **changes}
    return {"inputs": [entry]}


INTEGER_MAX = {"int64_param": 2**63 - 1, "uint64_param": 2**64 - 1}


def put_parameters(target: Any, values: dict[str, Any], integer: str = "int64_param") -> None:
    """``values`` into a protobuf parameters map (a tensor's or a request's): strings as
    ``string_param``, integers as ``integer``, cut to that field's largest value."""
    for key, value in values.items():
        if isinstance(value, str):
            target[key].string_param = value
        else:
            setattr(target[key], integer, min(value, INTEGER_MAX[integer]))


def predict(client: TestClient, model: str) -> int:
    """The status of a V1 prediction of one digit by ``model``."""
    body = {"instances": DIGITS[:1].tolist()}
    return client.post(f"/v1/models/{model}:predict", json=body).status_code


def binary_request(
    x: np.ndarray, outputs: list[dict] | None = None, **extra: Any
) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body for the ``input`` tensor ``x``: JSON header, then the raw
    tensor; and its headers."""
    header: dict = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        **extra,
    }  # fmt: skip
    if outputs is not None:
        header["outputs"] = outputs
    text = json.dumps(header).encode()
    return text + x.astype("<f4").tobytes(), {
        "Inference-Header-Content-Length": str(len(text)),
        "Content-Type": "application/octet-stream",
    }


def service_settings(repository: Path, **overrides: Any) -> Settings:
    """Settings over ``repository`` for a test: one warm-up run and the gRPC face off (a
    test that wants it passes ``grpc_port``), with ``overrides``."""
    from service.settings import Settings

    defaults = {"model_repository": repository, "warmup_runs": 1, "grpc_port": 0}
    return Settings(**{**defaults, **overrides})


def start_app(repository: Path) -> None:
    """The app over ``repository`` with the default settings, its lifespan run: started, then
    stopped; a refusal to start raises (``StartupError``)."""
    from fastapi.testclient import TestClient

    from service.rest.app import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(model_repository=repository))):
        pass


@contextmanager
def app_client(settings: Settings) -> Iterator[TestClient]:
    """A TestClient over the real app built from ``settings``, its lifespan run (models
    loaded and warmed) for as long as the block lasts."""
    from fastapi.testclient import TestClient

    from service.rest.app import create_app

    with TestClient(create_app(settings)) as client:
        yield client


async def started(
    settings_factory: Callable[..., Settings], repository: Path, **overrides: Any
) -> DataPlane:
    """The serving core over ``repository``, its settings ``settings_factory``'s with
    ``overrides``, started; the caller stops it."""
    from service.dataplane import DataPlane

    core = DataPlane(settings_factory(model_repository=repository, **overrides))
    await core.start()
    return core


async def until(
    condition: Callable[[], Any], what: str, timeout: float = 10, every: float = 0.05
) -> None:
    """Until ``condition()`` (awaited when it is a coroutine function) is true, polled every
    ``every`` seconds on the event loop; a failure naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (await condition() if inspect.iscoroutinefunction(condition) else condition()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(every)


class ModelGate:
    """Wraps a model's infer: records the marks (first value) of each run's rows, and holds
    the first run until ``open`` is set (its one instance busy, later requests queue)."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[list[int]] = []
        self.open = threading.Event()
        real = model.infer

        def infer(inputs, outputs=None):
            self.runs.append([int(v) for v in inputs["input"][:, 0]])
            if len(self.runs) == 1:
                self.open.wait(10)
            return real(inputs, outputs)

        monkeypatch.setattr(model, "infer", infer)

    async def first_running(self) -> None:
        await until(lambda: bool(self.runs), "the first run started", every=0.001)


class Gate(ModelGate):
    """A ``ModelGate`` on a served model of ``plane``, which can also wait for its queue."""

    def __init__(self, plane: DataPlane, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        served = plane.started_repository().get(name)
        batcher = served.scheduler._batcher
        assert batcher is not None
        self._batcher = batcher
        super().__init__(served.model, monkeypatch)

    async def queued(self, count: int) -> None:
        """Until ``count`` requests wait in the model's queue."""
        batcher = self._batcher
        await until(lambda: len(batcher._pending) == count, f"{count} queued", every=0.001)
