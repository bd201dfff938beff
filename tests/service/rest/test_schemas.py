"""The request and response bodies documented: every route in the OpenAPI document, its
binary forms, and every answer a status and media type its operation documents."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import DIGITS


def test_openapi_documents_every_route(client) -> None:
    spec = client.get("/openapi.json").json()
    routes = {r.path for r in client.app.routes if hasattr(r, "methods")}
    documented = set(spec["paths"])
    assert routes - {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"} <= documented
    predict = spec["paths"]["/v1/models/{name}:predict"]["post"]
    schema = predict["requestBody"]["content"]["application/json"]["schema"]
    assert "instances" in schema["properties"]
    assert {"400", "404", "413"} <= set(predict["responses"])
    infer = spec["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]["content"]
    assert "application/octet-stream" in infer
    assert client.get("/docs").status_code == 200


def test_binary_forms_are_documented(client) -> None:
    document = client.get("/openapi.json").json()
    for path in (
        "/v2/models/{name}/infer",
        "/v2/models/{name}/versions/{version}/infer",
        "/v1/activations/{name}",
    ):
        operation = document["paths"][path]["post"]
        assert "application/octet-stream" in operation["requestBody"]["content"], path
        assert "application/octet-stream" in operation["responses"]["200"]["content"], path


def _binary_infer(rows: np.ndarray) -> tuple[bytes, dict[str, str]]:
    request = {
        "inputs": [
            {
                "name": "input",
                "shape": [len(rows), 64],
                "datatype": "FP32",
                "parameters": {"binary_data_size": rows.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    header = json.dumps(request).encode()
    return header + rows.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _requests():
    """(method, path template, concrete path, body, headers): good and bad requests."""
    row = DIGITS[:1]
    binary, binary_headers = _binary_infer(row)
    octet = {"Content-Type": "application/octet-stream"}
    v2 = "/v2/models/{name}/infer"
    v2v = "/v2/models/{name}/versions/{version}/infer"
    predict = "/v1/models/{name}:predict"
    act = "/v1/activations/{name}"
    ready = "/v2/models/{name}/versions/{version}/ready"
    big = np.zeros((5000, 64)).tolist()  # above the test client's 1 MiB body limit
    good_v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                           "data": row.ravel().tolist()}]}  # fmt: skip
    return [
        ("post", predict, "/v1/models/digits-mlp:predict", {"instances": row.tolist()}, {}),
        ("post", predict, "/v1/models/digits-mlp:predict", {"instances": []}, {}),
        ("post", predict, "/v1/models/digits-mlp:predict", b"{not json", {}),
        ("post", predict, "/v1/models/nope:predict", {"instances": row.tolist()}, {}),
        ("post", predict, "/v1/models/digits-mlp:predict", {"instances": big}, {}),
        ("post", v2, "/v2/models/digits-mlp/infer", good_v2, {}),
        ("post", v2, "/v2/models/digits-mlp/infer", binary, binary_headers),
        ("post", v2, "/v2/models/digits-mlp/infer", {"inputs": [{"name": "x"}]}, {}),
        ("post", v2v, "/v2/models/digits-mlp/versions/9/infer", good_v2, {}),
        ("get", "/v2/models/{name}", "/v2/models/nope", None, {}),
        ("get", ready, "/v2/models/digits-mlp/versions/9/ready", None, {}),
        ("get", "/v2/models/{name}/config", "/v2/models/digits-mlp/config", None, {}),
        ("get", "/v1/models/{name}", "/v1/models/nope", None, {}),
        ("post", act, "/v1/activations/gelu", {"data": [1.0]}, {}),
        ("post", act, "/v1/activations/gelu?derivative=maybe", {"data": [1.0]}, {}),
        ("post", act, "/v1/activations/nope", {"data": [1.0]}, {}),
        ("post", act, "/v1/activations/gelu?shape=2", np.ones(2, "<f4").tobytes(), octet),
        ("post", act, "/v1/activations/gelu?shape=3", np.ones(2, "<f4").tobytes(), octet),
        ("get", "/v2/health/ready", "/v2/health/ready", None, {}),
        ("get", "/metrics", "/metrics", None, {}),
    ]


@pytest.mark.parametrize(
    ("method", "template", "path", "body", "headers"),
    _requests(),
    ids=[f"{r[0]} {r[2]}" for r in _requests()],
)
def test_answers_are_documented(client, method, template, path, body, headers) -> None:
    """Each answer's status is one the operation documents, in a media type it documents."""
    operation = client.get("/openapi.json").json()["paths"][template][method]
    if isinstance(body, bytes):
        response = client.request(method, path, content=body, headers=headers)
    else:
        response = client.request(method, path, json=body, headers=headers)
    code = str(response.status_code)
    assert code in operation["responses"], (code, response.text[:200])
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type in operation["responses"][code]["content"], media_type
    if code.startswith("4"):
        assert list(response.json()) == ["error"]
