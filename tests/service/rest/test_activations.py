"""The activation routes: the listing, JSON bodies that keep their shape, raw float32 bodies
shaped by a header or the query, and the mistakes each is refused for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.activations import ACTIVATIONS
from tests.helpers import assert_error


@pytest.mark.parametrize(
    ("url", "body", "needle"),
    [
        ("/v1/activations/gelu?kernel=fast", {"data": [1.0]}, "unknown kernel 'fast'"),
        ("/v1/activations/gelu", {"data": [1.0], "kernel": 3}, "'kernel' must be a string"),
        ("/v1/activations/phi?kernel=native", {"data": [1.0]}, "no native kernel for phi"),
        (
            "/v1/activations/gelu?kernel=native&derivative=true",
            {"data": [1.0]},
            "no native kernel for gelu's derivative",
        ),
    ],
)
def test_kernel_mistakes_are_400(client, url: str, body: dict, needle: str) -> None:
    assert_error(client.post(url, json=body), 400, needle)


def test_listing(client) -> None:
    body = client.get("/v1/activations").json()
    names = [a["name"] for a in body["activations"]]
    assert names == list(ACTIVATIONS)
    assert body["providers"] == ["CPUExecutionProvider"]
    kernels = {a["name"]: a["kernels"] for a in body["activations"]}
    assert kernels["gelu"] == ["accurate", "native"] and kernels["phi"] == ["accurate"]
    gelu = body["activations"][0]
    assert "erf" in gelu["formula"] and "phi" in gelu["derivative"]


def test_json_keeps_shape_and_derivative_flag(client) -> None:
    data = [[-1.0, 0.0, 1.0], [2.0, 3.0, 4.0]]
    body = client.post("/v1/activations/gelu", json={"data": data}).json()
    assert body["shape"] == [2, 3] and body["derivative"] is False
    assert body["kernel"] == "accurate"
    want = [[x * 0.5 * (1 + math.erf(x / math.sqrt(2))) for x in row] for row in data]
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


@pytest.mark.parametrize(
    ("content", "headers", "status", "needle"),
    [
        (b"\x00" * 7, {}, 400, "not whole float32 values"),
        (b"\x00" * 8, {"X-Shape": "3"}, 400, "shape [3] needs 3 values; body holds 2"),
        (b"\x00" * 8, {"X-Shape": "a,b"}, 400, "comma-separated integers"),
        (b"\x00" * 8, {"X-Shape": "9" * 5000}, 400, "each at most 2147483647"),  # no int()
        (b"\x00" * 8, {"X-Shape": "0" * 4999 + "2"}, 200, ""),  # leading zeros: a 2
        (b"\x00" * 8, {"X-Shape": ",".join(["1"] * 33)}, 400, "at most 32 dimensions"),
        (b"\x00" * 400_004, {}, 413, "100001 values is above the maximum"),
    ],
)
def test_bad_binary_bodies(client, content, headers, status, needle) -> None:
    headers = {"Content-Type": "application/octet-stream", **headers}
    response = client.post("/v1/activations/gelu", content=content, headers=headers)
    if status == 200:
        assert response.status_code == 200, response.text
        return
    assert_error(response, status, needle)
    # The query parameter is read as the header is.
    if "X-Shape" in headers:
        query = f"/v1/activations/gelu?shape={headers.pop('X-Shape')}"
        assert_error(client.post(query, content=content, headers=headers), status, needle)


@pytest.mark.parametrize("shape", ["0,4", "4,0", "0,0,3", "0", "2,0,2"])
def test_an_empty_array_of_any_shape_is_answered_in_kind(client, shape: str) -> None:
    """Triton CVE-2025-23321's class (a crash from an invalid request): an empty body shaped
    ``0,4`` was a 500 and a traceback per request (numpy's memoryview of a zero-sized 2-D
    array cannot be cast to bytes). Every empty shape is answered with its shape and no data,
    on each kernel and the derivative."""
    headers = {"Content-Type": "application/octet-stream", "X-Shape": shape}
    for query in ("", "?kernel=native", "?derivative=true"):
        response = client.post(f"/v1/activations/gelu{query}", content=b"", headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["X-Shape"] == shape and response.content == b""
