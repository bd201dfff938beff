"""The Open Inference Protocol routes, JSON and the binary tensor data extension, and
Triton's model repository extension over them: index, load, unload."""

from __future__ import annotations

import json

import numpy as np
from fastapi.testclient import TestClient

from service.control import CONTROL_FORBIDDEN
from tests.helpers import DIGITS, assert_error, binary_request, predict


def split_binary(response) -> tuple[dict, bytes]:
    length = int(response.headers["Inference-Header-Content-Length"])
    return json.loads(response.content[:length]), response.content[length:]


def test_server_metadata_and_health(client) -> None:
    body = client.get("/v2").json()
    assert body["name"] == "gelu-serve" and "binary_tensor_data" in body["extensions"]
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}


def test_model_metadata_and_readiness(client) -> None:
    body = client.get("/v2/models/digits-mlp").json()
    assert body == {
        "name": "digits-mlp",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }
    assert client.get("/v2/models/digits-mlp/versions/1").json()["versions"] == ["1"]
    assert client.get("/v2/models/digits-mlp/ready").status_code == 200
    assert client.get("/v2/models/digits-mlp/versions/2/ready").json()["ready"] is True
    assert_error(client.get("/v2/models/digits-mlp/versions/3/ready"), 404, "unknown version")
    assert_error(client.get("/v2/models/nope"), 404, "unknown model 'nope'")
    config = client.get("/v2/models/digits-mlp/config").json()
    assert config["max_batch_size"] == 256 and config["input"][0]["dims"] == [64]


def test_infer_json_flat_and_nested(client) -> None:
    x = DIGITS[:4]
    for data in (x.reshape(-1).tolist(), x.tolist()):
        body = {"id": "r1", "inputs": [{"name": "input", "shape": [4, 64], "datatype": "FP32",
                                        "data": data}]}  # fmt: skip
        response = client.post("/v2/models/digits-mlp/infer", json=body)
        assert response.status_code == 200, response.text
        out = response.json()
        assert out["model_name"] == "digits-mlp" and out["model_version"] == "2"
        assert out["id"] == "r1"
        by_name = {o["name"]: o for o in out["outputs"]}
        assert by_name["probabilities"]["shape"] == [4, 10]
        probs = np.asarray(by_name["probabilities"]["data"]).reshape(4, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_infer_binary_in_and_out_matches_json(client) -> None:
    x = DIGITS[:6]
    json_body = {"inputs": [{"name": "input", "shape": [6, 64], "datatype": "FP32",
                             "data": x.reshape(-1).tolist()}],
                 "outputs": [{"name": "logits"}]}  # fmt: skip
    want = client.post("/v2/models/digits-mlp/versions/1/infer", json=json_body).json()
    want_logits = np.asarray(want["outputs"][0]["data"], dtype=np.float32).reshape(6, 10)

    content, headers = binary_request(x, [{"name": "logits", "parameters": {"binary_data": True}}])
    response = client.post("/v2/models/digits-mlp/versions/1/infer", content=content,
                           headers=headers)  # fmt: skip
    assert response.status_code == 200, response.text
    header, blob = split_binary(response)
    (entry,) = header["outputs"]
    assert entry["name"] == "logits" and entry["parameters"]["binary_data_size"] == 240
    got = np.frombuffer(blob, dtype="<f4").reshape(6, 10)
    np.testing.assert_array_equal(got, want_logits)


def test_binary_data_output_for_every_output(client) -> None:
    content, headers = binary_request(DIGITS[:2], parameters={"binary_data_output": True})
    header, blob = split_binary(
        client.post("/v2/models/digits-mlp/infer", content=content, headers=headers)
    )
    assert [o["name"] for o in header["outputs"]] == ["logits", "probabilities"]
    assert len(blob) == 2 * 2 * 10 * 4


def test_binary_input_json_output(client) -> None:
    content, headers = binary_request(DIGITS[:2], [{"name": "probabilities"}])
    response = client.post("/v2/models/digits-mlp/infer", content=content, headers=headers)
    assert response.headers["content-type"] == "application/json"
    assert len(response.json()["outputs"][0]["data"]) == 20


def test_the_models_are_listed_as_kserve_lists_them(client) -> None:
    assert client.get("/v2/models").json() == {
        "models": ["digits-autoencoder", "digits-mlp", "digits-mlp-tanh"]
    }


def test_classification_returns_the_top_classes_as_triton_does(client) -> None:
    x = DIGITS[:3]
    full = client.post(
        "/v2/models/digits-mlp/infer",
        json={"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32",
                          "data": x.ravel().tolist()}]},
    ).json()  # fmt: skip
    probabilities = np.array(full["outputs"][1]["data"]).reshape(3, 10)
    parameters: dict = {"classification": 2}
    wanted = [{"name": "probabilities", "parameters": parameters}]
    content, headers = binary_request(x, wanted)
    response = client.post("/v2/models/digits-mlp/infer", content=content, headers=headers)
    (output,) = response.json()["outputs"]
    assert output["datatype"] == "BYTES" and output["shape"] == [3, 2]
    for i, row in enumerate(probabilities):
        first, second = np.argsort(-row)[:2]
        assert output["data"][2 * i] == f"{row[first]:f}:{first}:{first}"
        assert output["data"][2 * i + 1] == f"{row[second]:f}:{second}:{second}"
    # As raw bytes: each element a 4-byte little-endian length, then the string.
    parameters["binary_data"] = True
    content, headers = binary_request(x, wanted)
    header, raw = split_binary(
        client.post("/v2/models/digits-mlp/infer", content=content, headers=headers)
    )
    strings, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        strings.append(raw[offset + 4 : offset + 4 + size].decode())
        offset += 4 + size
    assert strings == output["data"]
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(raw)


def test_a_wrong_method_is_405_with_allow(client) -> None:
    response = client.get("/v1/models/digits-mlp:predict")
    assert_error(response, 405, "GET is not allowed on :predict")
    assert response.headers["allow"] == "POST"
    response = client.get("/v2/models/digits-mlp/infer")
    assert_error(response, 405, "Method Not Allowed")
    assert response.headers["allow"] == "POST"


def test_index_lists_every_version_with_its_state(client) -> None:
    index = client.post("/v2/repository/index").json()
    assert {"name": "digits-mlp", "version": "2", "state": "READY", "reason": ""} in index
    assert {e["name"] for e in index} == {"digits-autoencoder", "digits-mlp", "digits-mlp-tanh"}
    assert client.post("/v2/repository/index", json={"ready": True}).json() == index
    assert "model_repository" in client.get("/v2").json()["extensions"]
    assert_error(client.post("/v2/repository/index", json={"ready": "yes"}), 400, "ready")
    assert_error(client.post("/v2/repository/index", content=b"[1"), 400, "malformed JSON")


def test_load_and_unload_are_forbidden_outside_explicit_mode(client) -> None:
    for action in ("load", "unload"):
        response = client.post(f"/v2/repository/models/digits-mlp/{action}")
        assert_error(response, 503, CONTROL_FORBIDDEN)
    assert predict(client, "digits-mlp") == 200


def test_explicit_mode_over_http(explicit: TestClient) -> None:
    assert predict(explicit, "digits-mlp-tanh") == 404
    assert explicit.post("/v2/repository/models/digits-mlp-tanh/load").status_code == 200
    assert predict(explicit, "digits-mlp-tanh") == 200
    assert explicit.get("/v2/models/digits-mlp-tanh/ready").status_code == 200
    load, unload = (f"/v2/repository/models/digits-mlp-tanh/{a}" for a in ("load", "unload"))
    # Triton's overrides are refused, not ignored: the model stays as the repository holds it
    for key in ("config", "file:1/model.onnx"):
        response = explicit.post(load, json={"parameters": {key: "e30="}})
        assert_error(response, 400, f"load parameter {key!r} is not supported")
    for body in (b"[1]", b'{"parameters": [1]}', b"{"):
        assert_error(explicit.post(load, content=body), 400, "JSON")
        assert_error(explicit.post(unload, content=body), 400, "JSON")
    assert predict(explicit, "digits-mlp-tanh") == 200
    assert explicit.post(load, json={"parameters": {"custom": 1}}).status_code == 200
    assert explicit.post(load, json={}).status_code == 200
    no_dependents = {"parameters": {"unload_dependents": True}}
    response = explicit.post("/v2/repository/models/digits-mlp/unload", json=no_dependents)
    assert response.status_code == 200
    assert predict(explicit, "digits-mlp") == 404
    # Unloaded, still in the repository: not ready (503), not unknown (404); and the server,
    # whose operator unloaded it, is still ready.
    assert_error(explicit.get("/v2/models/digits-mlp/ready"), 503, "'digits-mlp' is not ready")
    assert_error(explicit.get("/v2/models/nope/ready"), 404, "no model 'nope'")
    assert explicit.get("/v2/health/ready").status_code == 200
    assert_error(explicit.post("/v2/repository/models/nope/load"), 404, "no model 'nope'")
    assert_error(explicit.post("/v2/repository/models/nope/unload"), 404, "no model 'nope'")
    assert_error(explicit.post("/v2/repository/models/.staging/load"), 404, "no model")
    ready = explicit.post("/v2/repository/index", json={"ready": True}).json()
    assert {e["name"] for e in ready} == {"digits-mlp-tanh"}
