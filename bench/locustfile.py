"""Locust load test of the real endpoints, with realistic bodies.

    locust -f bench/locustfile.py --headless --users 16 --spawn-rate 16 --run-time 30s \
        --host http://127.0.0.1:8000

Drives V1 predict, V2 infer (JSON and binary tensor data) and the activation endpoint (JSON and
raw float32). A response that is not 200, or whose body is not what the endpoint promises,
counts as a failure; locust exits non-zero when any request failed.
"""

from __future__ import annotations

import json
import os
import random
import struct

from locust import FastHttpUser, between, task

MODEL = os.environ.get("GELU_LOADTEST_MODEL", "digits-mlp")
# The first four of scikit-learn's bundled digits (0, 1, 2, 3), pixel / 16, as the model expects.
DIGITS = [
    [
        0.0,
        0.0,
        0.3125,
        0.8125,
        0.5625,
        0.0625,
        0.0,
        0.0,
        0.0,
        0.0,
        0.8125,
        0.9375,
        0.625,
        0.9375,
        0.3125,
        0.0,
        0.0,
        0.1875,
        0.9375,
        0.125,
        0.0,
        0.6875,
        0.5,
        0.0,
        0.0,
        0.25,
        0.75,
        0.0,
        0.0,
        0.5,
        0.5,
        0.0,
        0.0,
        0.3125,
        0.5,
        0.0,
        0.0,
        0.5625,
        0.5,
        0.0,
        0.0,
        0.25,
        0.6875,
        0.0,
        0.0625,
        0.75,
        0.4375,
        0.0,
        0.0,
        0.125,
        0.875,
        0.3125,
        0.625,
        0.75,
        0.0,
        0.0,
        0.0,
        0.0,
        0.375,
        0.8125,
        0.625,
        0.0,
        0.0,
        0.0,
    ],
    [
        0.0,
        0.0,
        0.0,
        0.75,
        0.8125,
        0.3125,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.6875,
        1.0,
        0.5625,
        0.0,
        0.0,
        0.0,
        0.0,
        0.1875,
        0.9375,
        1.0,
        0.375,
        0.0,
        0.0,
        0.0,
        0.4375,
        0.9375,
        1.0,
        1.0,
        0.125,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        1.0,
        1.0,
        0.1875,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        1.0,
        1.0,
        0.375,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        1.0,
        1.0,
        0.375,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.6875,
        1.0,
        0.625,
        0.0,
        0.0,
    ],
    [
        0.0,
        0.0,
        0.0,
        0.25,
        0.9375,
        0.75,
        0.0,
        0.0,
        0.0,
        0.0,
        0.1875,
        1.0,
        0.9375,
        0.875,
        0.0,
        0.0,
        0.0,
        0.0,
        0.5,
        0.8125,
        0.5,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        0.375,
        0.9375,
        0.6875,
        0.0,
        0.0,
        0.0,
        0.0625,
        0.5,
        0.8125,
        0.9375,
        0.0625,
        0.0,
        0.0,
        0.0,
        0.5625,
        1.0,
        1.0,
        0.3125,
        0.0,
        0.0,
        0.0,
        0.0,
        0.1875,
        0.8125,
        1.0,
        1.0,
        0.6875,
        0.3125,
        0.0,
        0.0,
        0.0,
        0.0,
        0.1875,
        0.6875,
        1.0,
        0.5625,
        0.0,
    ],
    [
        0.0,
        0.0,
        0.4375,
        0.9375,
        0.8125,
        0.0625,
        0.0,
        0.0,
        0.0,
        0.5,
        0.8125,
        0.375,
        0.9375,
        0.25,
        0.0,
        0.0,
        0.0,
        0.125,
        0.0625,
        0.8125,
        0.8125,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.125,
        0.9375,
        0.6875,
        0.0625,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        0.75,
        0.75,
        0.0625,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0625,
        0.625,
        0.5,
        0.0,
        0.0,
        0.0,
        0.5,
        0.25,
        0.3125,
        0.875,
        0.5625,
        0.0,
        0.0,
        0.0,
        0.4375,
        0.8125,
        0.8125,
        0.5625,
        0.0,
        0.0,
    ],
]
ACTIVATION_VALUES = 100_000
# Built once: packing 1e5 floats per request would load the load generator, not the server.
ACTIVATION_BODY = struct.pack(
    f"<{ACTIVATION_VALUES}f", *(10 * i / ACTIVATION_VALUES - 5 for i in range(ACTIVATION_VALUES))
)


def _binary_infer_body(row: list[float]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, len(row)],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * len(row)},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + struct.pack(f"<{len(row)}f", *row), headers


class InferenceUser(FastHttpUser):
    """A client mixing the service's endpoints, weighted towards predictions."""

    wait_time = between(0.0, 0.01)

    @task(4)
    def v1_predict(self) -> None:
        body = {"instances": random.sample(DIGITS, 2)}
        with self.client.post(
            f"/v1/models/{MODEL}:predict",
            json=body,
            name="/v1/models/[model]:predict",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or len(r.json()["predictions"]) != 2:
                r.failure(f"{r.status_code}: {r.text[:200]}")

    @task(2)
    def v2_infer_json(self) -> None:
        row = random.choice(DIGITS)
        body = {
            "inputs": [{"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": row}]
        }
        with self.client.post(
            f"/v2/models/{MODEL}/infer",
            json=body,
            name="/v2/models/[model]/infer json",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or not r.json()["outputs"]:
                r.failure(f"{r.status_code}: {r.text[:200]}")

    @task(2)
    def v2_infer_binary(self) -> None:
        body, headers = _binary_infer_body(random.choice(DIGITS))
        with self.client.post(
            f"/v2/models/{MODEL}/infer",
            data=body,  # type: ignore[arg-type]  # bytes are sent as they are
            headers=headers,
            name="/v2/models/[model]/infer binary",
            catch_response=True,
        ) as r:
            length = int(r.headers.get("Inference-Header-Content-Length", "0") or 0)
            if r.status_code != 200 or len(r.content) - length != 40:
                r.failure(f"{r.status_code}: {r.content[:200]!r}")

    @task(1)
    def activation_json(self) -> None:
        data = [random.uniform(-5, 5) for _ in range(256)]
        with self.client.post(
            "/v1/activations/gelu",
            json={"data": data},
            name="/v1/activations/gelu json",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or len(r.json()["data"]) != 256:
                r.failure(f"{r.status_code}: {r.text[:200]}")

    @task(1)
    def activation_binary(self) -> None:
        with self.client.post(
            "/v1/activations/gelu_tanh?derivative=true",
            data=ACTIVATION_BODY,  # type: ignore[arg-type]  # bytes are sent as they are
            headers={"Content-Type": "application/octet-stream"},
            name="/v1/activations/gelu_tanh binary",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or len(r.content) != len(ACTIVATION_BODY):
                r.failure(f"{r.status_code}: {r.content[:200]!r}")
