"""A mutation fuzz of ``config.pbtxt`` against a real ``gelu-serve serve`` in poll mode (issue
62 item 3, "One bad config stops every update"): random edits of a serving model's config,
one after another, never crash the service, never kill the poller, never answer 500."""

from __future__ import annotations

import http.client
import json
import random
import shutil
import time
from pathlib import Path

import pytest

from tests.mutations import mutated
from tests.onnx_models import write_model
from tests.servers import get, running, wait_until

pytestmark = pytest.mark.slow  # a real server process

ROUNDS = 30
POLL_SECONDS = 0.1


def post(port: int, path: str, body: dict[str, object]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_mutated_configs_never_stop_the_poller_or_answer_500(tmp_path: Path) -> None:
    """Issue 62 item 3: each round writes a seeded random edit (tests/mutations.py: byte flips,
    deleted or swapped lines, fields of Triton's schema with odd values, deep nesting, bytes
    that are not UTF-8) over one model's config.pbtxt, lets the poller see it, then asks every
    route of that model and the index: no 5xx, and no traceback in the log (the harness). At
    the end another model's new version still loads: the poller is alive."""
    root = tmp_path / "repo"
    for name in ("victim", "bystander"):
        write_model(root, name, 1, hidden=8)
    config = root / "victim" / "config.pbtxt"
    original = config.read_bytes()
    env = {"GELU_MODEL_CONTROL_MODE": "poll", "GELU_REPOSITORY_POLL_SECONDS": str(POLL_SECONDS),
           "GELU_EXIT_ON_ERROR": "false", "GELU_LOG_LEVEL": "error"}  # fmt: skip
    rng = random.Random(62)
    row = {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}
    statuses: list[int] = []
    with running(root, **env) as (port, _process):
        for _ in range(ROUNDS):
            config.write_bytes(mutated(original, rng))
            time.sleep(3 * POLL_SECONDS)  # a scan or two sees this edit
            wait_until(lambda: post(port, "/v2/repository/index", {})[0] == 200, timeout=10)
            statuses += [
                post(port, "/v2/models/victim/infer", {"inputs": [row]})[0],
                get(port, "/v2/models/victim")[0],
                get(port, "/v2/models/victim/config")[0],
                get(port, "/v2/models/victim/ready")[0],
                post(port, "/v2/models/bystander/infer", {"inputs": [row]})[0],
            ]
        assert all(status < 500 for status in statuses), sorted(set(statuses))
        assert statuses.count(200) > ROUNDS, statuses  # the model went on serving
        shutil.copytree(root / "bystander" / "1", root / "bystander" / "2")
        wait_until(lambda: get(port, "/v2/models/bystander/versions/2/ready")[0] == 200,
                   timeout=20, what="a new version loaded by the poller")  # fmt: skip
