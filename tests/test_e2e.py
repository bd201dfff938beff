"""End to end: a real uvicorn process on loopback, driven by tritonclient, raw HTTP and curl."""

from __future__ import annotations

import http.client
import importlib.util
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import DIGITS
from tests.servers import ROOT, free_port, get, serving, wait_until

pytestmark = pytest.mark.slow  # real servers or training

# Explicit model control with one model loaded at start.
EXPLICIT = {"GELU_MODEL_CONTROL_MODE": "explicit", "GELU_LOAD_MODELS": "digits-mlp"}


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(trained_repository: Path, grpc_port: int) -> Iterator[int]:
    with serving(trained_repository, GELU_GRPC_PORT=str(grpc_port)) as port:
        yield port


def test_metrics_add_up_across_worker_processes(trained_repository: Path) -> None:
    """Both workers' requests are in one scrape within the metrics' flush interval."""
    from service.metrics import FLUSH_SECONDS

    body = json.dumps({"instances": DIGITS[:1].tolist()})

    def predict(_: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/models/digits-mlp:predict", body=body)
        status = conn.getresponse().status
        conn.close()
        return status

    with serving(trained_repository, "--workers", "2") as port:
        # Many connections at once, so that both workers accept some of them.
        with ThreadPoolExecutor(16) as pool:
            assert set(pool.map(predict, range(200))) == {200}
        counts: list[float] = []

        def counted() -> bool:
            text = get(port, "/metrics")[1].decode()
            total, endpoint = "gelu_requests_total{", 'endpoint="/v1/models/{name}:predict"'
            line = next(x for x in text.splitlines() if x.startswith(total) and endpoint in x)
            counts.append(float(line.rsplit(" ", 1)[1]))
            return counts[-1] >= 200

        wait_until(counted, 5 * FLUSH_SECONDS, FLUSH_SECONDS / 4, "both workers' requests",
                   lambda: f"counted {counts}")  # fmt: skip
    assert counts[-1] == 200.0, counts


def test_tritonclient_model_control(trained_repository: Path, server: int) -> None:
    """Index, load, unload and readiness through tritonclient in explicit mode; none mode
    refuses load and unload as Triton does."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    plain = httpclient.InferenceServerClient(f"127.0.0.1:{server}")
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        plain.load_model("digits-mlp")
    with serving(trained_repository, **EXPLICIT) as port:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        index = {(e["name"], e.get("state")) for e in client.get_model_repository_index()}
        assert ("digits-mlp", "READY") in index and ("digits-autoencoder", None) in index
        assert not client.is_model_ready("digits-autoencoder")
        client.load_model("digits-autoencoder")
        assert client.is_model_ready("digits-autoencoder")
        tensor = httpclient.InferInput("input", [2, 64], "FP32")
        tensor.set_data_from_numpy(DIGITS[:2])
        client.infer("digits-autoencoder", [tensor])
        (stats,) = client.get_inference_statistics("digits-autoencoder")["model_stats"]
        assert stats["inference_count"] == 2 and stats["execution_count"] == 1
        client.unload_model("digits-mlp")
        assert not client.is_model_ready("digits-mlp")
        ready = client.get_model_repository_index()
        assert {e["name"] for e in ready if e.get("state") == "READY"} == {"digits-autoencoder"}


def test_tritonclient_json_and_binary(server: int) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits-mlp") and client.is_model_ready("digits-mlp", "1")
    assert client.get_model_metadata("digits-mlp")["versions"] == ["1", "2"]
    assert client.get_model_config("digits-mlp")["max_batch_size"] == 256
    x = DIGITS[:16]
    results = {}
    for binary in (False, True):
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=binary)
                  for n in ("logits", "probabilities")]  # fmt: skip
        result = client.infer("digits-mlp", [tensor], outputs=wanted, request_id=f"b{binary}")
        assert result.get_response()["id"] == f"b{binary}"
        results[binary] = result.as_numpy("probabilities")
        assert results[binary].shape == (16, 10)
    np.testing.assert_allclose(results[False], results[True], rtol=1e-6)
    # No outputs named: tritonclient asks for every output in binary.
    result = client.infer("digits-autoencoder", [tensor])
    assert result.as_numpy("reconstruction").shape == (16, 64)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", [tensor])
    bad = httpclient.InferInput("input", [16, 64], "FP64")
    bad.set_data_from_numpy(x.astype(np.float64), binary_data=True)
    with pytest.raises(InferenceServerException, match="datatype 'FP64'"):
        client.infer("digits-mlp", [bad])
    assert client.is_server_ready()
    (stats,) = client.get_inference_statistics("digits-mlp", "2")["model_stats"]
    assert stats["inference_count"] >= 32 and stats["inference_stats"]["fail"]["count"] >= 1
    every = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in every} >= {("digits-mlp", "1"), ("digits-mlp", "2")}


def test_tritonclient_classification_and_compression(server: int) -> None:
    """Triton's classification extension (``class_count``), JSON and binary, and gzip and
    deflate request bodies, through tritonclient unmodified."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server}")
    x = DIGITS[:4]
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    full = client.infer("digits-mlp", [tensor]).as_numpy("probabilities")
    for binary in (False, True):
        wanted = httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)
        top = client.infer("digits-mlp", [tensor], outputs=[wanted]).as_numpy("probabilities")
        assert top.shape == (4, 3)
        for row, probabilities in zip(top, full, strict=True):
            best = row[0].decode() if isinstance(row[0], bytes) else row[0]  # binary / JSON
            score, index, label = best.split(":")
            assert int(index) == probabilities.argmax() and label == index
            assert abs(float(score) - probabilities.max()) < 1e-6
    for algorithm in ("gzip", "deflate"):
        result = client.infer("digits-mlp", [tensor], request_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("probabilities"), full)


def test_raw_http_requests(server: int) -> None:
    def post(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}

    status, body, _ = post("/v1/models/digits-mlp:predict", b'{"instances": [[1, 2', {})
    assert status == 400 and json.loads(body)["error"].startswith("malformed JSON")
    x = np.linspace(-5, 5, 1_000_000, dtype="<f4")
    status, body, headers = post(
        "/v1/activations/gelu", x.tobytes(), {"Content-Type": "application/octet-stream"}
    )
    assert status == 200 and headers["x-shape"] == "1000000" and len(body) == x.nbytes
    y = np.frombuffer(body, "<f4")
    assert abs(float(y[-1]) - 5.0 * 0.9999997133) < 1e-5
    # Every thousandth value, against math.erf: the 4 MB answer arrives whole and in order.
    exact = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x[::1000].tolist()]
    np.testing.assert_allclose(y[::1000], exact, rtol=1e-6, atol=1e-7)


def test_client_that_hangs_up_mid_body_costs_nothing(server: int) -> None:
    for path in ("/v1/models/digits-mlp:predict", "/v2/models/digits-mlp/infer"):
        with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                'Content-Length: 100000\r\n\r\n{"instances": [[0.1, 0.2'.encode()
            )
    assert get(server, "/v2/health/ready")[0] == 200  # and the harness finds no traceback


VENV_PYTHON = ".venv/bin/python "


def readme_commands() -> list[str]:
    """Every ``curl`` and ``.venv/bin/python`` command in the shell blocks of the README and
    docs/endpoints.md, in order, joined across line continuations."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "endpoints.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        commands += [
            line.strip()
            for line in joined.splitlines()
            if line.strip().startswith(("curl ", VENV_PYTHON + "-c"))
        ]
    return commands


def test_readme_commands_work_as_written(server: int, tmp_path: Path) -> None:
    commands = readme_commands()
    assert sum(c.startswith("curl ") for c in commands) >= 10
    for command in commands:
        if command.startswith(VENV_PYTHON):  # the project's venv: here, this interpreter
            command = shlex.quote(sys.executable) + " " + command.removeprefix(VENV_PYTHON)
            subprocess.run(["bash", "-c", command], check=True, cwd=tmp_path, timeout=60)
            continue
        command = command.replace("localhost:8000", f"127.0.0.1:{server}")
        result = subprocess.run(
            ["bash", "-c", command + " -sS --write-out '\\n%{http_code}'"],
            capture_output=True, text=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
        assert result.stdout.splitlines()[-1] == "200", f"{command}: {result.stdout[-300:]}"
        assert not result.stderr, result.stderr
        shlex.split(command)  # each is a well-formed shell command
    assert (tmp_path / "y.f32").stat().st_size == 4_000_000


def test_readme_model_control_commands_work_as_written(trained_repository: Path) -> None:
    """docs/lifecycle.md's model control block, in order, against an explicit-mode server."""
    text = (ROOT / "docs" / "lifecycle.md").read_text()
    (block,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = [line for line in block.splitlines() if line.startswith("curl ")]
    assert len(commands) == 5
    with serving(trained_repository, **EXPLICIT) as port:
        for command in commands:
            command = command.replace("localhost:8000", f"127.0.0.1:{port}")
            result = subprocess.run(
                ["bash", "-c", command + " -sS --write-out '\\n%{http_code}'"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert result.stdout.splitlines()[-1] == "200", (command, result.stdout[-300:])


def test_readme_python_example_works_as_written(server: int) -> None:
    (block,) = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    result = subprocess.run(
        [sys.executable, "-c", block.replace("localhost:8000", f"127.0.0.1:{server}")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    numbers = re.findall(r"[-+]?\d+\.?\d*(?:e[-+]?\d+)?", result.stdout)  # numpy's printout
    probabilities = np.array(numbers, dtype=np.float64).reshape(2, 10)
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-4), result.stdout


def test_locust_headless_run_sees_no_failures(server: int, grpc_port: int, tmp_path: Path) -> None:
    if importlib.util.find_spec("locust") is None:  # importing it here would monkey-patch pytest
        pytest.skip("locust missing: the [bench] extra installs it")
    env = {**os.environ, "GELU_LOADTEST_GRPC": f"127.0.0.1:{grpc_port}", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"),
         "--headless", "--users", "4", "--spawn-rate", "4", "--run-time", "3s",
         "--host", f"http://127.0.0.1:{server}", "--csv", str(tmp_path / "run"), "--only-summary"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    stats = (tmp_path / "run_stats.csv").read_text().splitlines()
    header = stats[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in stats[1:]]
    total = next(r for r in rows if r["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 20 and int(total["Failure Count"]) == 0
    names = {r["Name"] for r in rows}
    assert {"/v1/models/[model]:predict", "/v2/models/[model]/infer binary",
            "/v1/activations/gelu_tanh binary", "ModelInfer [model]"} <= names  # fmt: skip
