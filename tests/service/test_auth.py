"""Credentials by route class (GELU_RESTRICTED_API), on both faces."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.auth import CLASSES, UNMATCHED, Restrictions, parse, route_class
from service.errors import ForbiddenError, UnauthorizedError
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.rest.app import create_app
from service.settings import SettingsError, load_settings
from tests.helpers import DIGITS, assert_error, predict
from tests.servers import free_port, probed

PREDICT_BODY = json.dumps({"instances": [DIGITS[0].tolist()]}).encode()
# One request of each class: method, path, body.
HTTP = {
    "inference": ("POST", "/v1/models/digits-mlp:predict", PREDICT_BODY),
    "metadata": ("GET", "/v2/models/digits-mlp", None),
    "health": ("GET", "/v2/health/ready", None),
    "metrics": ("GET", "/metrics", None),
    "model-repository": ("POST", "/v2/repository/index", None),
    "statistics": ("GET", "/v2/models/digits-mlp/stats", None),
    "trace": ("GET", "/v2/trace/setting", None),
    "logging": ("GET", "/v2/logging", None),
}
KEYS = {name: f"key-of-{name}-0123456789" for name in CLASSES}  # 16+ characters
EVERY_CLASS = ";".join(f"{name}:x-api-key={key}" for name, key in KEYS.items())


def test_groups_read_keys_from_files_and_the_environment(tmp_path: Path, monkeypatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alpha\n\n beta \n")
    monkeypatch.setenv("ADMIN_KEY", "gamma")
    groups = parse(f"inference:x-api-key=file:{keys}|delta; model-repository,logging:"
                   "X-Admin-Key=env:ADMIN_KEY")  # fmt: skip
    assert groups[0].keys == (b"alpha", b"beta", b"delta") and groups[0].header == "x-api-key"
    assert groups[1].classes == {"model-repository", "logging"} and groups[1].keys == (b"gamma",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("inference", "each group must read"),
        ("inferences:x=k", "unknown route class(es) ['inferences']"),
        ("inference:x=a;inference,health:y=b", "in two groups"),
        ("inference:x=file:/nonexistent/keys", "/nonexistent/keys"),
        ("inference:x=env:GELU_TEST_NO_SUCH_VARIABLE", "GELU_TEST_NO_SUCH_VARIABLE is unset"),
    ],
)
def test_bad_groups_stop_the_start_without_showing_a_key(text: str, needle: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(restricted_api=text + "|s3cret-key" if "=" in text else text)
    assert needle in str(refused.value) and "s3cret-key" not in str(refused.value)


def test_routes_fall_in_their_classes() -> None:
    for name, (_, path, _) in HTTP.items():
        template = path.replace("digits-mlp", "{name}")
        assert route_class(template) == name, path
    assert route_class("/v2/models/{name}/versions/{version}/infer") == "inference"
    assert route_class("/v1/activations/{name}") == "inference"
    assert route_class("/v1/activations") == "metadata"
    assert route_class("/v2/models/{name}/versions/{version}/ready") == "health"
    assert route_class("/v2/models/{name}/trace/setting") == "trace"
    assert route_class("/docs") == "metadata"
    with pytest.raises(KeyError):
        route_class("/v2/repository/models/{name}/delete")  # a route no class names


def test_an_unmatched_path_needs_every_groups_key() -> None:
    """A path no route answers is checked as every class (issue 62, item 6: fail closed)."""
    restrictions = Restrictions(parse("inference:x-api-key=a;logging:x-admin-key=b"))
    both = {"x-api-key": "a", "x-admin-key": "b"}
    restrictions.check(UNMATCHED, both)
    for headers in ({"x-api-key": "a"}, {"x-admin-key": "b"}, {}):
        with pytest.raises(UnauthorizedError, match="matches no route"):
            restrictions.check(UNMATCHED, headers)
    with pytest.raises(ForbiddenError):  # the header is there, with the other group's key
        Restrictions(parse("inference:x-api-key=a;logging:x-api-key=b")).check(
            UNMATCHED, {"x-api-key": "a"}
        )
    restrictions.check("metadata", {})  # an open class stays open


@pytest.mark.parametrize("restricted", CLASSES)
def test_each_class_restricted_alone_over_http(settings_factory, restricted: str) -> None:
    """Restricted: 401 without its header, 403 with another class's key, served with its
    own; every other class stays open."""
    other = "metadata" if restricted != "metadata" else "health"
    groups = f"{restricted}:x-api-key={KEYS[restricted]};{other}:x-api-key={KEYS[other]}"
    app = create_app(settings_factory(restricted_api=groups))
    with TestClient(app) as client:
        method, path, body = HTTP[restricted]

        def call(headers: dict[str, str]) -> Any:
            return client.request(method, path, content=body, headers=headers)

        assert_error(call({}), 401, f"{restricted} routes are restricted")
        assert_error(call({"X-API-Key": "guess"}), 401, "x-api-key")
        assert_error(call({"X-API-Key": KEYS[other]}), 403, "this key is not for them")
        assert call({"X-API-Key": KEYS[restricted]}).status_code == 200
        for name, (m, p, b) in HTTP.items():
            if name not in (restricted, other):
                assert client.request(m, p, content=b).status_code == 200, name


def _grpc_calls(stub: pb_grpc.GRPCInferenceServiceStub) -> dict[str, Any]:
    x = np.ascontiguousarray(DIGITS[:1])
    infer = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[x.tobytes()])
    infer.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    return {
        "inference": lambda md: stub.ModelInfer(infer, metadata=md, timeout=10),
        "metadata": lambda md: stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=md,
                                                   timeout=10),
        "health": lambda md: stub.ServerLive(pb.ServerLiveRequest(), metadata=md, timeout=10),
        "model-repository": lambda md: stub.RepositoryIndex(pb.RepositoryIndexRequest(),
                                                            metadata=md, timeout=10),
        "statistics": lambda md: stub.ModelStatistics(pb.ModelStatisticsRequest(), metadata=md,
                                                      timeout=10),
        "trace": lambda md: stub.TraceSetting(pb.TraceSettingRequest(), metadata=md, timeout=10),
        "logging": lambda md: stub.LogSettings(pb.LogSettingsRequest(), metadata=md, timeout=10),
    }  # fmt: skip


@pytest.mark.slow
def test_every_class_restricted_on_both_faces(model_repository: Path) -> None:
    """A real server with each class behind its own key: on HTTP and gRPC, each refuses a
    call without a key (401, UNAUTHENTICATED) and with another class's (403,
    PERMISSION_DENIED), and serves one with its own."""
    grpc_port = free_port()

    def ready(port: int) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/v2/health/ready", headers={"x-api-key": KEYS["health"]})
        return connection.getresponse().status

    env = {"GELU_RESTRICTED_API": EVERY_CLASS, "GELU_GRPC_PORT": str(grpc_port)}
    with probed(model_repository, ready, env) as (port, _):
        for name, (method, path, body) in HTTP.items():
            statuses = []
            for key in (None, KEYS["inference" if name != "inference" else "metadata"],
                        KEYS[name]):  # fmt: skip
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                headers = {"x-api-key": key} if key else {}
                connection.request(method, path, body, headers)
                statuses.append(connection.getresponse().status)
            assert statuses == [401, 403, 200], name
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            calls = _grpc_calls(pb_grpc.GRPCInferenceServiceStub(channel))
            for name, call in calls.items():
                other = KEYS["inference" if name != "inference" else "metadata"]
                refusals = [
                    ((), grpc.StatusCode.UNAUTHENTICATED),
                    ((("x-api-key", other),), grpc.StatusCode.PERMISSION_DENIED),
                ]
                for metadata, code in refusals:
                    with pytest.raises(grpc.RpcError) as refused:
                        call(metadata)
                    assert refused.value.code() == code, name
                call((("x-api-key", KEYS[name]),))  # served
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            check = health_pb2_grpc.HealthStub(channel).Check
            with pytest.raises(grpc.RpcError) as refused:
                check(health_pb2.HealthCheckRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            answer = check(health_pb2.HealthCheckRequest(), timeout=10,
                           metadata=(("x-api-key", KEYS["health"]),))  # fmt: skip
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_the_repository_api_can_be_restricted(settings_factory) -> None:
    settings = settings_factory(
        model_control_mode="explicit", load_models=["*"], control_token="s3cret-0123456789"
    )
    with TestClient(create_app(settings)) as restricted:
        for path in ("/v2/repository/index", "/v2/repository/models/digits-mlp/unload"):
            assert_error(restricted.post(path), 401, "GELU_CONTROL_TOKEN")
            wrong = {"Authorization": "Bearer guess"}
            assert_error(restricted.post(path, headers=wrong), 401, "restricted")
        right = {"Authorization": "Bearer s3cret-0123456789"}
        assert restricted.post("/v2/repository/index", headers=right).status_code == 200
        assert predict(restricted, "digits-mlp") == 200  # inference is not restricted
        response = restricted.post("/v2/repository/models/digits-mlp/unload", headers=right)
        assert response.status_code == 200 and predict(restricted, "digits-mlp") == 404
