"""docs/scheduling.md's example config.pbtxt is what it says: Triton's priority levels and
queue policies, read, served, and answering requests of each level on both faces."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import httpx
import numpy as np

from contract.model_config import DELAY, QueuePolicy, SchedulingPolicy, load_model_config
from contract.names import CONFIG_FILENAME
from service.control import ModelControl
from service.dataplane import DataPlane
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.server import GrpcServer
from service.rest.app import create_app
from tests.helpers import service_settings
from tests.onnx_models import write_model

PAGE = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


def example() -> str:
    """The page's config.pbtxt: its first ``pbtxt`` block."""
    found = re.search(r"```pbtxt\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert found, "docs/scheduling.md has a pbtxt example"
    return found.group(1)


def test_the_example_reads_as_the_page_says() -> None:
    config = load_model_config(example())
    assert config.unhonoured == ()
    assert config.scheduling == SchedulingPolicy(
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy=(
            (1, QueuePolicy(default_timeout_us=100_000, allow_timeout_override=True)),
            (2, QueuePolicy(DELAY, 2_000_000, False, 64)),
        ),
    )


def test_the_example_serves_each_level_on_both_faces(tmp_path: Path) -> None:
    write_model(tmp_path, "digits-mlp", 1)
    (tmp_path / "digits-mlp" / CONFIG_FILENAME).write_text(example())
    settings = service_settings(tmp_path)
    row = [0.5] * 64

    async def scenario() -> tuple[list[int], list[int], dict]:
        core = DataPlane(settings)
        app = create_app(core=core)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                http = []
                for parameters in ({"priority": 1, "timeout": 20000}, {"priority": 2}, {}):
                    entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}
                    body = {"inputs": [entry], "parameters": parameters}
                    answer = await client.post("/v2/models/digits-mlp/infer", json=body)
                    http.append(answer.status_code)
                http.append((await client.post("/v1/models/digits-mlp:predict",
                                               json={"instances": [row]})).status_code)  # fmt: skip
                config = (await client.get("/v2/models/digits-mlp/config")).json()
            server = GrpcServer(core, ModelControl.over(core), "127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                    stub = pb_grpc.GRPCInferenceServiceStub(channel)
                    sizes = []
                    for priority in (1, 2, 0):
                        request = pb.ModelInferRequest(model_name="digits-mlp")
                        request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
                        request.raw_input_contents.append(np.full((1, 64), 0.5, "<f4").tobytes())
                        request.parameters["priority"].int64_param = priority
                        answer = await stub.ModelInfer(request, timeout=30)
                        sizes.append(len(answer.raw_output_contents))
            finally:
                await server.stop(1)
        return http, sizes, config

    http, sizes, config = asyncio.run(scenario())
    assert http == [200, 200, 200, 200]
    assert sizes == [2, 2, 2]  # logits and probabilities, each time
    batching = config["dynamic_batching"]
    assert batching["priority_levels"] == 2
    assert batching["priority_queue_policy"]["2"]["timeout_action"] == "DELAY"
