"""Triton's ensembles: the default one (the autoencoder's reconstruction into the classifier)
answers bit-identically to calling its steps in turn, in process and through tritonclient over
HTTP and gRPC; each step is counted as a request of its own; a mis-wired ensemble is refused
with the reason while the rest serve."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.model_config import EnsembleStep
from export.defaults import DEFAULT_ENSEMBLE, default_ensemble, write_ensemble
from service.control import ModelControl
from service.dataplane import DataPlane
from service.inference import InferenceRequest, RequestInput
from tests.helpers import DIGITS

pytestmark = pytest.mark.anyio
ROWS = DIGITS[:5]


@pytest.fixture
def repo(repo: Path) -> Path:
    """A private copy of the test repository with the default ensemble."""
    write_ensemble(repo, default_ensemble(repo))
    return repo


def request(rows: np.ndarray) -> InferenceRequest:
    return InferenceRequest([RequestInput(rows, "input", "FP32")])


async def test_an_ensemble_answers_as_its_steps_in_turn(settings_factory, repo: Path) -> None:
    core = DataPlane(settings_factory(model_repository=repo))
    await core.start()
    try:
        whole = (await core.infer(DEFAULT_ENSEMBLE, None, request(ROWS))).outputs
        reconstruction = (await core.infer("digits-autoencoder", None, request(ROWS))).outputs
        classified = (await core.infer("digits-mlp", None, request(
            reconstruction["reconstruction"]))).outputs  # fmt: skip
        assert list(whole) == ["reconstruction", "logits", "probabilities"]
        np.testing.assert_array_equal(whole["reconstruction"], reconstruction["reconstruction"])
        np.testing.assert_array_equal(whole["probabilities"], classified["probabilities"])
        np.testing.assert_array_equal(whole["logits"], classified["logits"])
        metadata = core.model_metadata(DEFAULT_ENSEMBLE)
        assert metadata["platform"] == "ensemble"
        assert [t["name"] for t in metadata["inputs"]] == ["input"]
        # Each step is a request of its own: two of each model, one of the ensemble.
        counts = {(s["name"], s["version"]): s["inference_count"] for s in core.statistics()}
        assert counts[(DEFAULT_ENSEMBLE, "1")] == 0  # no execution of its own
        success = {s["name"]: s["inference_stats"]["success"]["count"]  # type: ignore[index]
                   for s in core.statistics()}  # fmt: skip
        assert success[DEFAULT_ENSEMBLE] == 1 and success["digits-autoencoder"] == 2
        config = core.model_config(DEFAULT_ENSEMBLE)
        assert config["platform"] == "ensemble" and "instance_group" not in config
        steps = config["ensemble_scheduling"]["step"]
        assert [s["model_name"] for s in steps] == ["digits-autoencoder", "digits-mlp"]
        assert steps[1]["input_map"] == {"input": "reconstruction"}
    finally:
        await core.stop()


def _rewired(repo: Path, **changes: Any) -> None:
    config = default_ensemble(repo)
    first, second = config.steps
    second = dataclasses.replace(second, **changes)
    write_ensemble(repo, dataclasses.replace(config, steps=(first, second)))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"model_name": "nope"}, "step 2 ('nope'): no such model"),
        ({"input_map": (("x", "reconstruction"),)}, "input_map feeds ['x'], the model takes"),
        ({"input_map": (("input", "later"),)}, "no tensor 'later' exists before this step"),
        ({"output_map": (("scores", "probabilities"),)}, "the model has no output 'scores'"),
        ({"model_name": DEFAULT_ENSEMBLE}, "no such model"),
    ],
)
async def test_a_mis_wired_ensemble_is_refused_with_the_reason(
    settings_factory, repo: Path, changes: dict[str, Any], reason: str
) -> None:
    _rewired(repo, **changes)
    core = DataPlane(settings_factory(model_repository=repo, exit_on_error=False))
    await core.start()
    try:
        (entry,) = [
            e for e in await ModelControl.over(core).index() if e["name"] == DEFAULT_ENSEMBLE
        ]
        assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"]
        assert "digits-mlp" in core.model_names()  # the rest serve
    finally:
        await core.stop()


async def test_a_step_may_not_be_an_ensemble(settings_factory, repo: Path) -> None:
    nested = dataclasses.replace(default_ensemble(repo), name="nested", steps=(
        EnsembleStep(DEFAULT_ENSEMBLE, -1, (("input", "input"),),
                     (("probabilities", "probabilities"),)),
    ))  # fmt: skip
    write_ensemble(repo, nested)
    core = DataPlane(settings_factory(model_repository=repo, exit_on_error=False))
    await core.start()
    try:
        (entry,) = [e for e in await ModelControl.over(core).index() if e["name"] == "nested"]
        assert "a step may not be an ensemble" in entry["reason"]
    finally:
        await core.stop()


def _through(module: Any, url: str) -> np.ndarray:
    """The ensemble's probabilities through one tritonclient, checked against its steps in
    turn, its metadata and its config."""
    client = module.InferenceServerClient(url)

    def infer(model: str, rows: np.ndarray, output: str) -> np.ndarray:
        tensor = module.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows.astype(np.float32))
        requested = [module.InferRequestedOutput(output)]
        return client.infer(model, [tensor], outputs=requested).as_numpy(output)

    whole = infer(DEFAULT_ENSEMBLE, ROWS, "probabilities")
    steps = infer("digits-mlp", infer("digits-autoencoder", ROWS, "reconstruction"),
                  "probabilities")  # fmt: skip
    np.testing.assert_array_equal(whole, steps)
    grpc = module.__name__.endswith("grpc")
    metadata = client.get_model_metadata(DEFAULT_ENSEMBLE, **({"as_json": True} if grpc else {}))
    assert metadata["platform"] == "ensemble"
    config = client.get_model_config(DEFAULT_ENSEMBLE, **({"as_json": True} if grpc else {}))
    config = config.get("config", config)  # gRPC's answer wraps it
    assert config["ensemble_scheduling"]["step"][0]["output_map"] == {
        "reconstruction": "reconstruction"
    }
    client.close()
    return whole


@pytest.mark.slow
def test_tritonclient_over_http_and_grpc(repo: Path) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tests.servers import grpc_server

    with grpc_server(repo) as server:
        over_http = _through(httpclient, f"127.0.0.1:{server.http_port}")
        over_grpc = _through(grpcclient, server.address)
    np.testing.assert_array_equal(over_http, over_grpc)
