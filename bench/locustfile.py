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
# The first four of scikit-learn's bundled digits (0, 1, 2, 3), 8x8 pixels in 0..16.
# fmt: off
_PIXELS = [
    [
         0,  0,  5, 13,  9,  1,  0,  0,
         0,  0, 13, 15, 10, 15,  5,  0,
         0,  3, 15,  2,  0, 11,  8,  0,
         0,  4, 12,  0,  0,  8,  8,  0,
         0,  5,  8,  0,  0,  9,  8,  0,
         0,  4, 11,  0,  1, 12,  7,  0,
         0,  2, 14,  5, 10, 12,  0,  0,
         0,  0,  6, 13, 10,  0,  0,  0,
    ],
    [
         0,  0,  0, 12, 13,  5,  0,  0,
         0,  0,  0, 11, 16,  9,  0,  0,
         0,  0,  3, 15, 16,  6,  0,  0,
         0,  7, 15, 16, 16,  2,  0,  0,
         0,  0,  1, 16, 16,  3,  0,  0,
         0,  0,  1, 16, 16,  6,  0,  0,
         0,  0,  1, 16, 16,  6,  0,  0,
         0,  0,  0, 11, 16, 10,  0,  0,
    ],
    [
         0,  0,  0,  4, 15, 12,  0,  0,
         0,  0,  3, 16, 15, 14,  0,  0,
         0,  0,  8, 13,  8, 16,  0,  0,
         0,  0,  1,  6, 15, 11,  0,  0,
         0,  1,  8, 13, 15,  1,  0,  0,
         0,  9, 16, 16,  5,  0,  0,  0,
         0,  3, 13, 16, 16, 11,  5,  0,
         0,  0,  0,  3, 11, 16,  9,  0,
    ],
    [
         0,  0,  7, 15, 13,  1,  0,  0,
         0,  8, 13,  6, 15,  4,  0,  0,
         0,  2,  1, 13, 13,  0,  0,  0,
         0,  0,  2, 15, 11,  1,  0,  0,
         0,  0,  0,  1, 12, 12,  1,  0,
         0,  0,  0,  0,  1, 10,  8,  0,
         0,  0,  8,  4,  5, 14,  9,  0,
         0,  0,  7, 13, 13,  9,  0,  0,
    ],
]
# fmt: on
# Scaled as the models expect: pixel / 16.
DIGITS = [[p / 16 for p in image] for image in _PIXELS]
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


# ---- gRPC ---------------------------------------------------------------------------------------
# With GELU_LOADTEST_GRPC=host:port (the service's GELU_GRPC_PORT), a second kind of user calls
# ModelInfer over gRPC with raw tensor contents; it needs grpcio and this project's generated
# protocol module (service.grpc), so it exists only when asked for.
GRPC_ADDRESS = os.environ.get("GELU_LOADTEST_GRPC")

if GRPC_ADDRESS:
    import time

    import grpc
    import grpc.experimental.gevent as grpc_gevent
    from locust import User

    from service.grpc import inference_pb2 as pb

    grpc_gevent.init_gevent()  # grpcio must cooperate with locust's gevent

    def _grpc_request(row: list[float]) -> bytes:
        request = pb.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="input", datatype="FP32", shape=[1, len(row)])
        request.raw_input_contents.append(struct.pack(f"<{len(row)}f", *row))
        request.outputs.add(name="probabilities")
        return request.SerializeToString()

    GRPC_BODIES = [_grpc_request(row) for row in DIGITS]

    class GrpcInferenceUser(User):
        """ModelInfer over gRPC; a status other than OK, or an answer without 10
        probabilities, counts as a failure."""

        wait_time = between(0.0, 0.01)

        def on_start(self) -> None:
            self.channel = grpc.insecure_channel(GRPC_ADDRESS)
            self.infer = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        def on_stop(self) -> None:
            self.channel.close()

        @task
        def grpc_infer(self) -> None:
            began, error, length = time.perf_counter(), None, 0
            try:
                answer = pb.ModelInferResponse.FromString(
                    self.infer(random.choice(GRPC_BODIES), timeout=10)
                )
                length = answer.ByteSize()
                if len(answer.raw_output_contents[0]) != 40:
                    raise ValueError(f"unexpected answer: {answer}")
            except (grpc.RpcError, ValueError, IndexError) as exc:
                error = exc
            self.environment.events.request.fire(
                request_type="grpc",
                name="ModelInfer [model]",
                response_time=(time.perf_counter() - began) * 1000,
                response_length=length,
                exception=error,
                context={},
            )
