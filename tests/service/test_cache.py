"""Triton's response cache: hits answer bit-identical results, are counted as Triton counts
them, never keep errors, stay within their byte budget and go with a retired version."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest

from export.defaults import DEFAULT_ENSEMBLE, default_ensemble, write_ensemble
from service.cache import ARRAY_OVERHEAD, ENTRY_OVERHEAD, ResponseCache
from service.control import ModelControl
from service.dataplane import DataPlane
from service.errors import BadInputError
from service.inference import InferenceRequest, RequestInput, RequestOutput
from tests.helpers import DIGITS, started
from tests.onnx_models import write_model

pytestmark = pytest.mark.anyio


@pytest.fixture
def cached_repo(tmp_path: Path, model_repository: Path) -> Path:
    """The test repository, digits-mlp with `response_cache { enable: true }`."""
    root = tmp_path / "repo"
    shutil.copytree(model_repository, root)
    config = root / "digits-mlp" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    return root


# digits-mlp alone, loaded explicitly (so that unloading it is the API's), and a cache.
EXPLICIT = {
    "response_cache_bytes": 1 << 20, "model_control_mode": "explicit",
    "load_models": ["digits-mlp"],
}  # fmt: skip


def _request(rows: np.ndarray, outputs: list[str] | None = None) -> InferenceRequest:
    asked = [RequestOutput(name) for name in outputs] if outputs else None
    return InferenceRequest([RequestInput(rows, "input", "FP32")], outputs=asked)


def _stats(core: DataPlane, version: str = "2") -> dict:
    (stats,) = core.statistics("digits-mlp", version)
    return stats


async def test_a_repeated_request_is_answered_from_the_cache(settings_factory, cached_repo) -> None:
    core = DataPlane(settings_factory(model_repository=cached_repo, response_cache_bytes=1 << 20))
    await core.start()
    try:
        first = await core.infer("digits-mlp", None, _request(DIGITS[:3]))
        runs = _stats(core)["execution_count"]
        again = await core.infer("digits-mlp", None, _request(DIGITS[:3].copy()))
        for name in first.outputs:
            np.testing.assert_array_equal(again.outputs[name], first.outputs[name])  # bit for bit
        stats = _stats(core)
        assert stats["execution_count"] == runs  # answered without a run
        assert stats["inference_stats"]["cache_hit"]["count"] == 1
        assert stats["inference_stats"]["cache_miss"]["count"] == 1
        assert stats["inference_stats"]["cache_miss"]["ns"] > 0
        # Other outputs asked for, or other inputs: a miss each.
        await core.infer("digits-mlp", None, _request(DIGITS[:3], ["logits"]))
        await core.infer("digits-mlp", None, _request(DIGITS[1:4]))
        assert _stats(core)["inference_stats"]["cache_miss"]["count"] == 3
        exposed = core.metrics.exposition().decode()
        assert 'gelu_response_cache_lookups_total{model="digits-mlp",result="hit"} 1.0' in exposed
        # A model whose config does not ask for it is never looked up.
        await core.infer("digits-mlp-tanh", None, _request(DIGITS[:3]))
        exposed = core.metrics.exposition().decode()
        assert 'gelu_response_cache_lookups_total{model="digits-mlp-tanh"' not in exposed
        tanh: dict = core.statistics("digits-mlp-tanh")[0]["inference_stats"]  # type: ignore[assignment]
        assert tanh["cache_hit"]["count"] == tanh["cache_miss"]["count"] == 0
    finally:
        await core.stop()


async def test_the_bytes_gauge_reads_what_the_cache_holds(settings_factory, cached_repo) -> None:
    """In one process the gauge is read at scrape time (no lock per miss), and says what the
    cache holds after misses and after a version's entries go."""
    core = await started(settings_factory, cached_repo, **EXPLICIT)
    try:
        for rows in (DIGITS[:1], DIGITS[1:3]):
            await core.infer("digits-mlp", None, _request(rows))
        assert core.cache is not None and len(core.cache) == 2
        exposed = core.metrics.exposition().decode()
        assert f"gelu_response_cache_bytes {float(core.cache.used)}" in exposed
        await ModelControl.over(core).unload("digits-mlp")
        assert "gelu_response_cache_bytes 0.0" in core.metrics.exposition().decode()
    finally:
        await core.stop()


async def test_errors_are_not_cached(settings_factory, cached_repo) -> None:
    core = DataPlane(settings_factory(model_repository=cached_repo, response_cache_bytes=1 << 20))
    await core.start()
    try:
        for _ in range(2):
            with pytest.raises(BadInputError):
                await core.infer("digits-mlp", None, _request(DIGITS[:2, :10]))
        assert core.cache is not None and len(core.cache) == 0
    finally:
        await core.stop()


async def test_a_retired_version_takes_its_answers_along(settings_factory, cached_repo) -> None:
    core = await started(settings_factory, cached_repo, **EXPLICIT)
    try:
        await core.infer("digits-mlp", None, _request(DIGITS[:1]))
        assert core.cache is not None and len(core.cache) == 1 and core.cache.used > 0
        await ModelControl.over(core).unload("digits-mlp")
        assert len(core.cache) == 0 and core.cache.used == 0
    finally:
        await core.stop()


def test_the_byte_budget_holds_under_unique_inputs() -> None:
    owner = object()
    rows = np.random.default_rng(0).random((500, 64), dtype=np.float32)
    entry = 10 * 4 + ARRAY_OVERHEAD + 64 * 4 + ENTRY_OVERHEAD  # ten logits; the key's input
    cache = ResponseCache(budget=20 * entry)
    for row in rows:
        key = cache.key((owner,), {"input": row[None]}, None)
        cache.put(key, {"logits": np.ones((1, 10), np.float32)}, (owner,))
        assert cache.used <= cache.budget
    assert len(cache) == 20  # the most recent twenty
    last = cache.key((owner,), {"input": rows[-1][None]}, None)
    first = cache.key((owner,), {"input": rows[0][None]}, None)
    assert cache.get(last) is not None and cache.get(first) is None
    huge = cache.key((owner,), {"input": rows[:1] + 1}, None)
    cache.put(huge, {"x": np.ones(10_000, np.float32)}, (owner,))  # above the whole budget
    assert cache.get(huge) is None and cache.used <= cache.budget


SMALL_ENTRIES = {
    "one output": (1, 1),
    "three outputs": (3, 1),
    "BYTES input of 200 values": (1, 200),
}
PUTS = 40_000  # each of a one-element input; a tenth as many of a BYTES one


@pytest.mark.parametrize(("outputs", "values"), SMALL_ENTRIES.values(), ids=SMALL_ENTRIES)
def test_the_budget_counts_what_small_answers_really_hold(outputs: int, values: int) -> None:
    """A cache filled with the smallest answers (one-element outputs; a one-element input, or
    a BYTES input of short values) holds, as tracemalloc counts it, no more than its budget
    says: counted as 256 bytes beside the arrays' data and each BYTES value's length, it held
    three to four times its budget (CWE-770: memory that distinct requests grow past its
    bound)."""
    import tracemalloc

    owner = object()
    cache = ResponseCache(budget=4 << 20)
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(PUTS if values == 1 else PUTS // 10):
            if values == 1:
                given = rng.random((1, 1), dtype=np.float32)
            else:
                given = np.array([b"%d-%d" % (i, j) for j in range(values)], dtype=object)
            answer = {f"out{k}": np.zeros((1, 1), np.float32) for k in range(outputs)}
            cache.put(cache.key((owner,), {"input": given}, None), answer, (owner,))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) < (PUTS if values == 1 else PUTS // 10)  # the budget bounded it
    assert held <= cache.budget * 1.15, (held, cache.used)  # 1.15: a dict between resizes


def test_kept_arrays_are_copies_that_cannot_change() -> None:
    owner, logits = object(), np.zeros((2, 10), np.float32)
    cache = ResponseCache(budget=1 << 20)
    key = cache.key((owner,), {"input": DIGITS[:1]}, None)
    cache.put(key, {"logits": logits[:1]}, (owner,))  # a view into a larger batch's output
    logits[0, 0] = 5.0
    kept = cache.get(key)
    assert kept is not None and kept["logits"][0, 0] == 0.0
    assert kept["logits"].base is None and not kept["logits"].flags.writeable


def test_an_entry_is_keyed_by_every_owner_and_goes_with_any_of_them() -> None:
    """An ensemble's answer is its version's and its steps' (issue 62, item 8): another step
    version is another key, and retiring any owner drops the entry."""
    ensemble, step, newer = object(), object(), object()
    cache = ResponseCache(budget=1 << 20)
    inputs = {"input": DIGITS[:1]}
    key = cache.key((ensemble, step), inputs, None)
    assert key != cache.key((ensemble, newer), inputs, None)
    assert key != cache.key((ensemble,), inputs, None)
    cache.put(key, {"logits": np.ones((1, 10), np.float32)}, (ensemble, step))
    cache.drop(newer)
    assert cache.get(key) is not None
    cache.drop(step)
    assert cache.get(key) is None and len(cache) == 0 and cache.used == 0


def test_a_second_miss_of_the_same_request_is_counted_once() -> None:
    """Two misses of one request in flight both put their answer: the first is kept, and the
    bytes are counted once."""
    owner = object()
    cache = ResponseCache(budget=1 << 20)
    key = cache.key((owner,), {"input": DIGITS[:1]}, None)
    cache.put(key, {"logits": np.ones((1, 10), np.float32)}, (owner,))
    used = cache.used
    cache.put(key, {"logits": np.zeros((1, 10), np.float32)}, (owner,))
    kept = cache.get(key)
    assert len(cache) == 1 and cache.used == used
    assert kept is not None and kept["logits"][0, 0] == 1.0


def test_owners_live_while_their_entries_may_and_go_with_them() -> None:
    """A key names its owners by id: the cache holds each owner until it is dropped, so no
    other object can take its id (and answer from its entries) while an entry carries it."""

    class Version:
        pass

    owner = Version()
    gone = weakref.ref(owner)
    cache = ResponseCache(budget=1 << 20)
    key = cache.key((owner,), {"input": DIGITS[:1]}, None)
    cache.put(key, {"logits": np.ones((1, 10), np.float32)}, (owner,))
    del owner
    gc.collect()
    held = gone()
    assert held is not None  # the cache keeps it while an entry may carry its id
    cache.drop(held)
    del held
    gc.collect()
    assert gone() is None and len(cache) == 0 and cache.used == 0


def test_entries_hold_nothing_the_collector_keeps_visiting() -> None:
    """A filling cache must not make the collector's passes heavier for every request: after
    two collections (a tuple is untracked once its items are), neither an entry's key nor
    its answer is tracked by the collector."""
    owner = object()
    cache = ResponseCache(budget=1 << 20)
    for name, inputs in (
        ("one", {"input": DIGITS[:1]}),
        ("two", {"a": DIGITS[:1], "b": DIGITS[1:2]}),
    ):
        key = cache.key((owner,), inputs, ["logits"])
        cache.put(key, {"logits": np.ones((1, 10), np.float32)}, (owner,))
        gc.collect()
        gc.collect()
        stored = next(k for k in cache._entries if k == key)
        assert not gc.is_tracked(stored), name
        assert not any(gc.is_tracked(part) for part in cache._entries[key]), name


async def test_an_ensemble_never_answers_from_a_step_version_gone_by(
    settings_factory, tmp_path: Path, model_repository: Path
) -> None:
    """Issue 62, item 8: an ensemble with ``response_cache`` answered from the cache after one
    of its steps moved to a new version. Its answers are keyed by the versions its steps
    resolved to: after the step's new version loads, the same request is answered by it."""
    root = tmp_path / "repo"
    shutil.copytree(model_repository, root)
    write_ensemble(root, default_ensemble(root))
    config = root / DEFAULT_ENSEMBLE / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    settings = settings_factory(
        model_repository=root, response_cache_bytes=1 << 20, model_control_mode="explicit",
        load_models=["digits-autoencoder", "digits-mlp", DEFAULT_ENSEMBLE],
    )  # fmt: skip
    core = DataPlane(settings)
    await core.start()
    try:
        before = (await core.infer(DEFAULT_ENSEMBLE, None, _request(DIGITS[:2]))).outputs
        again = (await core.infer(DEFAULT_ENSEMBLE, None, _request(DIGITS[:2]))).outputs
        (stats,) = core.statistics(DEFAULT_ENSEMBLE)
        assert stats["inference_stats"]["cache_hit"]["count"] == 1  # type: ignore[index]
        np.testing.assert_array_equal(again["logits"], before["logits"])
        write_model(root, "digits-mlp", 3, seed=7)  # the classifier step's new version
        await ModelControl.over(core).load("digits-mlp")
        assert core.model("digits-mlp").version == "3"
        after = (await core.infer(DEFAULT_ENSEMBLE, None, _request(DIGITS[:2]))).outputs
        reconstruction = await core.infer("digits-autoencoder", None, _request(DIGITS[:2]))
        direct = await core.infer("digits-mlp", "3", InferenceRequest(
            [RequestInput(reconstruction.outputs["reconstruction"], "input", "FP32")]
        ))  # fmt: skip
        np.testing.assert_array_equal(after["logits"], direct.outputs["logits"])
        assert not np.array_equal(after["logits"], before["logits"])
        (stats,) = core.statistics(DEFAULT_ENSEMBLE)
        assert stats["inference_stats"]["cache_hit"]["count"] == 1  # type: ignore[index]
    finally:
        await core.stop()


def test_the_same_bytes_under_another_datatype_shape_or_name_is_another_key() -> None:
    """The key is the request itself: inputs of one and the same bytes, read as another
    datatype, shape or input, never answer from each other's entry, small (keyed by their
    bytes) or large (keyed by a digest of them)."""
    owner = object()
    for values in (64, 64 * 1024):  # 256 bytes; 256 KiB, above EXACT_BYTES
        raw = np.arange(values, dtype=np.float32)
        same_bytes: dict[str, dict[str, np.ndarray]] = {
            "float32": {"input": raw[None]},
            "int32": {"input": raw.view(np.int32)[None]},
            "uint8": {"input": raw.view(np.uint8)[None]},
            "byteswapped": {"input": raw.view(raw.dtype.newbyteorder())[None]},
            "reshaped": {"input": raw.reshape(2, -1)},
            "renamed": {"other": raw[None]},
        }
        cache = ResponseCache(budget=1 << 30)
        keys = {what: cache.key((owner,), inputs, None) for what, inputs in same_bytes.items()}
        assert len(set(keys.values())) == len(keys)
        cache.put(keys["float32"], {"logits": np.ones((1, 10), np.float32)}, (owner,))
        assert all(cache.get(k) is None for what, k in keys.items() if what != "float32")
        again = cache.key((owner,), {"input": raw[None].copy()}, None)  # equal, not the same
        assert cache.get(again) is not None


async def test_a_hit_is_answered_before_the_batcher(
    settings_factory, cached_repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit never reaches the version's scheduler (the batcher and every run path)."""
    core = DataPlane(settings_factory(model_repository=cached_repo, response_cache_bytes=1 << 20))
    await core.start()
    try:
        scheduler = core.started_repository().get("digits-mlp").scheduler
        scheduled: list[object] = []
        run = type(scheduler).run

        async def counted(self: object, *args: object, **kwargs: object) -> object:
            scheduled.append(self)
            return await run(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(type(scheduler), "run", counted)  # slotted: patched on the class
        first = await core.infer("digits-mlp", None, _request(DIGITS[:2]))
        assert scheduled == [scheduler]
        for _ in range(3):
            hit = await core.infer("digits-mlp", None, _request(DIGITS[:2].copy()))
            np.testing.assert_array_equal(hit.outputs["logits"], first.outputs["logits"])
        assert len(scheduled) == 1
        await core.infer("digits-mlp", None, _request(DIGITS[2:4]))  # a miss runs
        assert len(scheduled) == 2
    finally:
        await core.stop()
