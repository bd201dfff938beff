"""The service on a real two-node Ray cluster, started as a user starts one, driven through
Ray's HTTP proxy: placement, answers, autoscaling, a replica killed under load, repository
polling, and service-wide metrics from Ray's own export; and the cluster as an attacker on the
network finds it (its nodes started in deploy/ray/node.env: Ray's token authentication on).
The figures it measures are printed (``pytest -s``) and quoted in docs/deployment.md's
"Scaling out"."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml

from contract.readme import block
from tests.helpers import DIGITS, load_model
from tests.onnx_models import write_model
from tests.servers import free_port, get, wait_until

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "ray.json"  # the run docs/deployment.md quotes
README_BLOCK = (
    "<!-- ray-figures: GELU_RECORD_FIGURES=1 pytest -m slow tests/deploy/test_ray.py -->",
    "<!-- /ray-figures -->",
)

BIN = Path(sys.executable).parent
APP = "gelu-serve"
REPLICA_CLASS = f"ServeReplica:{APP}:{APP}"
# Replicas and proxies report load every second (default 10) so the test scales in seconds.
NODE_ENV = ROOT / "deploy" / "ray" / "node.env"
ADMIN_KEY = "ray-test-admin-key-" + "0" * 16
RAY_ENV = {
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    # The test sends everything through the head's proxy, which otherwise keeps requests on
    # its own node's replica while it has one (docs/deployment.md, "Where Ray sends a request").
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
}


@dataclass
class Cluster:
    """Two Ray nodes on loopback, one CPU each, and where to reach them."""

    dashboard: str
    http_port: int
    metrics_ports: list[int]
    grpc_port: int = 0
    agent_port: int = 0
    token: str = field(default_factory=lambda: secrets.token_hex(32))  # Ray's, for the cluster
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    up_seconds: float = 0.0

    def env(self) -> dict[str, str]:
        """The environment of a Ray command: node.env's, the test's, the cluster's token."""
        return {**os.environ, **node_env(), **RAY_ENV, "RAY_AUTH_TOKEN": self.token}

    def state(self, resource: str, filters: list[tuple[str, str, str]] | None = None) -> list:
        """Ray's state API on the dashboard, with the cluster's token (this process runs no
        Ray of its own to hold one)."""
        from ray.util.state.api import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        client = StateApiClient(self.dashboard, headers={"Authorization": f"Bearer {self.token}"})
        options = ListApiOptions(filters=filters or [], detail=True)
        return client.list(StateResource(resource), options, raise_on_missing_output=False)

    def replicas(self) -> list[dict]:
        """The live replicas of the application: node and pid of each."""
        filters = [("class_name", "=", REPLICA_CLASS), ("state", "=", "ALIVE")]
        return [{"node": a.node_id, "pid": a.pid} for a in self.state("actors", filters)]

    def stop(self) -> None:
        """Tear the cluster down by process id: each ``ray start --block`` and everything it
        started (never ``ray stop``, which would stop every Ray on the machine)."""
        import psutil

        tree: list[psutil.Process] = []
        for process in self.processes:
            try:
                parent = psutil.Process(process.pid)
                tree += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=10)
        for process in self.processes:
            process.wait(timeout=10)


def node_env() -> dict[str, str]:
    """deploy/ray/node.env: the environment the project's Ray nodes start in."""
    lines = (line.strip() for line in NODE_ENV.read_text().splitlines())
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return {name: value for name, value in pairs}


def ray_start(cluster: Cluster, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "ray"), "start", "--block", *args],
            cwd=ROOT, env=cluster.env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def ends(log: Path) -> Callable[[], str]:
    """The end of a Ray node's ``log``, for a failure to quote (it says why the node did not
    come up)."""
    return lambda: f"{log.name} ends:\n{log.read_text(errors='replace')[-3000:]}"


def reachable(url: str) -> bool:
    """Whether a Ray dashboard at ``url`` (on loopback) answers (its health needs no token)."""
    try:
        return get(int(url.rsplit(":", 1)[1]), "/api/gcs_healthz", timeout=2)[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    pytest.importorskip("ray")
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths
    gcs, dashboard = free_port(), free_port()
    metrics = [free_port(), free_port()]
    started = Cluster(f"http://127.0.0.1:{dashboard}", free_port(), metrics, free_port())
    started.agent_port = free_port()
    try:
        began = time.monotonic()
        started.processes.append(
            ray_start(
                started,
                "--head",
                f"--port={gcs}",
                "--num-cpus=1",
                f"--temp-dir={temp}",
                "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--dashboard-agent-listen-port={started.agent_port}",
                f"--metrics-export-port={metrics[0]}",
                log=temp / "head.log",
            )
        )
        up = partial(reachable, started.dashboard)
        wait_until(up, 180, 0.5, "the head node", ends(temp / "head.log"))
        started.processes.append(
            ray_start(
                started,
                f"--address=127.0.0.1:{gcs}",
                "--num-cpus=1",
                "--node-ip-address=127.0.0.1",
                f"--metrics-export-port={metrics[1]}",
                log=temp / "node.log",
            )
        )
        two = lambda: len(alive_nodes(started)) == 2  # noqa: E731
        wait_until(two, 180, 0.5, "two nodes", ends(temp / "node.log"))
        started.up_seconds = time.monotonic() - began
        yield started
    finally:
        started.stop()
        shutil.rmtree(temp, ignore_errors=True)


def alive_nodes(cluster: Cluster) -> list[str]:
    try:
        return [n.node_id for n in cluster.state("nodes") if n.state == "ALIVE"]
    except Exception:  # the state API is not up yet
        return []


def serve_config(repository: Path, http_port: int, grpc_port: int, admin_keys: Path) -> dict:
    """The shipped deploy/ray/serve.yaml, pointed at the test's repository, ports and admin
    keys, with delays short enough for a test."""
    config = yaml.safe_load((ROOT / "deploy" / "ray" / "serve.yaml").read_text())
    config["http_options"]["port"] = http_port
    config["grpc_options"]["port"] = grpc_port
    (application,) = config["applications"]
    application["runtime_env"]["env_vars"].update(
        GELU_MODEL_REPOSITORY=str(repository),
        GELU_REPOSITORY_POLL_SECONDS="1",
        GELU_WARMUP_RUNS="1",
        GELU_BODY_TIMEOUT_SECONDS="2",
        GELU_RESTRICTED_API=application["runtime_env"]["env_vars"]["GELU_RESTRICTED_API"].replace(
            "file:/run/secrets/gelu-admin-keys", f"file:{admin_keys}"
        ),
    )
    (deployment,) = application["deployments"]
    deployment["autoscaling_config"].update(
        min_replicas=1,
        max_replicas=2,
        target_ongoing_requests=2,
        upscale_delay_s=1,
        downscale_delay_s=4,
        look_back_period_s=2,
    )
    return config


class Client:
    """Requests through Ray's proxy; ``retry`` retries a failed inference once (inference is
    idempotent, so a retry is safe)."""

    def __init__(self, port: int, retry: bool) -> None:
        self.port, self.retry = port, retry
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        attempts = 2 if self.retry else 1
        outcome: tuple[int, dict] = (0, {})
        for _ in range(attempts):
            try:
                self.connection.request("POST", path, json.dumps(body))
                response = self.connection.getresponse()
                outcome = (response.status, json.loads(response.read() or b"{}"))
            except (OSError, http.client.HTTPException, ValueError):
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                outcome = (0, {})
            if outcome[0] == 200:
                break
        return outcome


class Load:
    """``users`` threads sending V1 predictions until stopped; counts answers and failures
    (first attempts that failed, and failures left after the retry)."""

    def __init__(self, port: int, users: int) -> None:
        self.ok = self.failed_first = self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(port,)) for _ in range(users)]

    def _run(self, port: int) -> None:
        first, retried = Client(port, retry=False), Client(port, retry=True)
        body = {"instances": DIGITS[:4].tolist()}
        while not self._stop.is_set():
            status, _ = first.post("/v1/models/digits-mlp:predict", body)
            final = (
                status if status == 200 else retried.post("/v1/models/digits-mlp:predict", body)[0]
            )
            with self._lock:
                self.ok += final == 200
                self.failed_first += status != 200
                self.failed += final != 200

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def metrics_text(port: int) -> str:
    """One node's Ray metrics export (Prometheus text)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    return connection.getresponse().read().decode()


def ray_counter(port: int, name: str) -> float:
    """The sum of a counter over one node's Ray metrics export."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text(port).splitlines()
        if line.startswith(name + "{") and 'application="gelu-serve"' in line
    )


def render(figures: dict) -> str:
    """docs/deployment.md's block of figures from one recorded run."""
    f = figures
    lines = [
        README_BLOCK[0],
        f"One run of `tests/deploy/test_ray.py` on {f['date']}, two Ray nodes of one CPU each on "
        "this two-core machine:",
        "",
        f"- cluster up (`ray start` of both nodes): {f['cluster_s']:.1f} s; application "
        f"serving {f['deploy_s']:.1f} s after `serve deploy`;",
        f"- scaled from 1 to 2 replicas (one per node) {f['scale_up_s']:.1f} s into a load of "
        f"{f['users']} clients, and back to 1 {f['scale_down_s']:.1f} s after it ended;",
        "- requests each node's replica had answered since it started, read under load once "
        "both served and before the kill (Ray's per-replica counter): "
        + " and ".join(f"{n:,.0f}" for n in f["served_per_node"])
        + ";",
        f"- a replica killed (SIGKILL) under load was replaced in {f['replace_s']:.1f} s; of "
        f"{f['requests']:,} requests, {f['failed_first']} failed at the first attempt, "
        f"{f['failed']} after one retry;",
        f"- a new model version reached every replica {f['poll_s']:.1f} s after it landed in the "
        "repository (poll mode, `GELU_REPOSITORY_POLL_SECONDS=1`).",
        README_BLOCK[1],
    ]
    return "\n".join(lines)


def test_the_shipped_cluster_turns_on_rays_token_authentication_and_bounds() -> None:
    """CVE-2023-48022 / GHSA-gx77-xgc2-4888: the environment every node starts in turns on
    Ray's token authentication; Ray's gRPC proxy, which decodes (and inflates) a message of up
    to 2 GiB before a replica sees it, is held to the replicas' own GELU_MAX_BODY_BYTES."""
    from service.settings import Settings

    env = node_env()
    assert env["RAY_AUTH_MODE"] == "token"
    assert (
        int(env["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"])
        == Settings.model_fields["max_body_bytes"].default
    )
    assert "RAY_AUTH_TOKEN" not in env  # the secret is each node's, never the repository's


def test_the_shipped_proxies_are_bounded_and_control_restricted(tmp_path: Path) -> None:
    """Ray's HTTP proxy is a uvicorn without the service's connection bounds: it keeps the
    service's idle bound (not Ray's 90 s) and ends every request after the replicas' own
    bounds (body, queue) have had their say. The gRPC proxy has no such end: Ray counts it over
    a stream's whole life, and would end busy ModelStreamInfer calls. The proxies listen beyond
    loopback (the gRPC one on every interface whatever the config says), so model control,
    tracing and logging take a key (TorchServe CVE-2024-35199; Triton CVE-2024-0087)."""
    from service.auth import parse
    from service.settings import Settings

    config = yaml.safe_load((ROOT / "deploy" / "ray" / "serve.yaml").read_text())
    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    http_options, grpc_options = config["http_options"], config["grpc_options"]
    assert http_options["keep_alive_timeout_s"] == defaults["keep_alive_seconds"]
    floor = defaults["body_timeout_seconds"] + defaults["default_timeout_us"] / 1e6
    assert floor < http_options["request_timeout_s"] < 10 * floor
    assert "request_timeout_s" not in grpc_options
    (application,) = config["applications"]
    keys = tmp_path / "keys"  # the key files are each node's: one of the test's stands in
    keys.write_text(ADMIN_KEY + "\n")
    restricted_api = application["runtime_env"]["env_vars"]["GELU_RESTRICTED_API"]
    groups = parse(re.sub(r"file:[^;|]+", f"file:{keys}", restricted_api))
    restricted = {c for group in groups for c in group.classes}
    assert {"model-repository", "trace", "logging"} <= restricted


def test_readme_quotes_the_recorded_run() -> None:
    import json as json_

    readme = (ROOT / "docs" / "deployment.md").read_text()
    assert block(readme, README_BLOCK) == render(json_.loads(FIGURES.read_text()))


def slow_body(port: int, wait: float) -> tuple[int, bytes]:
    """A V1 request through Ray's proxy whose body stops after its first bytes: the status and
    body of the answer, read within ``wait`` seconds (0 and b"" if none came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(
            b"POST /v1/models/digits-mlp:predict HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"inst'
        )
        answer = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
    if not answer:
        return 0, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def attack_the_faces(cluster: Cluster) -> None:
    """What a client on the network gets from the proxies, which listen beyond loopback: each
    request reaches the replica's one envelope, with its credentials, limits and error shape.
    Published classes (docs/security.md, "Ray Serve (third audit)"); each names its advisory."""
    import grpc

    from service.grpc import inference_pb2 as pb
    from service.grpc import inference_pb2_grpc as pb_grpc

    http_port, grpc_port = cluster.http_port, cluster.grpc_port
    # TorchServe CVE-2024-35199 (control on every interface), Triton CVE-2024-0087 (logging
    # set over the API): the shipped config restricts control, tracing and logging, on both
    # proxies; with the key they answer.
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/repository/index"):
        method = "POST" if path.endswith("index") else "GET"
        status, body = request_json(http_port, method, path)
        assert status == 401 and list(body) == ["error"], (path, status, body)
    assert request_json(http_port, "GET", "/v2/logging", {"x-admin-key": ADMIN_KEY})[0] == 200
    with grpc.insecure_channel(
        f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        index = stub.RepositoryIndex(
            pb.RepositoryIndexRequest(), metadata=[("x-admin-key", ADMIN_KEY)], timeout=30
        )
        assert "digits-mlp" in {m.name for m in index.models}
        # Oversized messages (Triton CVE-2025-23310/23311's class; gRPC's compression bombs,
        # CWE-409): Ray's proxy decodes, and inflates, up to 2 GiB before a replica sees a
        # message; node.env holds it to GELU_MAX_BODY_BYTES, refused there by grpcio's core
        # (the replica's own refusal names the setting).
        bound = int(node_env()["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"])
        request = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[bytes(bound)])
        with pytest.raises(grpc.RpcError) as too_large:
            stub.ModelInfer(request, timeout=60)
        assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "GELU_MAX_BODY_BYTES" not in str(too_large.value.details())
    # A model name that climbs out of the repository (Triton CVE-2023-31036): 404 in shape, or
    # 401 where the path names no route (restricted groups set: it needs every group's key).
    for name, expected in (("%2e%2e", 404), ("..%2F..%2Fetc", 401), ("digits-mlp%2F..", 401)):
        status, body = request_json(http_port, "GET", f"/v2/models/{name}")
        assert status == expected and list(body) == ["error"], (name, status, body)
    # A decompression bomb (CWE-409): the replica's limit, 413 in shape.
    bomb = gzip.compress(bytes(256 << 20), 9)
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"}
    status, body = request_json(http_port, "POST", "/v1/models/digits-mlp:predict", headers, bomb)
    assert status == 413 and list(body) == ["error"], (status, body)
    # A slow body (Slowloris, CVE-2007-6750's class): Ray's proxy hands the replica the
    # request and the body as it trickles, with no deadline; held without end, each took one
    # of the replica's max_ongoing_requests. The app's own deadline answers it (the test's
    # GELU_BODY_TIMEOUT_SECONDS=2, well before Ray's request_timeout_s).
    status, raw = slow_body(http_port, wait=30)
    assert status == 408 and b"GELU_BODY_TIMEOUT_SECONDS" in raw, (status, raw)
    assert list(json.loads(raw)) == ["error"]


def request_json(
    port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict]:
    """One request through Ray's HTTP proxy: its status and JSON body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.slow  # the module's Ray cluster (started once, for both of its tests)
def test_rays_control_plane_refuses_a_stranger(cluster: Cluster, tmp_path: Path) -> None:
    """CVE-2023-48022 ("ShadowRay"): Ray's job API runs any command it is given, on the
    dashboard (the head) and on every node's agent, which listens on the node's address
    whatever ``--dashboard-host`` says; GHSA-gx77-xgc2-4888: Ray's token authentication is
    off unless RAY_AUTH_MODE=token. In deploy/ray/node.env's environment both refuse a job
    without the cluster's token (401) or with another (403), as does Serve's REST API (which
    deploys any import path; CVE-2026-27482 shut it down by DELETE); with it, the API answers."""
    pwned = tmp_path / "pwned"  # what a job that ran would leave
    job = json.dumps({"entrypoint": f"touch {pwned}"}).encode()
    dashboard = int(cluster.dashboard.rsplit(":", 1)[1])
    targets = [
        (dashboard, "POST", "/api/jobs/", job),
        (cluster.agent_port, "POST", "/api/job_agent/jobs/", job),
        (dashboard, "DELETE", "/api/serve/applications/", b""),
        (dashboard, "GET", "/api/serve/applications/", b""),
    ]
    for port, method, path, body in targets:
        for headers, expected in (({}, 401), ({"Authorization": "Bearer " + "f" * 64}, 403)):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request(method, path, body=body, headers=headers)
            status = connection.getresponse().status
            connection.close()
            assert status == expected, (port, method, path, headers, status)
    assert not pwned.exists()
    # With the token, the same API answers: it is the credential, not a closed port.
    owned = {"Authorization": f"Bearer {cluster.token}"}
    assert request_json(dashboard, "GET", "/api/serve/applications/", owned)[0] == 200


def served_per_node(cluster: Cluster) -> dict[str, float]:
    """Requests each node's replicas answered (Ray's per-replica counter, every replica that
    ever ran, killed ones included), by node."""
    actors = cluster.state("actors", [("class_name", "=", REPLICA_CLASS)])
    node_of = {str(a.name).rsplit("#", 1)[-1]: str(a.node_id) for a in actors}
    served: dict[str, float] = {}
    for port in cluster.metrics_ports:
        for line in metrics_text(port).splitlines():
            if line.startswith("ray_serve_deployment_request_counter_total{"):
                replica = line.split('replica="', 1)[1].split('"', 1)[0]
                node = node_of.get(replica, "unknown")
                served[node] = served.get(node, 0.0) + float(line.rsplit(" ", 1)[1])
    return served


@pytest.mark.slow  # a Ray cluster: about a minute and a half
def test_the_service_on_a_two_node_ray_cluster(
    cluster: Cluster, model_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(model_repository, repository)
    admin_keys = tmp_path / "admin-keys"
    admin_keys.write_text(ADMIN_KEY + "\n")
    config = tmp_path / "serve.yaml"
    settings = serve_config(repository, cluster.http_port, cluster.grpc_port, admin_keys)
    config.write_text(yaml.safe_dump(settings))
    began = time.monotonic()
    subprocess.run(
        [str(BIN / "serve"), "deploy", str(config), "--address", cluster.dashboard],
        cwd=ROOT, check=True, capture_output=True, env=cluster.env(),
    )  # fmt: skip
    client = Client(cluster.http_port, retry=False)

    def ready() -> bool:
        try:
            return get(cluster.http_port, "/v2/health/ready", timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(ready, 120, 0.5, "the application")
    figures: dict = {"date": time.strftime("%Y-%m-%d"), "cluster_s": cluster.up_seconds}
    figures["deploy_s"] = time.monotonic() - began

    # V1 and V2 answers through the proxy, equal to onnxruntime in process.
    x = DIGITS[:8]
    expected = load_model(model_repository, "digits-mlp").infer({"input": x})["probabilities"]
    status, v1 = client.post("/v1/models/digits-mlp:predict", {"instances": x.tolist()})
    assert status == 200
    got = np.array([p["probabilities"] for p in v1["predictions"]], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    v2_input = {"name": "input", "shape": [8, 64], "datatype": "FP32", "data": x.ravel().tolist()}
    status, v2 = client.post("/v2/models/digits-mlp/infer", {"inputs": [v2_input]})
    assert status == 200 and v2["model_version"] == "2"
    probabilities = next(o for o in v2["outputs"] if o["name"] == "probabilities")
    np.testing.assert_array_equal(np.array(probabilities["data"], np.float32), expected.ravel())
    status, bad = client.post("/v1/models/digits-mlp:predict", {"instances": [[1, 2]]})
    assert status == 400 and list(bad) == ["error"]

    attack_the_faces(cluster)

    # gRPC through Ray's gRPC proxy, tritonclient unmodified: the same answer, the core's
    # status codes.
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{cluster.grpc_port}")
    assert grpc_client.is_server_live() and grpc_client.is_model_ready("digits-mlp")
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    answer = grpc_client.infer("digits-mlp", [tensor]).as_numpy("probabilities")
    np.testing.assert_array_equal(answer, expected)
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        grpc_client.infer("nope", [tensor])
    # Its stream through Ray's proxy: each answer in the order sent, a refusal in band.
    answers: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, model in enumerate(["digits-mlp", "nope", "digits-mlp"]):
        grpc_client.async_stream_infer(model, [tensor], request_id=str(i))
    streamed = [answers.get(timeout=60) for _ in range(3)]
    grpc_client.stop_stream()
    assert [r.get_response().id for r, _ in streamed if r is not None] == ["0", "2"]
    np.testing.assert_array_equal(streamed[2][0].as_numpy("probabilities"), expected)
    assert streamed[1][0] is None and "unknown model 'nope'" in str(streamed[1][1])

    # Under load, Ray scales from one replica to two, one on each node.
    assert len(cluster.replicas()) == 1
    before = sum(ray_counter(p, "ray_serve_num_http_requests_total") for p in cluster.metrics_ports)
    figures["users"] = 6
    with Load(cluster.http_port, users=figures["users"]) as load:
        scaled = time.monotonic()

        def two_replicas() -> list[dict] | None:
            replicas = cluster.replicas()
            return replicas if len(replicas) == 2 else None

        replicas = wait_until(two_replicas, 90, 0.5, "two replicas")
        figures["scale_up_s"] = time.monotonic() - scaled
        assert {r["node"] for r in replicas} == set(alive_nodes(cluster))

        # Requests answered on each node, read while both replicas serve and before the kill: a
        # replica's counter leaves Ray's export when the replica stops, and the replacement may
        # start on either node.
        def both_nodes() -> dict[str, float]:
            served = served_per_node(cluster)
            return served if len(served) == 2 and min(served.values()) > 0 else {}

        served = wait_until(both_nodes, 60, 1, "requests answered on both nodes")
        figures["served_per_node"] = sorted(served.values(), reverse=True)

        # A replica process killed under load: Ray replaces it.
        failed_before_kill = load.failed_first
        victim = wait_until(two_replicas, 30, 0.5, "two replicas still")[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(
            lambda: len(r := cluster.replicas()) == 2 and victim not in {x["pid"] for x in r},
            90, 0.5, "a replacement replica",
        )  # fmt: skip
        figures["replace_s"] = time.monotonic() - killed
        # the load goes on with the replacement up: every user answered a few more times
        answered = load.ok
        wait_until(lambda: load.ok >= answered + 5 * figures["users"], 60, 0.2, "more answers")
    sent = load.ok + load.failed
    figures.update(requests=sent, failed_first=load.failed_first, failed=load.failed)
    assert failed_before_kill == 0  # before the kill, nothing fails
    assert load.failed_first < 0.1 * sent
    assert load.failed <= load.failed_first and load.failed < 0.02 * sent

    # The load over, a new version dropped in the repository reaches every replica (both while
    # Ray has not scaled back) by its own polling, as Ray's downscale delay runs.
    settled = time.monotonic()
    write_model(repository, "digits-mlp", 3)

    def serving_3() -> bool:
        answers = [client.post("/v2/models/digits-mlp/infer", {"inputs": [v2_input]})[1]
                   for _ in range(10)]  # fmt: skip
        return all(a.get("model_version") == "3" for a in answers)

    wait_until(serving_3, 60, 0.5, "version 3 everywhere")
    figures["poll_s"] = time.monotonic() - settled

    # Ray scales back to one replica.
    wait_until(lambda: len(cluster.replicas()) == 1, 120, 0.5, "one replica")
    figures["scale_down_s"] = time.monotonic() - settled

    # Service-wide: Ray's metrics export, summed over the nodes, counts every request.
    def counted() -> float:
        return (
            sum(ray_counter(p, "ray_serve_num_http_requests_total") for p in cluster.metrics_ports)
            - before
        )

    wait_until(lambda: counted() >= load.ok, 60, 1, "the metrics export")
    print("\n" + render(figures))
    if os.environ.get("GELU_RECORD_FIGURES") == "1":
        FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
