"""Batch invariance (issue 66): a row's answer is the same bits whatever batch it rides in.

On the CPU provider it holds as the service opens sessions (docs/serving.md, "Batch
invariance"): one client sends a fixed row while 63 others send other rows at once, under
dynamic batching, and its answer must be the bits a batch-1 run gives, at several intra-op
thread counts, with and without the response cache; in process through the core, and through
a real server. ``batch_invariant`` (config.pbtxt) makes every run one shape, on any provider;
on the CPU its runs are watched, and on CUDA (where onnxruntime offers it) invariance is held
with it on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from contract.model_config import load_model_config
from contract.names import CONFIG_FILENAME, MODEL_FILENAME, RECONSTRUCTION
from service.dataplane import DataPlane
from service.inference import InferenceRequest, RequestInput
from service.onnxrt import session_options
from tests.helpers import DIGITS, started
from tests.onnx_models import write_model
from tests.servers import get, post, serving

CLIENTS = 64  # the fixed row's client and 63 others
ROUNDS = 4
CUDA = "CUDAExecutionProvider"
# Intra-op threads; 0: onnxruntime's default, one per core. One is the service's default and
# stays fast; more start slowly on this 2-core machine (onnxruntime's threads spin).
THREADS = [
    1,
    pytest.param(2, marks=pytest.mark.slow),
    pytest.param(0, marks=pytest.mark.slow),
]
CACHE_BYTES = 1 << 24
MODELS = ("mlp", "autoencoder")


def _repository(root: Path, invariant: str = "", max_batch_size: int = 256) -> Path:
    """A classifier wide enough for its matrix products to take several kernel paths, and an
    autoencoder, both batching, with the response cache asked for (the process's budget,
    ``GELU_RESPONSE_CACHE_BYTES``, decides whether it is on) and ``batch_invariant``."""
    write_model(root, "mlp", 1, hidden=200, max_batch_size=max_batch_size)
    write_model(root, "autoencoder", 1, task=RECONSTRUCTION, max_batch_size=max_batch_size)
    for name in MODELS:
        path = root / name / CONFIG_FILENAME
        config = load_model_config(path.read_text())
        changed = dataclasses.replace(config, response_cache=True, batch_invariant=invariant)
        path.write_text(changed.to_pbtxt())
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("invariance"))


def _alone(repository: Path, name: str, rows: np.ndarray, threads: int) -> list[np.ndarray]:
    """Each row's answer from a batch of one, every output, on a session opened as the
    service opens it: the bits a lone request is owed."""
    options = session_options(threads, 1)
    session = ort.InferenceSession(
        str(repository / name / "1" / MODEL_FILENAME), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    answers = [session.run(names, {"input": rows[i : i + 1]}) for i in range(len(rows))]
    return [np.concatenate([a[k] for a in answers]) for k in range(len(names))]


def _others(round_: int) -> np.ndarray:
    """The 63 other clients' rows in ``round_``: other digits, and noise, each round."""
    rng = np.random.default_rng(round_)
    rows = DIGITS[1 + rng.permutation(len(DIGITS) - 1)[: CLIENTS - 1]].copy()
    rows[::3] = rng.random((len(rows[::3]), rows.shape[1]), dtype=np.float32)
    return rows


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, np.float32).tobytes()


async def _round(core: DataPlane, name: str, fixed: np.ndarray, round_: int) -> dict:
    """The fixed row's outputs, sent among 63 others at once (at a place that moves)."""
    rows, place = list(_others(round_)), (round_ * 17 + 5) % CLIENTS
    rows.insert(place, fixed)
    results = await asyncio.gather(*(core.infer(name, None, _request(r[None])) for r in rows))
    return results[place].outputs


def _batched_runs(core: DataPlane, name: str) -> int:
    """Runs of more than one row so far (Triton's batch statistics)."""
    stats: Any = core.statistics(name)[0]["batch_stats"]
    return sum(b["compute_infer"]["count"] for b in stats if b["batch_size"] > 1)


@pytest.mark.anyio
@pytest.mark.parametrize("cache", [0, CACHE_BYTES], ids=["no-cache", "cache"])
@pytest.mark.parametrize("threads", THREADS, ids=lambda t: f"threads-{t or 'default'}")
async def test_a_row_answers_the_same_bits_in_any_batch_through_the_core(
    settings_factory, repository: Path, threads: int, cache: int
) -> None:
    core = await started(
        settings_factory, repository, intra_op_threads=threads, response_cache_bytes=cache,
        compile_activations=False,
    )  # fmt: skip
    try:
        for name in MODELS:
            assert "parameters" not in core.model_config(name)  # batch_invariant off
            fixed = DIGITS[0]
            want = [_bits(a) for a in _alone(repository, name, fixed[None], threads)]
            for round_ in range(ROUNDS):
                got = await _round(core, name, fixed, round_)
                assert [_bits(a) for a in got.values()] == want, (name, round_)
            # It rode with company: the batcher ran batches of more than one row.
            assert _batched_runs(core, name) > 0, name
            if cache:  # answered from the cache after its first round, as the key is the same
                assert _cache_hits(core, name) >= ROUNDS - 1
    finally:
        await core.stop()


def _cache_hits(core: DataPlane, name: str) -> int:
    """Requests answered from the response cache so far."""
    stats: Any = core.statistics(name)[0]["inference_stats"]
    return int(stats["cache_hit"]["count"])


def _watch(core: DataPlane, name: str) -> list[int]:
    """The batch sizes the model's session is asked to run, from now on."""
    session = core.started_repository().get(name).model.session
    seen: list[int] = []
    run = session.run

    def watched(names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        seen.append(len(next(iter(feed.values()))))
        return run(names, feed)

    session.run = watched  # type: ignore[method-assign,assignment]
    return seen


@pytest.mark.anyio
@pytest.mark.parametrize("invariant, size", [("rows", 1), ("pad", 16)])
@pytest.mark.parametrize("cache", [0, CACHE_BYTES], ids=["no-cache", "cache"])
async def test_batch_invariant_runs_every_batch_at_one_size(
    settings_factory, tmp_path: Path, invariant: str, size: int, cache: int
) -> None:
    """With ``batch_invariant`` the session sees only batches of ``size`` (rows alone, or
    padded to max_batch_size, 16 here), whether batched or sent as one request of many rows;
    the answers are the model's (to float32 rounding of unpadded runs), and each row's are the
    bits of its own batch-1 request, cached or not."""
    repository = _repository(tmp_path, invariant, max_batch_size=16)
    core = await started(
        settings_factory, repository, response_cache_bytes=cache, compile_activations=False
    )
    try:
        model = core.started_repository().get("mlp").model
        assert model.run_size == size
        parameters = core.model_config("mlp")["parameters"]
        assert parameters == {"batch_invariant": {"string_value": invariant}}
        seen = _watch(core, "mlp")
        fixed = DIGITS[0]
        # A batch-1 run through the runtime, past the cache: what a lone request computes.
        alone = [_bits(a) for a in model.infer({"input": fixed[None]}).values()]
        for round_ in range(2):  # the first computes it among others (and caches it)
            got = await _round(core, "mlp", fixed, round_)
            assert [_bits(a) for a in got.values()] == alone, round_
        lone = await core.infer("mlp", None, _request(fixed[None]))  # the cache's, if on
        assert [_bits(a) for a in lone.outputs.values()] == alone
        many = DIGITS[:16]
        result = await core.infer("mlp", None, _request(many))
        plain = _alone(repository, "mlp", many, 1)
        for given, want in zip(result.outputs.values(), plain, strict=True):
            np.testing.assert_allclose(given, want, rtol=1e-5, atol=1e-6)
        assert seen and set(seen) == {size}, sorted(set(seen))
        if cache:
            assert _cache_hits(core, "mlp") >= 2
    finally:
        await core.stop()


def _request(rows: np.ndarray) -> InferenceRequest:
    return InferenceRequest([RequestInput(rows, "input", "FP32")])


def _post_row(port: int, name: str, row: np.ndarray) -> list[np.ndarray]:
    """A V2 JSON request of one row to a real server: each output's values as float32 (the
    JSON numbers are float32's shortest forms, so their bits come back exactly)."""
    entry = {"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": row.tolist()}
    status, body = post(port, f"/v2/models/{name}/infer", json.dumps({"inputs": [entry]}).encode())
    assert status == 200, body
    outputs = json.loads(body)["outputs"]
    return [np.asarray(o["data"], np.float64).astype(np.float32) for o in outputs]


def _clients(port: int, name: str, fixed: np.ndarray, round_: int) -> list[np.ndarray]:
    """One round: 64 clients on threads of their own post at once, the fixed row among them."""
    rows, place = list(_others(round_)), (round_ * 17 + 5) % CLIENTS
    rows.insert(place, fixed)
    answers: list[list[np.ndarray]] = [[] for _ in rows]
    ready = threading.Barrier(len(rows))

    def client(index: int) -> None:
        ready.wait()
        answers[index] = _post_row(port, name, rows[index])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(rows))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answers), "a client got no answer"
    return answers[place]


@pytest.mark.slow
@pytest.mark.parametrize("cache", [0, CACHE_BYTES], ids=["no-cache", "cache"])
@pytest.mark.parametrize("threads", [1, 2, 0], ids=lambda t: f"threads-{t or 'default'}")
def test_a_row_answers_the_same_bits_in_any_batch_through_a_real_server(
    repository: Path, threads: int, cache: int
) -> None:
    env = {"GELU_INTRA_OP_THREADS": str(threads), "GELU_RESPONSE_CACHE_BYTES": str(cache),
           "GELU_COMPILE_ACTIVATIONS": "false"}  # fmt: skip
    fixed = DIGITS[0]
    with serving(repository, **env) as port:
        for name in MODELS:
            want = [_bits(a) for a in _alone(repository, name, fixed[None], threads)]
            for round_ in range(ROUNDS):
                got = _clients(port, name, fixed, round_)
                assert [_bits(a) for a in got] == want, (name, round_)
            status, body = get(port, f"/v2/models/{name}/stats")
            assert status == 200, body
            sizes = [b["batch_size"] for b in json.loads(body)["model_stats"][0]["batch_stats"]]
            assert max(sizes) > 1, sizes  # it rode with company


def _cuda_lacking() -> str:
    """Why the CUDA test cannot run here, or "" where it can."""
    offered = ort.get_available_providers()
    if CUDA in offered:
        return ""
    return (
        f"needs a GPU: onnxruntime {ort.__version__} offers no {CUDA} here "
        f"(it offers {', '.join(offered)})"
    )


@pytest.mark.anyio
@pytest.mark.skipif(bool(_cuda_lacking()), reason=_cuda_lacking() or "CUDA is here")
@pytest.mark.parametrize("invariant", ["pad", "rows"])
async def test_batch_invariant_holds_on_cuda(
    settings_factory, tmp_path: Path, invariant: str
) -> None:
    """On CUDA the GEMM kernel changes with the batch size (Triton#5640, onnxruntime#7642), so
    a row's bits may follow its companions; with ``batch_invariant`` they are its batch-1 bits,
    for batches gathered from 64 clients and for requests of any number of rows."""
    repository = _repository(tmp_path, invariant)
    core = await started(
        settings_factory, repository, providers=["cuda", "cpu"], strict_providers=True,
        compile_activations=False,
    )  # fmt: skip
    try:
        for name in MODELS:
            model = core.started_repository().get(name).model
            assert model.providers[0] == CUDA
            fixed = DIGITS[0]
            want = [_bits(a) for a in model.infer({"input": fixed[None]}).values()]
            for round_ in range(ROUNDS):
                got = await _round(core, name, fixed, round_)
                assert [_bits(a) for a in got.values()] == want, (name, round_)
            for size in (2, 7, 33, 128, 256):
                noise = np.random.default_rng(size).random((size - 1, len(fixed)), np.float32)
                rows = np.concatenate([fixed[None], noise])
                result = await core.infer(name, None, _request(rows))
                assert [_bits(a[:1]) for a in result.outputs.values()] == want, (name, size)
    finally:
        await core.stop()
