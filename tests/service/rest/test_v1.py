"""V1 (KServe style) routes, in process with the lifespan run."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import DIGITS, assert_error


def test_list_models(client) -> None:
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"digits-mlp", "digits-mlp-tanh", "digits-autoencoder"}
    mlp = models["digits-mlp"]
    assert mlp["versions"] == ["1", "2"] and mlp["latest_version"] == "2"
    assert mlp["task"] == "classification" and mlp["activation"] == "gelu"
    assert mlp["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert mlp["label_names"] == [str(i) for i in range(10)]
    assert mlp["input_normalisation"] == {"divide_by": 16.0}
    assert mlp["providers"] == ["CPUExecutionProvider"]
    assert models["digits-mlp-tanh"]["activation"] == "gelu_tanh"


def test_describe_model(client) -> None:
    body = client.get("/v1/models/digits-autoencoder").json()
    assert body["task"] == "reconstruction" and body["ready"] is True
    assert_error(client.get("/v1/models/nope"), 404, "no model 'nope'")


def test_predict_classifier_matches_onnxruntime(client, model_repository) -> None:
    import onnxruntime as ort

    x = DIGITS[:5]
    response = client.post("/v1/models/digits-mlp:predict", json={"instances": x.tolist()})
    assert response.status_code == 200
    predictions = response.json()["predictions"]
    session = ort.InferenceSession(str(model_repository / "digits-mlp" / "2" / "model.onnx"))
    (probs,) = session.run(["probabilities"], {"input": x})
    assert len(predictions) == 5
    for prediction, row in zip(predictions, probs, strict=True):
        assert prediction["class_index"] == int(row.argmax())
        assert prediction["label"] == str(int(row.argmax()))
        np.testing.assert_allclose(prediction["probabilities"], row, rtol=1e-6)


def test_predict_one_version(client) -> None:
    response = client.post(
        "/v1/models/digits-mlp/versions/1:predict", json={"instances": DIGITS[:2].tolist()}
    )
    assert response.status_code == 200 and len(response.json()["predictions"]) == 2
    assert_error(
        client.post("/v1/models/digits-mlp/versions/9:predict", json={"instances": []}),
        404,
        "unknown version '9'",
    )


def test_predict_autoencoder_reports_reconstruction_error(client) -> None:
    x = DIGITS[:3]
    response = client.post("/v1/models/digits-autoencoder:predict", json={"instances": x.tolist()})
    predictions = response.json()["predictions"]
    for prediction, row in zip(predictions, x, strict=True):
        reconstruction = np.asarray(prediction["reconstruction"], dtype=np.float32)
        assert reconstruction.shape == (64,)
        assert prediction["error"] == pytest.approx(float(((reconstruction - row) ** 2).mean()))


def test_kserve_inputs_key_is_accepted(client) -> None:
    response = client.post("/v1/models/digits-mlp:predict", json={"inputs": DIGITS[:1].tolist()})
    assert response.status_code == 200


def test_kserve_liveness_at_the_root(client) -> None:
    """KServe's V1 protocol: GET / answers while the process serves."""
    response = client.get("/")
    assert response.status_code == 200 and response.json() == {"status": "alive"}
