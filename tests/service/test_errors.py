"""The service's errors: each class carries its status and message, and through the app
every client mistake gets a 4xx with one JSON error shape, and the service keeps serving."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from service import errors
from tests.helpers import ROW, assert_error, v2_body

V1 = "/v1/models/digits-mlp:predict"
V2 = "/v2/models/digits-mlp/infer"


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


def test_wrong_method_and_query_type(client) -> None:
    assert_error(client.delete("/v1/models"), 405, "Method Not Allowed")
    response = client.post("/v1/activations/gelu?derivative=maybe", json={"data": [1.0]})
    assert_error(response, 400, "derivative")


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


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (ValueError("bad value\n  at line 3\n"), "bad value"),
        (OSError("  padded  "), "padded"),
        (RuntimeError("\n\nafter blank lines\nand more"), "after blank lines"),
        (MemoryError(), "MemoryError"),
        (KeyError(), "KeyError"),
        (ValueError("   \n "), "ValueError"),
    ],
)
def test_first_line_is_what_an_exception_says_on_one_line(raised: Exception, said: str) -> None:
    assert errors.first_line(raised) == said


# Every answer class, as the faces raise it: its status, and the headers it is answered with.
ANSWERS = [
    (errors.ServiceError("a bug"), 500, None),
    (errors.BadInputError("malformed"), 400, None),
    (errors.LoadFailedError("m", "m/1: no model.onnx"), 400, None),
    (errors.NotFoundError("no model 'm'"), 404, None),
    (errors.MethodNotAllowedError("GET is not allowed", "POST"), 405, {"Allow": "POST"}),
    (errors.UnauthorizedError("restricted"), 401, None),
    (errors.ForbiddenError("not for this"), 403, None),
    (errors.PayloadTooLargeError("too large"), 413, None),
    (errors.UnsupportedMediaError("br"), 415, None),
    (errors.NotReadyError("loading"), 503, None),
    (errors.OverloadedError("queue full"), 503, {"Retry-After": "1"}),
    (errors.OverloadedError("queue full", retry_after_s=7), 503, {"Retry-After": "7"}),
]


@pytest.mark.parametrize(
    ("error", "status", "headers"), ANSWERS, ids=[type(error).__name__ for error, *_ in ANSWERS]
)
def test_each_error_carries_its_status_message_and_headers(
    error: errors.ServiceError, status: int, headers: dict[str, str] | None
) -> None:
    assert error.status_code == status
    assert error.headers == headers
    assert str(error) == error.message  # the message is the exception's own (super().__init__)


def test_a_failed_load_is_a_bad_input_naming_the_model() -> None:
    """As Triton answers a load that failed: 400, "failed to load", the model and why."""
    error = errors.LoadFailedError("digits-mlp", "digits-mlp/2: onnxruntime cannot load it")
    assert isinstance(error, errors.BadInputError)
    assert error.message == "failed to load 'digits-mlp': digits-mlp/2: onnxruntime cannot load it"


def test_an_overload_is_not_ready() -> None:
    """A face that answers NotReadyError (503, gRPC UNAVAILABLE) answers an overload alike."""
    assert issubclass(errors.OverloadedError, errors.NotReadyError)


def test_every_answer_class_is_an_error_status_with_its_message() -> None:
    """Any ServiceError of the module, built with its required arguments: a 4xx or 5xx, its
    message its ``str``. StartupError and ModelLoadError are no answers: a face never sends
    them as they are."""
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.ServiceError)]  # fmt: skip
    assert len(classes) >= len({type(error) for error, _, _ in ANSWERS})
    for cls in classes:
        required = [p for p in inspect.signature(cls).parameters.values()
                    if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]  # fmt: skip
        arguments: list[Any] = [f"{p.name} of {cls.__name__}" for p in required]
        error = cls(*arguments)
        assert 400 <= error.status_code < 600, cls
        assert str(error) == error.message and cls.__name__ in error.message, cls
    for outside in (errors.StartupError, errors.ModelLoadError):
        assert not issubclass(outside, errors.ServiceError)
