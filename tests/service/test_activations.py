"""Raw activation evaluation against a float64 reference, JSON and binary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.activations import ACTIVATIONS
from tests.helpers import assert_error

# Stated in the README: over [-10, 10], |onnxruntime float32 - float64 reference| is at most
# ACCURACY * max(1, |reference|), for every function and every derivative.
ACCURACY = 1e-5
X = np.linspace(-10, 10, 20001, dtype=np.float32)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _sigmoid(x: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * x))


def _tanh_parts(x: float) -> tuple[float, float]:
    c = math.sqrt(2 / math.pi)
    t = math.tanh(c * (x + 0.044715 * x**3))
    return t, c * (1 + 3 * 0.044715 * x * x)


REFERENCE = {
    "gelu": (lambda x: x * _phi(x), lambda x: _phi(x) + x * _pdf(x)),
    "gelu_tanh": (
        lambda x: 0.5 * x * (1 + _tanh_parts(x)[0]),
        lambda x: (
            0.5 * (1 + _tanh_parts(x)[0])
            + 0.5 * x * (1 - _tanh_parts(x)[0] ** 2) * _tanh_parts(x)[1]
        ),
    ),
    "gelu_sigmoid": (
        lambda x: x * _sigmoid(1.702 * x),
        lambda x: _sigmoid(1.702 * x) * (1 + 1.702 * x * (1 - _sigmoid(1.702 * x))),
    ),
    "silu": (lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))),
    "relu": (lambda x: max(x, 0.0), lambda x: 1.0 if x > 0 else 0.0),
    "elu": (lambda x: x if x > 0 else math.expm1(x), lambda x: 1.0 if x > 0 else math.exp(x)),
    "phi": (_phi, _pdf),
}


def test_listing(client) -> None:
    body = client.get("/v1/activations").json()
    names = [a["name"] for a in body["activations"]]
    assert names == list(REFERENCE) == list(ACTIVATIONS)
    assert body["providers"] == ["CPUExecutionProvider"]
    gelu = body["activations"][0]
    assert "erf" in gelu["formula"] and "phi" in gelu["derivative"]


@pytest.mark.parametrize("derivative", [False, True])
@pytest.mark.parametrize("name", list(REFERENCE))
def test_binary_accuracy_against_float64(client, name: str, derivative: bool) -> None:
    response = client.post(
        f"/v1/activations/{name}",
        params={"derivative": str(derivative).lower()},
        content=X.tobytes(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["X-Shape"] == str(len(X))
    got = np.frombuffer(response.content, dtype="<f4").astype(np.float64)
    want = np.array([REFERENCE[name][derivative](float(x)) for x in X])
    error = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    assert error.max() <= ACCURACY, f"worst at x={X[error.argmax()]}: {error.max():.3g}"


def test_json_keeps_shape_and_derivative_flag(client) -> None:
    data = [[-1.0, 0.0, 1.0], [2.0, 3.0, 4.0]]
    body = client.post("/v1/activations/gelu", json={"data": data}).json()
    assert body["shape"] == [2, 3] and body["derivative"] is False
    want = [[REFERENCE["gelu"][0](x) for x in row] for row in data]
    np.testing.assert_allclose(body["data"], want, atol=1e-6)
    body = client.post("/v1/activations/gelu", json={"data": 0.0, "derivative": True}).json()
    assert body["shape"] == [] and body["data"] == 0.5
    body = client.post("/v1/activations/phi?derivative=true", json={"data": [0.0]}).json()
    assert body["data"][0] == pytest.approx(1 / math.sqrt(2 * math.pi), rel=1e-6)


def test_binary_shape_from_header_or_query(client) -> None:
    x = np.arange(24, dtype="<f4")
    headers = {"Content-Type": "application/octet-stream", "X-Shape": "2,3,4"}
    response = client.post("/v1/activations/relu", content=x.tobytes(), headers=headers)
    assert response.headers["X-Shape"] == "2,3,4"
    response = client.post(
        "/v1/activations/relu?shape=4,6",
        content=x.tobytes(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.headers["X-Shape"] == "4,6"
    np.testing.assert_array_equal(np.frombuffer(response.content, "<f4"), x)


def test_edge_values_in_binary(client) -> None:
    x = np.array([np.inf, -np.inf, np.nan, 3.4e38, -0.0], dtype="<f4")
    response = client.post(
        "/v1/activations/gelu", content=x.tobytes(),
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    y = np.frombuffer(response.content, "<f4")
    assert y[0] == np.inf and np.isnan(y[1]) and np.isnan(y[2]) and y[3] == np.float32(3.4e38)


@pytest.mark.parametrize(
    ("content", "headers", "status", "needle"),
    [
        (b"\x00" * 7, {}, 400, "not whole float32 values"),
        (b"\x00" * 8, {"X-Shape": "3"}, 400, "shape [3] needs 3 values; body holds 2"),
        (b"\x00" * 8, {"X-Shape": "a,b"}, 400, "comma-separated integers"),
        (b"\x00" * 400_004, {}, 413, "100001 values is above the maximum"),
    ],
)
def test_bad_binary_bodies(client, content, headers, status, needle) -> None:
    headers = {"Content-Type": "application/octet-stream", **headers}
    assert_error(
        client.post("/v1/activations/gelu", content=content, headers=headers), status, needle
    )


def test_every_contract_activation_is_defined_once() -> None:
    from contract.names import EVALUATED_ACTIVATIONS
    from service.activations import _DEFINED, ACTIVATIONS

    assert list(ACTIVATIONS) == list(EVALUATED_ACTIVATIONS)
    assert set(_DEFINED) == set(EVALUATED_ACTIVATIONS)
