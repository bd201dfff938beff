"""The runtime interface: a version checked against its config.pbtxt, the largest batch within
a time budget, and a second runtime serving behind the interface as onnxruntime does."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from service.errors import StartupError
from service.runtime import ONE_INSTANCE, Placement, TensorSpec
from service.settings import Settings
from tests.helpers import DIGITS, load_model, start_app


def test_config_that_does_not_match_the_model(tmp_path: Path, model_repository: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "digits-mlp-tanh", repo / "digits-mlp-tanh")
    config = repo / "digits-mlp-tanh" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 64 ]", "dims: [ 65 ]"))
    with pytest.raises(
        StartupError, match=r"input 'input' is FP32 \[64\] in model.onnx but FP32 \[65\]"
    ):
        start_app(repo)
    config.write_text("name: ")
    with pytest.raises(StartupError, match=r"config\.pbtxt"):
        start_app(repo)


def test_largest_batch_within_a_budget(model_repository: Path) -> None:
    model = load_model(model_repository, "digits-mlp", warmup=0)
    assert model.largest_batch_within(1e9, 300)[0] == 300  # powers of two, then the largest
    limit, cost = model.largest_batch_within(0, 300)
    assert limit == 0 and cost > 0  # not even one sample fits: the time of one is reported


class _NumpySession:
    """A second runtime's session, behind the same interface: softmax(x @ w) in numpy."""

    def __init__(self, features: int, classes: int) -> None:
        from service.runtime import TensorSpec

        self.w = np.random.default_rng(1).standard_normal((features, classes)).astype(np.float32)
        self.providers = ["numpy"]
        self.provider_options: dict[str, dict[str, str]] = {"numpy": {}}
        self.inputs = [TensorSpec("input", "FP32", (-1, features))]
        self.outputs = [
            TensorSpec("logits", "FP32", (-1, classes)),
            TensorSpec("probabilities", "FP32", (-1, classes)),
        ]
        self.metadata_props: dict[str, str] = {}
        self.memory_bytes = self.w.nbytes
        self.runs: list[int] = []
        self.closed = False

    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        assert not self.closed
        self.runs.append(len(feed["input"]))
        logits = feed["input"] @ self.w
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        answers = {"logits": logits, "probabilities": e / e.sum(axis=1, keepdims=True)}
        return [answers[name] for name in outputs]

    def close(self) -> None:
        self.closed = True


class _NumpyRuntime:
    def __init__(self) -> None:
        self.opened: dict[str, _NumpySession] = {}

    def open(self, model: bytes, label: str, placement: Placement = ONE_INSTANCE) -> _NumpySession:
        session = self.opened[label] = _NumpySession(64, 10)
        return session

    def declared(self, model: bytes, label: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        session = _NumpySession(64, 10)
        return session.inputs, session.outputs


def test_a_second_runtime_serves_behind_the_interface(model_repository: Path) -> None:
    """The core runs models through ``service.runtime.Runtime`` only: a numpy runtime's
    sessions are checked against config.pbtxt, warmed, batched, described and released as
    onnxruntime's are."""
    import asyncio

    from contract.metadata import ModelMetadata
    from service.dataplane import DataPlane
    from service.inference import InferenceRequest, RequestInput

    props = ModelMetadata(name="digits-mlp", version="1", arch="mlp", activation="gelu",
                          task="classification", label_names=tuple("0123456789"),
                          input_normalisation={"divide_by": 16.0}, metrics={},
                          dataset="digits").to_props()  # fmt: skip
    runtime = _NumpyRuntime()
    real_open = runtime.open

    def open_with_metadata(
        model: bytes, label: str, placement: Placement = ONE_INSTANCE
    ) -> _NumpySession:
        session = real_open(model, label, placement)
        session.metadata_props = props
        return session

    runtime.open = open_with_metadata  # type: ignore[method-assign]
    settings = Settings(
        model_repository=model_repository,
        warmup_runs=2,
        grpc_port=0,
        model_control_mode="explicit",
        load_models=["digits-mlp"],
    )

    async def main() -> None:
        plane = DataPlane(settings, runtime=runtime)
        async with plane.running():
            info = plane.model_info("digits-mlp")
            assert info.providers == ["numpy"] and info.memory_bytes == 64 * 10 * 4
            x = DIGITS[:3]
            request = InferenceRequest([RequestInput(x, "input", "FP32")])
            result = await plane.infer("digits-mlp", None, request)
            session = runtime.opened["digits-mlp/2"]
            expected = session.run(["probabilities"], {"input": x})[0]
            np.testing.assert_allclose(result.outputs["probabilities"], expected)
            assert 3 in session.runs  # the request's batch, after the warm-up's
        assert all(s.closed for s in runtime.opened.values())  # every version released

    asyncio.run(main())


def _invariant(repo: Path, model_repository: Path, text: str) -> Path:
    """``digits-mlp`` copied into ``repo``, ``text`` added to its config.pbtxt."""
    shutil.copytree(model_repository / "digits-mlp", repo / "digits-mlp")
    config = repo / "digits-mlp" / "config.pbtxt"
    config.write_text(config.read_text() + text)
    return repo


@pytest.mark.parametrize(
    "text, size",
    [
        ("", 0),
        ('parameters { key: "batch_invariant" value { string_value: "off" } }', 0),
        ('parameters { key: "batch_invariant" value { string_value: "rows" } }', 1),
        ('parameters { key: "batch_invariant" value { string_value: "pad" } }', 256),
        # CUDA graphs are captured at fixed sizes: pad to the largest (on the CPU, unused).
        ('parameters { key: "batch_invariant" value { string_value: "pad" } }\n'
         "optimization { cuda { graphs: true graph_spec [ { batch_size: 1 }, { batch_size: 4 } ] }"
         " }", 4),
    ],
)  # fmt: skip
def test_batch_invariant_runs_each_slice_at_one_size(
    tmp_path: Path, model_repository: Path, text: str, size: int
) -> None:
    """Every run the session sees has ``run_size`` rows (the last slice padded with copies of
    its last row); the rows' answers are the unpadded run's, and each row's bits are those it
    has in a batch of one, wherever it sits."""
    model = load_model(_invariant(tmp_path, model_repository, text), "digits-mlp", warmup=0)
    assert model.run_size == size
    seen: list[int] = []
    run = model.session.run

    def watched(names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        seen.append(len(feed["input"]))
        return run(names, feed)

    model.session.run = watched  # type: ignore[method-assign,assignment]
    rows = DIGITS[:10]
    got = model.infer({"input": rows})
    plain = dict(zip(model.output_names, run(model.output_names, {"input": rows}), strict=True))
    for name, values in got.items():
        assert values.shape == plain[name].shape
        np.testing.assert_allclose(values, plain[name], rtol=1e-5, atol=1e-6)
    assert seen == ([size] * -(-10 // size) if size else [10])
    for i in (0, 4, 9):  # first, a slice's first, the padded slice's last
        alone = model.infer({"input": rows[i : i + 1]}, ["logits"])["logits"]
        assert alone.tobytes() == got["logits"][i : i + 1].tobytes(), i


def test_one_input_shortcut_answers_as_the_general_checks(model_repository: Path) -> None:
    """checked_inputs' shortcut for a model of one input gives what its general pass gives,
    the same arrays or the same error."""
    from service.inference import RequestInput

    model = load_model(model_repository, "digits-mlp", warmup=0)
    assert model.only_input is not None
    row, name = np.full((2, 64), 0.5), model.inputs[0].name
    cases = [
        [RequestInput(row)],  # V1
        [RequestInput(row.astype(np.float32), name, "FP32")],
        [RequestInput(np.full((2, 64), 1e39))],  # outside float32
        [RequestInput(np.zeros((0, 64)))],  # empty batch
        [RequestInput(np.zeros(64))],  # no batch axis
        [RequestInput(np.zeros((2, 63), np.float32), name, "FP32")],
        [RequestInput(row.astype(np.float32), "other", "FP32")],
        [RequestInput(row, name, "FP64")],
        [RequestInput(np.full((9, 64), 0.5))],  # above the maximum of 8
        [RequestInput(row), RequestInput(row)],
    ]
    for given in cases:
        answers: list[object] = []
        for check in (model.checked_inputs, model._checked_inputs):
            try:
                answers.append({k: (a.dtype, a.tolist()) for k, a in check(given, 8).items()})
            except Exception as exc:  # the same class and message from both
                answers.append((type(exc), str(exc)))
        assert answers[0] == answers[1]
    assert isinstance(answers[0], tuple)  # the last case fails: both tested, not only passes
