"""On-demand loading (GELU_MODEL_CONTROL_MODE=on_demand): models load at their first request,
concurrent first requests share one load, the least recently used are unloaded within a
count and a byte budget, pinned models stay, and what cannot load is answered, not hung."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import LoadFailedError, NotFoundError, OverloadedError
from service.inference import InferenceRequest, RequestInput
from service.repository import demand
from service.settings import SettingsError, load_settings
from tests.helpers import DIGITS
from tests.onnx_models import write_model
from tests.servers import get, post, rss_bytes, running

pytestmark = pytest.mark.anyio
MODELS = [f"m{i}" for i in range(6)]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six small classifiers, each its own weights."""
    root = tmp_path_factory.mktemp("many")
    for seed, name in enumerate(MODELS):
        write_model(root, name, 1, seed=seed * 10)
    return root


def request(timeout_us: int | None = None) -> InferenceRequest:
    return InferenceRequest([RequestInput(DIGITS[:2], "input", "FP32")], timeout_us=timeout_us)


async def started(settings_factory, root: Path, **overrides) -> DataPlane:
    core = DataPlane(settings_factory(model_repository=root, model_control_mode="on_demand",
                                      **overrides))  # fmt: skip
    await core.start()
    return core


def loaded(core: DataPlane) -> list[str]:
    return sorted(core.model_names())


def metric(core: DataPlane, name: str) -> float:
    total = 0.0
    for line in core.metrics.exposition().decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_models_load_at_their_first_request_and_the_least_used_make_room(
    settings_factory, many: Path
) -> None:
    core = await started(settings_factory, many, max_loaded_models=3, pinned_models=["m0"])
    try:
        assert loaded(core) == ["m0"]  # only the pinned at start
        assert {"name": "m1"} in await ModelControl.over(core).index()  # listed, never loaded
        answers = {}
        for name in ("m1", "m2"):
            answers[name] = (await core.infer(name, None, request())).outputs["logits"]
        assert loaded(core) == ["m0", "m1", "m2"]
        await core.infer("m1", None, request())  # m2 is now the least recently used
        await core.infer("m3", None, request())
        assert loaded(core) == ["m0", "m1", "m3"]
        (entry,) = [e for e in await ModelControl.over(core).index() if e["name"] == "m2"]
        assert entry["state"] == "UNAVAILABLE" and "make room for 'm3'" in entry["reason"]
        for name in ("m4", "m5", "m2"):  # the pinned one is never the one unloaded
            await core.infer(name, None, request())
            assert "m0" in loaded(core) and len(loaded(core)) == 3
        again = (await core.infer("m2", None, request())).outputs["logits"]
        np.testing.assert_array_equal(again, answers["m2"])  # loaded again, same answers
        assert metric(core, "gelu_model_evictions_total") == 4
        assert metric(core, "gelu_model_load_seconds_count") == 6
        assert metric(core, "gelu_loaded_models") == 3
        # and in the statistics of each loaded model: m2 loaded twice, unloaded once between
        (m2,) = core.statistics("m2")
        residency = m2["residency"]
        assert residency["loads"]["count"] == 2 and residency["loads"]["ns"] > 0  # type: ignore[index]
        assert residency["evictions"] == 1 and residency["waits"]["count"] == 2  # type: ignore[index]
        with pytest.raises(NotFoundError, match="no model 'nope'"):
            await core.infer("nope", None, request())
        with pytest.raises(NotFoundError, match="version '7'"):
            await core.infer("m2", "7", request())
    finally:
        await core.stop()


async def test_concurrent_first_requests_share_one_load(settings_factory, many: Path) -> None:
    core = await started(settings_factory, many)
    try:
        results = await asyncio.gather(*(core.infer("m1", None, request()) for _ in range(20)))
        assert len(results) == 20
        assert metric(core, "gelu_model_load_seconds_count") == 1
        assert metric(core, "gelu_model_load_wait_seconds_count") == 20
    finally:
        await core.stop()


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six classifiers of 1.2 MB each: large enough that a session's measured bytes (what
    resident memory grew by as it opened) are its file's, not onnxruntime's arena pages."""
    root = tmp_path_factory.mktemp("large")
    for seed, name in enumerate(MODELS):
        write_model(root, name, 1, seed=seed * 10, hidden=512)
    return root


async def test_the_byte_budget_holds(settings_factory, large: Path) -> None:
    """At most two and a half models' bytes stay loaded."""
    one = (large / "m0" / "1" / "model.onnx").stat().st_size
    core = await started(settings_factory, large, model_memory_bytes=one * 2 + one // 2)
    try:
        for name in MODELS:
            await core.infer(name, None, request())
            assert core.repository is not None
            held = demand.held(core.repository.loaded())
            assert held <= one * 2 + one // 2
            assert metric(core, "gelu_loaded_model_bytes") == held
        assert 1 <= len(loaded(core)) <= 2 and metric(core, "gelu_model_evictions_total") >= 4
    finally:
        await core.stop()


async def test_what_cannot_load_is_answered(settings_factory, many: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_model(root, "good", 1)
    write_model(root, "broken", 1)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    core = await started(settings_factory, root)
    try:
        with pytest.raises(LoadFailedError, match=r"failed to load 'broken': .*cannot load it"):
            await core.infer("broken", None, request())
        await core.infer("good", None, request())
    finally:
        await core.stop()
    core = await started(settings_factory, root, max_loaded_models=1, pinned_models=["good"])
    try:
        with pytest.raises(OverloadedError, match="no room to load 'broken'"):
            await core.infer("broken", None, request())  # the one slot is pinned
        assert loaded(core) == ["good"]
    finally:
        await core.stop()
    core = await started(settings_factory, many)
    try:
        with pytest.raises(OverloadedError, match="still loading"):
            await core.infer("m1", None, request(timeout_us=1))
        await core.infer("m1", None, request())  # the load went on
    finally:
        await core.stop()


async def test_the_repository_api_loads_within_the_budget(settings_factory, many: Path) -> None:
    core = await started(settings_factory, many, max_loaded_models=2)
    try:
        for name in ("m1", "m2", "m3"):
            await ModelControl.over(core).load(name)
        assert loaded(core) == ["m2", "m3"]
        await ModelControl.over(core).unload("m3")
        assert loaded(core) == ["m2"] and metric(core, "gelu_loaded_models") == 1
    finally:
        await core.stop()


def test_pinned_models_fit_the_count() -> None:
    with pytest.raises(SettingsError, match="GELU_PINNED_MODELS names 2 models, more than"):
        load_settings(model_control_mode="on_demand", pinned_models="a,b", max_loaded_models=1)


# What the test allows the server's memory to grow by beyond the budget's models: allocator
# free lists, the loaded models' batchers and statistics, metrics' label sets.
RSS_CONSTANT = 48 << 20


@pytest.mark.slow
def test_five_hundred_models_under_a_budget_of_twenty(tmp_path: Path) -> None:
    """Random models of 500 for 20 s under bounded load, 20 loaded at most: no request
    fails, memory stays bounded, loads and evictions are counted, pinned models stay."""
    import http.client
    import json
    import random
    import shutil
    import threading
    import time

    root = tmp_path / "repo"
    write_model(root, "m000", 1)
    config = (root / "m000" / "config.pbtxt").read_text()
    # Written as ModelMesh's Triton adapter writes a config: without a name.
    nameless = "\n".join(x for x in config.splitlines() if not x.startswith("name:"))
    (root / "m000" / "config.pbtxt").write_text(nameless + "\n")
    names = [f"m{i:03d}" for i in range(500)]
    for name in names[1:]:
        shutil.copytree(root / "m000", root / name)
    pinned = ["m000", "m001"]
    # Warnings only: no one reads the server's output until it stops, and each load logs.
    env = {"GELU_MODEL_CONTROL_MODE": "on_demand", "GELU_MAX_LOADED_MODELS": "20",
           "GELU_PINNED_MODELS": ",".join(pinned), "GELU_LOG_LEVEL": "warning"}  # fmt: skip
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                   "data": DIGITS[0].tolist()}]})  # fmt: skip
    statuses: dict[int, int] = {}
    resident: list[int] = []
    stop = threading.Event()

    def drive(port: int, seed: int) -> None:
        rng = random.Random(seed)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not stop.is_set():
            name = rng.choice(pinned) if rng.random() < 0.1 else rng.choice(names)
            connection.request("POST", f"/v2/models/{name}/infer", body,
                               {"Content-Type": "application/json"})  # fmt: skip
            response = connection.getresponse()
            response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
        connection.close()

    with running(root, **env) as (port, process):
        for name in names[:20]:  # the budget filled first: memory is measured from there
            assert post(port, f"/v2/models/{name}/infer", body.encode())[0] == 200, name
        loaded = json.loads(post(port, "/v2/repository/index", b'{"ready": true}')[1])
        assert sorted(e["name"] for e in loaded) == names[:20]
        start_rss = rss_bytes(process.pid)
        drivers = [threading.Thread(target=drive, args=(port, s)) for s in range(4)]
        for driver in drivers:
            driver.start()
        for _ in range(20):
            time.sleep(1)
            resident.append(rss_bytes(process.pid))
        stop.set()
        for driver in drivers:
            driver.join(timeout=60)
        metrics = get(port, "/metrics")[1].decode()
        stats = json.loads(get(port, "/v2/models/stats")[1])["model_stats"]
        status, listed = post(port, "/v2/repository/index")
        assert status == 200
        index = json.loads(listed)
    assert set(statuses) == {200}, statuses  # not one request failed
    assert sum(statuses.values()) > 200
    values = {}
    for line in metrics.splitlines():
        if line.startswith("gelu_") and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    evictions = {k: v for k, v in values.items() if k.startswith("gelu_model_evictions_total")}
    assert sum(evictions.values()) > 100
    assert not any(f'model="{p}"' in k for k in evictions for p in pinned)
    assert values["gelu_model_load_seconds_count"] > 100
    assert values["gelu_loaded_models"] <= 20
    ready = {e["name"] for e in index if e.get("state") == "READY"}
    assert set(pinned) <= ready and len(ready) <= 20
    # Triton's statistics of each loaded model carry its loads, unloads and waits
    # (the pinned ones were loaded at start, not on demand)
    assert all(e["residency"]["loads"]["count"] >= 1 for e in stats if e["name"] not in pinned)
    assert sum(e["residency"]["evictions"] for e in stats) > 0
    per_model = values["gelu_loaded_model_bytes"] / values["gelu_loaded_models"]
    assert max(resident) - start_rss <= 20 * per_model + RSS_CONSTANT, (resident, start_rss)
