"""On-demand loading (GELU_MODEL_CONTROL_MODE=on_demand): models load at their first request,
concurrent first requests share one load, the least recently used are unloaded within a count
and a byte budget, pinned models stay, and what cannot load is answered, not hung. Fleets drop
no request (issue 62, item 7): a model in use is never unloaded to make room, a load waits for
room within its requests' deadline, and a model that cannot load evicts nothing and is
answered the same refusal until its files change."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import LoadFailedError, NotFoundError, OverloadedError
from service.inference import InferenceRequest, RequestInput
from service.repository import demand
from service.runtime import Model
from tests.helpers import DIGITS, digits_request, started, until
from tests.onnx_models import write_model, write_scaling
from tests.servers import get, post, rss_bytes, running

pytestmark = pytest.mark.anyio
MODELS = [f"m{i}" for i in range(12)]
ON_DEMAND = {"model_control_mode": "on_demand"}
# The fleets' core: batches on worker threads, where a model's runs are held (``slow_m0``).
FLEET = {**ON_DEMAND, "inline_max_us": 0}
SCALE = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""
STEP = """{{ model_name: "{name}" model_version: -1
  input_map {{ key: "x" value: "{source}" }} output_map {{ key: "y" value: "{target}" }} }}"""
CHAIN = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {first}, {second} ] }}
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve small classifiers."""
    root = tmp_path_factory.mktemp("fleet")
    for seed, name in enumerate(MODELS):
        write_model(root, name, 1, seed=seed)
    return root


def loaded(core: DataPlane) -> list[str]:
    return sorted(core.model_names())


def metric(core: DataPlane, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in core.metrics.exposition().decode()
               .splitlines() if line.startswith(name))  # fmt: skip


@pytest.fixture
def slow_m0(monkeypatch) -> threading.Event:
    """m0's runs (on a worker thread) take until the event returned is set."""
    release = threading.Event()
    release.set()
    real = Model.infer

    def infer(self, inputs, outputs=None):
        if self.name == "m0":
            assert release.wait(timeout=30)
        return real(self, inputs, outputs)

    monkeypatch.setattr(Model, "infer", infer)
    return release


async def test_a_model_in_use_is_never_unloaded_to_make_room(
    settings_factory, many: Path, slow_m0: threading.Event
) -> None:
    core = await started(settings_factory, many, **FLEET, max_loaded_models=2)
    try:
        await core.infer("m0", None, digits_request())  # m0 first: the least recently used
        slow_m0.clear()
        running = asyncio.create_task(core.infer("m0", None, digits_request()))
        await until(lambda: core.repository.get("m0").in_flight == 1, "m0 running", every=0.01)  # type: ignore[union-attr]
        await core.infer("m1", None, digits_request())
        await core.infer("m2", None, digits_request())  # room from m1, idle, not from m0, in use
        assert loaded(core) == ["m0", "m2"]
        slow_m0.set()
        assert (await running).outputs["logits"].shape == (1, 10)
    finally:
        slow_m0.set()
        await core.stop()


async def test_a_load_waits_for_room_within_its_timeout(
    settings_factory, many: Path, slow_m0: threading.Event
) -> None:
    core = await started(settings_factory, many, **FLEET, max_loaded_models=1)
    try:
        await core.infer("m0", None, digits_request())
        slow_m0.clear()
        running = asyncio.create_task(core.infer("m0", None, digits_request()))
        await until(lambda: core.repository.get("m0").in_flight == 1, "m0 running", every=0.01)  # type: ignore[union-attr]
        with pytest.raises(OverloadedError, match="'m1' is still loading"):
            await core.infer("m1", None, digits_request(timeout_us=50_000))
        assert loaded(core) == ["m0"]  # nothing loaded for a request that gave up
        waiting = asyncio.create_task(core.infer("m1", None, digits_request(timeout_us=10_000_000)))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        slow_m0.set()  # m0 falls idle: room
        assert (await waiting).outputs["logits"].shape == (1, 10)
        assert (await running).outputs["logits"].shape == (1, 10)
        assert loaded(core) == ["m1"]
    finally:
        slow_m0.set()
        await core.stop()


async def test_a_failed_load_evicts_nothing_and_is_remembered(
    settings_factory, many: Path, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    for name in ("m0", "m1"):
        write_model(root, name, 1)
    write_model(root, "broken", 1)
    onnx = root / "broken" / "1" / "model.onnx"
    good = onnx.read_bytes()
    onnx.write_bytes(b"not onnx")
    core = await started(settings_factory, root, **FLEET, max_loaded_models=2)
    try:
        for name in ("m0", "m1"):
            await core.infer(name, None, digits_request())
        answers = set()
        for _ in range(5):
            with pytest.raises(LoadFailedError) as caught:
                await core.infer("broken", None, digits_request())
            assert caught.value.status_code == 400
            answers.add(caught.value.message)
        (answer,) = answers  # the same refusal each time
        assert answer.startswith("failed to load 'broken': broken/1: onnxruntime cannot load it")
        assert str(root) not in answer
        assert loaded(core) == ["m0", "m1"]  # nothing made room for it
        assert metric(core, "gelu_model_evictions_total") == 0
        assert metric(core, 'gelu_model_load_failures_total{model="broken"}') == 1  # tried once
        await asyncio.sleep(demand.RETRY_FIRST_S)  # its back-off over: tried again, once
        for _ in range(2):
            with pytest.raises(LoadFailedError):
                await core.infer("broken", None, digits_request())
        failures = metric(core, 'gelu_model_load_failures_total{model="broken"}')
        assert failures == 2  # and the back-off doubled
        onnx.write_bytes(good)  # its files changed: tried at once
        assert (await core.infer("broken", None, digits_request())).outputs["logits"].shape == (
            1,
            10,
        )
        assert metric(core, 'gelu_model_load_failures_total{model="broken"}') == failures
        assert len(loaded(core)) == 2 and "broken" in loaded(core)
    finally:
        await core.stop()


async def test_a_fleet_drops_no_request(settings_factory, many: Path) -> None:
    """8 clients over 12 models, 3 loaded at most (the issue's 8 over 40, 5 loaded): before,
    a request whose model was unloaded for another as it loaded was answered 503."""
    core = await started(settings_factory, many, **FLEET, max_loaded_models=3)
    failures: list[BaseException] = []

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            try:
                await core.infer(rng.choice(MODELS), None, digits_request())
            except Exception as exc:  # counted, then asserted none
                failures.append(exc)

    try:
        await asyncio.gather(*(client(seed) for seed in range(8)))
        assert not failures, failures[:3]
        assert len(loaded(core)) <= 3
        assert metric(core, "gelu_model_evictions_total") > 10
    finally:
        await core.stop()


@pytest.fixture(scope="module")
def chained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``chain``, an ensemble of ``double`` (x 2) then ``triple`` (x 3)."""
    root = tmp_path_factory.mktemp("chained")
    for name, factor in (("double", 2.0), ("triple", 3.0)):
        write_scaling(root / name / "1", factor)
        (root / name / "config.pbtxt").write_text(SCALE.format(name=name))
    (root / "chain" / "1").mkdir(parents=True)
    first = STEP.format(name="double", source="x", target="twice")
    second = STEP.format(name="triple", source="twice", target="y")
    (root / "chain" / "config.pbtxt").write_text(CHAIN.format(first=first, second=second))
    return root


async def test_an_ensemble_waits_for_no_room_its_own_request_holds(
    settings_factory, chained: Path
) -> None:
    """One model loaded at most, no timeout (GELU_DEFAULT_TIMEOUT_US=0): a request for an
    ensemble holds the ensemble in flight while each step loads. Counted as a loaded model, the
    ensemble took the one room its step waited for, and the request waited forever. An
    ensemble holds no session and takes no room: each step loads in turn, the one before
    unloaded for it, and the request is answered."""
    core = await started(
        settings_factory, chained, **FLEET, max_loaded_models=1, default_timeout_us=0
    )
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    try:
        for _ in range(2):
            chain = InferenceRequest([RequestInput(x, "x", "FP32")])
            answer = await asyncio.wait_for(core.infer("chain", None, chain), 10)
            np.testing.assert_array_equal(answer.outputs["y"], 6 * x)
        assert loaded(core) == ["chain", "triple"]  # the ensemble, and one model's session
        assert metric(core, "gelu_loaded_models") == 1
    finally:
        await core.stop()


async def test_models_load_at_their_first_request_and_the_least_used_make_room(
    settings_factory, many: Path
) -> None:
    core = await started(
        settings_factory, many, **ON_DEMAND, max_loaded_models=3, pinned_models=["m0"]
    )
    try:
        assert loaded(core) == ["m0"]  # only the pinned at start
        assert {"name": "m1"} in await ModelControl.over(core).index()  # listed, never loaded
        answers = {}
        for name in ("m1", "m2"):
            answers[name] = (await core.infer(name, None, digits_request())).outputs["logits"]
        assert loaded(core) == ["m0", "m1", "m2"]
        await core.infer("m1", None, digits_request())  # m2 is now the least recently used
        await core.infer("m3", None, digits_request())
        assert loaded(core) == ["m0", "m1", "m3"]
        (entry,) = [e for e in await ModelControl.over(core).index() if e["name"] == "m2"]
        assert entry["state"] == "UNAVAILABLE" and "make room for 'm3'" in entry["reason"]
        for name in ("m4", "m5", "m2"):  # the pinned one is never the one unloaded
            await core.infer(name, None, digits_request())
            assert "m0" in loaded(core) and len(loaded(core)) == 3
        again = (await core.infer("m2", None, digits_request())).outputs["logits"]
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
            await core.infer("nope", None, digits_request())
        with pytest.raises(NotFoundError, match="version '7'"):
            await core.infer("m2", "7", digits_request())
    finally:
        await core.stop()


async def test_concurrent_first_requests_share_one_load(settings_factory, many: Path) -> None:
    core = await started(settings_factory, many, **ON_DEMAND)
    try:
        results = await asyncio.gather(
            *(core.infer("m1", None, digits_request()) for _ in range(20))
        )
        assert len(results) == 20
        assert metric(core, "gelu_model_load_seconds_count") == 1
        # Each request checks the name off the loop first; one whose check returns after the
        # load has finished finds the model loaded and does not wait (19 of 20 in a CI run).
        assert 1 <= metric(core, "gelu_model_load_wait_seconds_count") <= 20
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
    core = await started(
        settings_factory, large, **ON_DEMAND, model_memory_bytes=one * 2 + one // 2
    )
    try:
        for name in MODELS:
            await core.infer(name, None, digits_request())
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
    core = await started(settings_factory, root, **ON_DEMAND)
    try:
        with pytest.raises(LoadFailedError, match=r"failed to load 'broken': .*cannot load it"):
            await core.infer("broken", None, digits_request())
        await core.infer("good", None, digits_request())
    finally:
        await core.stop()
    core = await started(
        settings_factory, root, **ON_DEMAND, max_loaded_models=1, pinned_models=["good"]
    )
    try:
        with pytest.raises(OverloadedError, match="no room to load 'broken'"):
            await core.infer("broken", None, digits_request())  # the one slot is pinned
        assert loaded(core) == ["good"]
    finally:
        await core.stop()
    core = await started(settings_factory, many, **ON_DEMAND)
    try:
        with pytest.raises(OverloadedError, match="still loading"):
            await core.infer("m1", None, digits_request(timeout_us=1))
        await core.infer("m1", None, digits_request())  # the load went on
    finally:
        await core.stop()


async def test_the_repository_api_loads_within_the_budget(settings_factory, many: Path) -> None:
    core = await started(settings_factory, many, **ON_DEMAND, max_loaded_models=2)
    try:
        for name in ("m1", "m2", "m3"):
            await ModelControl.over(core).load(name)
        assert loaded(core) == ["m2", "m3"]
        await ModelControl.over(core).unload("m3")
        assert loaded(core) == ["m2"] and metric(core, "gelu_loaded_models") == 1
    finally:
        await core.stop()


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
