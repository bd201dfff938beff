"""Live models under load, on a real server: new versions, replaced files and reloads lose no
request; a request for a version that is gone gets a 404, never a 500 or a reset."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from tests.helpers import DIGITS
from tests.onnx_models import write_model
from tests.servers import post, serving, wait_until

pytestmark = pytest.mark.slow  # real servers under load

CLIENTS = 32
BIG = "digits-big"  # an MLP 64-2048-2048-10: a batch of one takes about a millisecond


@pytest.fixture
def repo(tmp_path: Path, model_repository: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(model_repository / "digits-mlp", root / "digits-mlp")
    write_model(root, BIG, 1, hidden=2048)
    return root


class Load:
    """``CLIENTS`` threads sending V1 and V2 requests that name no version, and counting."""

    def __init__(self, port: int, models: list[str]) -> None:
        self.port, self.models = port, models
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def _run(self, i: int) -> None:
        model = self.models[i % len(self.models)]
        v1 = json.dumps({"instances": DIGITS[:1].tolist()})
        v2 = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                     "data": DIGITS[0].tolist()}]})  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        n = 0
        while not self._stop.is_set():
            path, body = (
                (f"/v1/models/{model}:predict", v1) if n % 2 else (f"/v2/models/{model}/infer", v2)
            )
            n += 1
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                self.statuses[response.status] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(repr(exc))
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    @contextmanager
    def running(self) -> Iterator[Load]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join()


def control(port: int, path: str, body: dict | None = None) -> tuple[int, object]:
    """A POST of ``body`` (JSON) to ``path``: its status and the JSON it answered."""
    status, answer = post(port, path, json.dumps(body or {}).encode(), timeout=60)
    return status, json.loads(answer or b"null")


def ready(port: int, name: str, version: str) -> bool:
    """Whether ``version`` of ``name`` is READY in the repository's index."""
    return states(port, name).get(version) == "READY"


def states(port: int, name: str) -> dict[str, str]:
    _, index = control(port, "/v2/repository/index")
    assert isinstance(index, list)
    return {e["version"]: e["state"] for e in index if e["name"] == name and "version" in e}


def test_poll_mode_new_versions_and_replaced_files_under_load(repo: Path) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    env = {"GELU_MODEL_CONTROL_MODE": "poll", "GELU_REPOSITORY_POLL_SECONDS": "0.3"}
    with serving(repo, **env) as port, Load(port, [BIG, "digits-mlp"]).running() as load:
        for cycle in range(2, 5):  # three new versions appear, each copied in place
            version = str(cycle)
            shutil.copytree(repo / BIG / "1", repo / BIG / version)
            wait_until(partial(ready, port, BIG, version), 30, what=f"v{version}")
        for _ in range(3):  # the latest version's file is replaced three times
            source = repo / "digits-mlp" / "1" / "model.onnx"
            shutil.copy(source, repo / "digits-mlp" / "2" / "model.onnx")
            time.sleep(1.2)  # two scans agree, then the reload
            os.utime(source)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")  # unmodified
        assert client.is_model_ready(BIG, "4")
        served = client.get_inference_statistics(BIG)["model_stats"]
        assert sum(s["inference_stats"]["success"]["count"] for s in served) > 0
        index = client.get_model_repository_index()
        assert {e.get("version") for e in index if e["name"] == BIG} == {"1", "2", "3", "4"}
        with pytest.raises(InferenceServerException, match="not allowed if polling"):
            client.unload_model(BIG)
    assert load.errors == [] and set(load.statuses) == {200}, (load.statuses, load.errors[:3])
    assert load.statuses[200] > 200


def test_explicit_mode_reloads_and_unloads_under_load(repo: Path) -> None:
    env = {"GELU_MODEL_CONTROL_MODE": "explicit", "GELU_LOAD_MODELS": "*"}
    with serving(repo, **env) as port:
        with Load(port, [BIG]).running() as load:
            for cycle in range(3):  # a new file for the big model, loaded: a swap
                write_model(repo, BIG, 10 + cycle, hidden=2048, seed=cycle)
                shutil.copy(repo / BIG / str(10 + cycle) / "model.onnx", repo / BIG / "1")
                shutil.rmtree(repo / BIG / str(10 + cycle))
                assert control(port, f"/v2/repository/models/{BIG}/load")[0] == 200
        assert load.errors == [] and set(load.statuses) == {200}, load.statuses
        with Load(port, [BIG]).running() as load:
            for _ in range(3):  # unloaded then loaded: 404 meanwhile, nothing worse
                assert control(port, f"/v2/repository/models/{BIG}/unload")[0] == 200
                time.sleep(0.3)
                assert control(port, f"/v2/repository/models/{BIG}/load")[0] == 200
                time.sleep(0.3)
        assert load.errors == [] and set(load.statuses) <= {200, 404}, load.errors[:3]
        assert load.statuses[404] > 0 and load.statuses[200] > 0
        shutil.rmtree(repo / "digits-mlp" / "1")  # a version removed from the repository
        assert control(port, "/v2/repository/models/digits-mlp/load")[0] == 200
        v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                          "data": DIGITS[0].tolist()}]}  # fmt: skip
        status, body = control(port, "/v2/models/digits-mlp/versions/1/infer", v2)
        assert status == 404 and "unknown version '1'" in str(body)
