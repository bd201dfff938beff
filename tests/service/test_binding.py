"""A version on the GPU as Triton places it (``service.binding``): N bound instances, CUDA
graphs per padded batch size. The padding, binding and instances run here on the CPU device;
capture and replay, and the served answers against the CPU's, where onnxruntime-gpu and a GPU
are."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from contract.model_config import ConfigParseError, load_model_config
from service.binding import BoundSession
from service.errors import ModelLoadError
from service.onnxrt import OrtSession, SessionFactory, session_options
from service.rest.app import create_app
from service.runtime import TensorSpec
from tests.helpers import DIGITS

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a GPU")
HEAD = """name: "m"
max_batch_size: 12
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _cpu_sessions(model_repository: Path, count: int) -> list[ort.InferenceSession]:
    factory = SessionFactory(["CPUExecutionProvider"], session_options(1, 1), False)
    model = str(model_repository / "digits-mlp" / "2" / "model.onnx")
    return [factory.create(model, "digits-mlp/2")[0] for _ in range(count)]


def test_graph_sizes_are_tritons_graph_spec() -> None:
    every = load_model_config(HEAD + "optimization { cuda { graphs: true } }")
    assert every.cuda_graphs == (1, 2, 4, 8, 12) and every.unhonoured == ()
    chosen = load_model_config(
        HEAD + "optimization { cuda { graphs: true graph_spec [ { batch_size: 8 },"
        " { batch_size: 2 } ] } }"
    )
    assert chosen.cuda_graphs == (2, 8)
    assert load_model_config(chosen.to_pbtxt()).cuda_graphs == (2, 8)
    assert load_model_config(HEAD).cuda_graphs == ()
    # Other optimization fields are still not acted on, and said so.
    other = load_model_config(HEAD + "optimization { priority: PRIORITY_MAX }")
    assert other.unhonoured == ("optimization",)
    for bad, needle in (
        ("graph_spec [ { batch_size: 13 } ]", r"batch_size 13 is not in 1\.\.12"),
        ("graph_spec [ { batch_size: 2 input { key: \"x\" value { dim: [ 4 ] } } } ]",
         "batch_size alone"),
    ):  # fmt: skip
        with pytest.raises(ConfigParseError, match=needle):
            load_model_config(HEAD + f"optimization {{ cuda {{ graphs: true {bad} }} }}")
    unbatched = HEAD.replace("max_batch_size: 12", "max_batch_size: 0")
    with pytest.raises(ConfigParseError, match="max_batch_size >= 1"):
        load_model_config(unbatched + "optimization { cuda { graphs: true } }")


@pytest.mark.parametrize("bind", [False, True])
def test_padded_batches_answer_as_the_plain_run(model_repository: Path, bind: bool) -> None:
    """Each batch is padded to the next graph size (past the largest it runs uncaptured,
    bound or plain), and its rows answer as the session's own run; an answer is not
    overwritten by the next run on the same buffers."""
    sessions = _cpu_sessions(model_repository, 2)
    plain = OrtSession(sessions[0], ["CPUExecutionProvider"], 0)
    specs = (plain.inputs, plain.outputs)
    bound = BoundSession(sessions, (1, 4, 8), specs, ("cpu", 0), "digits-mlp/2", bind)
    names = ["logits", "probabilities"]
    for rows in (1, 2, 3, 4, 5, 8, 9, 20):
        x = DIGITS[:rows]
        expected = plain.run(names, {"input": x})
        got = bound.run(names, {"input": x})
        assert [a.shape for a in got] == [(rows, 10), (rows, 10)]
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    first = bound.run(["logits"], {"input": DIGITS[:3]})[0].copy()
    kept = bound.run(["logits"], {"input": DIGITS[:3]})[0]
    bound.run(["logits"], {"input": DIGITS[10:13]})  # same graph, other rows
    np.testing.assert_array_equal(kept, first)


def test_instances_run_at_once(model_repository: Path) -> None:
    sessions = _cpu_sessions(model_repository, 3)
    plain = OrtSession(sessions[0], ["CPUExecutionProvider"], 0)
    bound = BoundSession(sessions, (2, 8), (plain.inputs, plain.outputs), ("cpu", 0), "m/1")
    assert len(bound.instances) == 3

    def answer(start: int) -> bool:
        x = DIGITS[start : start + 1 + start % 7]
        got = bound.run(["logits"], {"input": x})[0]
        return bool(np.allclose(got, plain.run(["logits"], {"input": x})[0], atol=1e-6))

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(answer, range(200)))


def test_graphs_need_fixed_dims(model_repository: Path) -> None:
    sessions = _cpu_sessions(model_repository, 1)
    varying = ([TensorSpec("input", "FP32", (-1, -1))], [TensorSpec("logits", "FP32", (-1, 10))])
    with pytest.raises(ModelLoadError, match="fixed dims past the batch axis; input vary"):
        BoundSession(sessions, (1,), varying, ("cpu", 0), "m/1")


def test_graphs_asked_for_on_the_cpu_serve_without(settings_factory, tmp_path, caplog) -> None:
    """A config that asks for CUDA graphs still serves where the version runs on the CPU, and
    its config says nothing of graphs that are not in force."""
    if HAS_CUDA:
        pytest.skip("onnxruntime here has CUDA")
    repository = _with_graphs(settings_factory().model_repository, tmp_path, count=2)
    with TestClient(create_app(settings_factory(model_repository=repository))) as client:
        response = client.post(
            "/v1/models/digits-mlp:predict", json={"instances": DIGITS[:3].tolist()}
        )
        assert response.status_code == 200
        config = client.get("/v2/models/digits-mlp/config").json()
        assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
        assert "optimization" not in config
    assert "CUDA graphs asked for, but it runs on CPUExecutionProvider" in caplog.text


def _with_graphs(source: Path, tmp_path: Path, count: int, graphs: bool = True) -> Path:
    repository = tmp_path / "repository"
    shutil.copytree(source / "digits-mlp", repository / "digits-mlp")
    config = repository / "digits-mlp" / "config.pbtxt"
    text = config.read_text() + f"instance_group [ {{ kind: KIND_GPU count: {count} }} ]\n"
    if graphs:
        text += (
            "optimization { cuda { graphs: true graph_spec [ { batch_size: 1 },"
            " { batch_size: 4 }, { batch_size: 16 } ] } }\n"
        )
    config.write_text(text)
    return repository


@needs_gpu
@pytest.mark.parametrize(
    ("count", "graphs", "binding"),
    [(1, False, False), (2, False, False), (1, False, True), (2, True, False), (2, True, True)],
)
def test_cuda_graphs_and_binding_answer_as_the_cpu(
    settings_factory, tmp_path, count, graphs, binding
):
    """Served on CUDA (TF32 off): one session's plain run, two instances, bound, and with
    graphs captured at load and replayed on padded batches: every answer is the CPU's
    within 1e-5."""
    source = settings_factory().model_repository
    repository = _with_graphs(source, tmp_path, count, graphs)
    answers: dict[str, list[np.ndarray]] = {}
    for providers in (["cpu"], ["cuda", "cpu"]):
        settings = settings_factory(model_repository=repository, providers=providers,
                                    strict_providers=True, cuda_io_binding=binding)  # fmt: skip
        with TestClient(create_app(settings)) as client:
            got = []
            for rows in (1, 3, 4, 5, 16, 17, 40, 3):
                x = DIGITS[rows : 2 * rows].tolist()
                body = {"inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32",
                                    "data": x}], "outputs": [{"name": "logits"}]}  # fmt: skip
                response = client.post("/v2/models/digits-mlp/infer", json=body)
                assert response.status_code == 200, response.text
                got.append(np.array(response.json()["outputs"][0]["data"]))
            answers[providers[0]] = got
            config = client.get("/v2/models/digits-mlp/config").json()
            if providers[0] == "cuda":
                group = {"kind": "KIND_GPU", "count": count, "gpus": [0]}
                assert config["instance_group"][0] == group
            if providers[0] == "cuda" and graphs:
                cuda = config["optimization"]["cuda"]
                assert cuda["graphs"] is True
                assert [s["batch_size"] for s in cuda["graph_spec"]] == [1, 4, 16]
                summary = client.get("/v1/models/digits-mlp").json()
                options = summary["provider_options"]["CUDAExecutionProvider"]
                assert options["enable_cuda_graph"] == "1"
    for cuda, cpu in zip(answers["cuda"], answers["cpu"], strict=True):
        np.testing.assert_allclose(cuda, cpu, atol=1e-5, rtol=0)
