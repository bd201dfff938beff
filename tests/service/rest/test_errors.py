"""Every client mistake gets a 4xx with one JSON error shape, and the service keeps serving."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import DIGITS, assert_error, binary_request

ROW = [0.5] * 64
V1 = "/v1/models/digits-mlp:predict"
V2 = "/v2/models/digits-mlp/infer"


def v2_body(**changes) -> dict:
    entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW, **changes}
    return {"inputs": [entry]}


CASES = [
    # (path, body bytes or JSON, status, what the message says)
    (V1, b'{"instances": [[1, 2', 400, "malformed JSON"),
    (V1, b"", 400, "empty body"),
    (V1, b'{"instances": [[NaN]]}', 400, "malformed JSON"),
    (V1, b'{"instances": [[1e400]]}', 400, "malformed JSON"),
    (V1, {"instances": [[1e39] * 64]}, 400, "outside the float32 range"),
    (V1, {"instances": [["a"] * 64]}, 400, "expected numbers, found strings"),
    (V1, {"instances": [[None] * 64]}, 400, "expected numbers, found null"),
    (V1, {"instances": [[True] * 64]}, 400, "found booleans"),
    (V1, {"instances": [ROW, ROW[:10]]}, 400, "ragged"),
    (V1, {"instances": [ROW[:63]]}, 400, "shape [1, 63] does not match the model's [-1, 64]"),
    (V1, {"instances": ROW}, 400, "instances: shape [64] does not match the model's [-1, 64]"),
    (V1, {"instances": []}, 400, "empty batch"),
    (V1, {"instances": "x"}, 400, "holding a list"),
    (V1, [1, 2], 400, "must be a JSON object"),
    (V1, {"instances": [ROW] * 257}, 413, "batch of 257 is above the maximum of 256"),
    ("/v1/models/nope:predict", {"instances": [ROW]}, 404, "unknown model 'nope'"),
    ("/v1/models/digits-mlp/versions/x:predict", {"instances": [ROW]}, 404, "unknown version"),
    (V2, b"{oops", 400, "malformed JSON"),
    (V2, {"inputs": "x"}, 400, "'inputs' list"),
    (V2, v2_body(datatype="FP64"), 400, "datatype 'FP64' does not match the model's FP32"),
    (V2, v2_body(datatype="BANANA"), 400, "datatype 'BANANA'"),
    (V2, v2_body(shape=[1, 63], data=ROW[:63]), 400, "shape [1, 63] does not match the model's"),
    (V2, v2_body(shape=[1, -64]), 400, "non-negative integers"),
    (V2, v2_body(shape=[2, 64]), 400, "data holds 64 values but shape [2, 64] needs 128"),
    (V2, v2_body(shape=[0, 64], data=[]), 400, "empty batch"),
    (V2, v2_body(shape=[300, 64], data=ROW * 300), 413, "above the maximum of 256"),
    (V2, v2_body(data=["x"] * 64), 400, "expected numbers"),
    (V2, v2_body(name="pixels"), 400, "unknown input 'pixels'"),
    (V2, {"inputs": [v2_body()["inputs"][0]] * 2}, 400, "appears twice"),
    (V2, {"inputs": []}, 400, "missing input(s) ['input']"),
    (V2, {**v2_body(), "outputs": [{"name": "nope"}]}, 400, "unknown output 'nope'"),
    (V2, {**v2_body(), "id": 5}, 400, "'id' must be a string"),
    (V2, {**v2_body(), "parameters": {"binary_data_output": "yes"}}, 400, "true or false"),
    ("/v2/models/nope/infer", v2_body(), 404, "unknown model 'nope'"),
    ("/v2/models/digits-mlp/versions/7/infer", v2_body(), 404, "unknown version '7'"),
    ("/v1/activations/swish", {"data": [1.0]}, 404, "unknown activation 'swish'"),
    ("/v1/activations/gelu", {"values": [1.0]}, 400, '{"data": [...]}'),
    ("/v1/activations/gelu", {"data": [1.0], "derivative": "yes"}, 400, "true or false"),
    ("/v1/activations/gelu", {"data": [[1.0], [1.0, 2.0]]}, 400, "ragged"),
    ("/v1/activations/gelu", {"data": [0.0] * 100_001}, 413, "above the maximum of 100000"),
    ("/nowhere", {}, 404, "Not Found"),
    # Booleans are not numbers, even among numbers.
    (V1, {"instances": [[1.0, True, *ROW[2:]]]}, 400, "found booleans among them"),
    (V1, {"instances": [ROW, [False, *ROW[1:]]]}, 400, "found booleans among them"),
    (V2, v2_body(data=[True, *ROW[1:]]), 400, "found booleans among them"),
    (V2, v2_body(data=[[0.5, False]] * 32), 400, "found booleans among them"),
    ("/v1/activations/gelu", {"data": [1, True, False]}, 400, "found booleans among them"),
    ("/v1/activations/gelu", {"data": [[1.0, 2.0], [True, 3.0]]}, 400, "booleans"),
    ("/v1/activations/gelu", {"data": [True, False]}, 400, "found booleans"),
    # V2 entries of the wrong kind.
    (
        V2,
        {"inputs": [{"name": {}, "shape": [1, 64], "datatype": "FP32", "data": [0]}]},
        400,
        "needs a 'name' string",
    ),
    (
        V2,
        {"inputs": [{"name": ["input"], "shape": [1, 64], "datatype": "FP32", "data": ROW}]},
        400,
        "needs a 'name' string",
    ),
    (V2, v2_body(datatype={}), 400, "datatype {}"),
    (V2, v2_body(datatype=["FP32"]), 400, "is not one of"),
    (V2, v2_body(datatype=None), 400, "is not one of"),
    (V2, {"inputs": [5]}, 400, "must be an object"),
    (V2, {"inputs": [None]}, 400, "must be an object"),
    (V2, {"inputs": {"name": "input"}}, 400, "'inputs' list"),
    (V2, {"inputs": None}, 400, "'inputs' list"),
    (V2, {}, 400, "'inputs' list"),
    (V2, b"[]", 400, "'inputs' list"),
    (V2, b"null", 400, "'inputs' list"),
    (V2, b'"text"', 400, "'inputs' list"),
    (V2, b"12", 400, "'inputs' list"),
    (V2, {**v2_body(), "id": ["x"]}, 400, "'id' must be a string"),
    (V2, {**v2_body(), "id": None, "outputs": "probabilities"}, 400, "list of objects"),
    (V2, {**v2_body(), "outputs": ["probabilities"]}, 400, "with a 'name' string"),
    (V2, {**v2_body(), "outputs": [{"name": 3}]}, 400, "with a 'name' string"),
    (V2, {**v2_body(), "outputs": [{}]}, 400, "with a 'name' string"),
    # Shapes.
    (V2, v2_body(shape="1,64"), 400, "list of non-negative integers"),
    (V2, v2_body(shape=[1.0, 64]), 400, "list of non-negative integers"),
    (V2, v2_body(shape=[True, 64]), 400, "list of non-negative integers"),
    (V2, v2_body(shape=[1, "64"]), 400, "list of non-negative integers"),
    (V2, v2_body(shape=None), 400, "list of non-negative integers"),
    (V2, v2_body(shape=[1, 2**63]), 400, "list of non-negative integers"),
    (V2, v2_body(shape=[99999999999999999999, 0], data=[]), 400, "non-negative integers"),
    (V2, v2_body(shape=[1] * 71, data=[0.5]), 400, "71 dimensions; at most 32"),
    (V2, v2_body(shape=[1000000000000, 0], data=[]), 400, "non-negative integers"),
    (V2, v2_body(shape=[1, 64, 1], data=ROW), 400, "does not match the model's"),
    (V2, v2_body(shape=[64], data=ROW), 400, "does not match the model's"),
    (V2, v2_body(shape=[], data=[0.5]), 400, "does not match the model's"),
    # Parameters.
    (V2, v2_body(parameters=[]), 400, "'parameters' must be an object"),
    (V2, v2_body(parameters="binary"), 400, "'parameters' must be an object"),
    (V2, v2_body(parameters={"binary_data_size": -1}), 400, "binary_data_size"),
    (V2, v2_body(parameters={"binary_data_size": "256"}), 400, "binary_data_size"),
    (V2, v2_body(parameters={"binary_data_size": True}), 400, "binary_data_size"),
    (V2, {**v2_body(), "parameters": 5}, 400, "'parameters' must be an object"),
    (V2, {**v2_body(), "parameters": {"priority": -1}}, 400, "'priority' must be an integer"),
    (V2, {**v2_body(), "parameters": {"sequence_id": 7}}, 400, "no stateful sequences"),
    (V2, {**v2_body(), "parameters": {"sequence_start": True}}, 400, "no stateful sequences"),
    (V2, {**v2_body(), "parameters": {"sequence_end": True}}, 400, "no stateful sequences"),
    (V2, {**v2_body(), "parameters": {"timeout": -5}}, 400, "'timeout' must be an integer"),
    (V2, {**v2_body(), "parameters": {"timeout": "1s"}}, 400, "'timeout' must be an integer"),
    (V2, {**v2_body(), "parameters": {"timeout": 1.5}}, 400, "'timeout' must be an integer"),
    (
        V2,
        {**v2_body(), "outputs": [{"name": "probabilities", "parameters": []}]},
        400,
        "'parameters' must be an object",
    ),
    (
        V2,
        {**v2_body(), "outputs": [{"name": "probabilities", "parameters": {"binary_data": 1}}]},
        400,
        "true or false",
    ),
    (
        V2,
        {**v2_body(), "outputs": [{"name": "probabilities", "parameters": {"classification": 0}}]},
        400,
        "at least 1",
    ),
    (
        V2,
        {
            **v2_body(),
            "outputs": [{"name": "probabilities", "parameters": {"classification": "3"}}],
        },
        400,
        "integer",
    ),
    # Numbers out of range and odd JSON.
    (V1, {"instances": [[-1e39] * 64]}, 400, "outside the float32 range"),
    (V1, b'{"instances": [[1, 2]] ', 400, "malformed JSON"),
    (V1, b'{"instances": [[1, 2]]} trailing', 400, "malformed JSON"),
    (V1, b"\xff\xfe", 400, "malformed JSON"),
    (V1, b'{"instances": [[-Infinity]]}', 400, "malformed JSON"),
    (V1, {"instances": [[{"x": 1}] * 64]}, 400, "expected numbers"),
    (V1, {"instances": [[[0.5]] * 64]}, 400, "does not match the model's"),
    (V1, {"instances": [[1e300] * 64]}, 400, "outside the float32 range"),
    (V1, {"instances": None}, 400, "holding a list"),
    (V1, {"instances": {"a": 1}}, 400, "holding a list"),
    (V1, {}, 400, "holding a list"),
    (V1, b"[]", 400, "must be a JSON object"),
    ("/v1/models/digits-mlp/versions/0:predict", {"instances": [ROW]}, 404, "unknown version"),
    ("/v2/models/digits-mlp/versions/-1/infer", v2_body(), 404, "unknown version"),
    # Activations.
    ("/v1/activations/gelu", {"data": "1,2,3"}, 400, "expected numbers"),
    ("/v1/activations/gelu", {"data": None}, 400, "expected numbers"),
    ("/v1/activations/gelu", {"data": [None, 1.0]}, 400, "expected numbers"),
    ("/v1/activations/gelu", {"data": [1e39]}, 400, "outside the float32 range"),
    ("/v1/activations/gelu", [1.0, 2.0], 400, '{"data": [...]}'),
    ("/v1/activations/gelu", b"", 400, "empty body"),
    ("/v1/activations/gelu", {"data": [1.0], "derivative": 1}, 400, "true or false"),
    ("/v1/activations/gelu?derivative=maybe", {"data": [1.0]}, 400, "derivative"),
    ("/v1/activations/GELU", {"data": [1.0]}, 404, "unknown activation 'GELU'"),
]


@pytest.mark.parametrize(("path", "body", "status", "needle"), CASES)
def test_bad_input_gets_4xx_and_service_keeps_serving(client, path, body, status, needle) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert_error(response, status, needle)
    assert client.post(V1, json={"instances": [ROW]}).status_code == 200


def _binary_case(x: np.ndarray, declared: int | None, extra: bytes = b"") -> tuple[bytes, dict]:
    content, headers = binary_request(x)
    if declared is not None:
        header = json.loads(content[: int(headers["Inference-Header-Content-Length"])])
        header["inputs"][0]["parameters"]["binary_data_size"] = declared
        text = json.dumps(header).encode()
        content = text + x.astype("<f4").tobytes()
        headers["Inference-Header-Content-Length"] = str(len(text))
    return content + extra, headers


@pytest.mark.parametrize(
    ("declared", "extra", "header_length", "needle"),
    [
        (100, b"", None, "binary_data_size 100 does not match shape [2, 64] of FP32 (512 bytes)"),
        (None, b"\x00" * 4, None, "4 bytes beyond the declared inputs"),
        (None, b"", "99999", "outside the body's"),
        (None, b"", "abc", "must be an integer"),
    ],
)
def test_binary_payload_that_does_not_match_its_shape(
    client, declared, extra, header_length, needle
) -> None:
    content, headers = _binary_case(DIGITS[:2], declared, extra)
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = header_length
    assert_error(client.post(V2, content=content, headers=headers), 400, needle)


@pytest.mark.parametrize(
    ("header_length", "status", "needle"),
    [
        ("9" * 5000, 413, "JSON header of over 10**18 bytes is above the maximum"),
        ("-" + "9" * 5000, 400, "must be an integer, got '-999"),
    ],
)
def test_numbers_past_pythons_digit_limit_are_a_4xx(client, header_length, status, needle) -> None:
    """Over 4,300 digits, Python's int() raises: every such header is read without it."""
    content, headers = _binary_case(DIGITS[:2], None, b"")
    headers["Inference-Header-Content-Length"] = header_length
    assert_error(client.post(V2, content=content, headers=headers), status, needle)


def test_truncated_binary_payload(client) -> None:
    content, headers = binary_request(DIGITS[:2])
    assert_error(client.post(V2, content=content[:-8], headers=headers), 400, "binary data ends")


def test_non_finite_binary_input(client) -> None:
    x = DIGITS[:1].copy()
    x[0, 3] = np.nan
    content, headers = binary_request(x)
    assert_error(client.post(V2, content=content, headers=headers), 400, "NaN or infinity")


def test_body_above_the_limit_is_413(client) -> None:
    big = b'{"instances": [' + b"0.5," * 300_000 + b"0.5]]}"
    assert_error(client.post(V1, content=big), 413, "above the maximum of 1048576")


def test_streamed_body_above_the_limit_is_413(client) -> None:
    def chunks():  # no Content-Length: the limit applies as the body arrives
        for _ in range(40):
            yield b" " * 50_000

    assert_error(client.post(V1, content=chunks()), 413, "above the maximum")


def test_wrong_method_and_query_type(client) -> None:
    assert_error(client.delete("/v1/models"), 405, "Method Not Allowed")
    response = client.post("/v1/activations/gelu?derivative=maybe", json={"data": [1.0]})
    assert_error(response, 400, "derivative")


def test_request_batch_limit_from_settings(settings_factory) -> None:
    from fastapi.testclient import TestClient

    from service.rest.app import create_app

    with TestClient(create_app(settings_factory(max_request_batch=4))) as limited:
        assert limited.get("/v1/models/digits-mlp").json()["max_batch_size"] == 4
        ok = limited.post(V1, json={"instances": [ROW] * 4})
        assert ok.status_code == 200
        assert_error(limited.post(V1, json={"instances": [ROW] * 5}), 413, "maximum of 4")
        assert_error(limited.post(V2, json=v2_body(shape=[5, 64], data=ROW * 5)), 413,
                     "maximum of 4")  # fmt: skip


def test_direct_routes_answer_other_methods_and_failures_in_the_one_shape(client) -> None:
    """The inference routes, served ahead of FastAPI's stack, still give 405 for other
    methods, 500 in the error shape for a failure of ours, and keep serving."""
    assert_error(client.get(V2), 405, "Method Not Allowed")
    assert_error(client.put(V1, json={}), 405, "Method Not Allowed")
    plane = client.app.state.dataplane
    real = plane.infer

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    plane.infer = broken
    try:
        assert_error(client.post(V1, json={"instances": [ROW]}), 500, "internal server error")
    finally:
        plane.infer = real
    assert client.post(V1, json={"instances": [ROW]}).status_code == 200
    metrics = client.get("/metrics").text
    assert 'code="500",endpoint="/v1/models/{name}:predict",model="digits-mlp"' in metrics
    versioned = client.post("/v2/models/digits-mlp/versions/1/infer", json=v2_body())
    assert versioned.status_code == 200
    assert (
        'endpoint="/v2/models/{name}/versions/{version}/infer",model="digits-mlp",version="1"'
        in (client.get("/metrics").text)
    )
