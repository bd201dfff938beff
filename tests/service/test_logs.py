"""Request ids, the log formats, the access log and Triton's logging extension."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.logs import (
    LOGS,
    JsonFormatter,
    LogControl,
    escape,
    formatter,
    logger,
    new_request_id,
)
from service.rest.app import create_app
from tests.helpers import DIGITS, assert_error
from tests.servers import grpc_server

PREDICT = "/v1/models/digits-mlp:predict"


@pytest.fixture()
def verbose_off() -> Iterator[None]:
    """Logging is the process's: whatever a test turns on is turned off after it."""
    yield
    LOGS.update({"log_verbose_level": 0})


def test_a_request_id_is_kept_or_made_and_returned(client: TestClient) -> None:
    body = {"instances": DIGITS[:1].tolist()}
    given = client.post(PREDICT, json=body, headers={"X-Request-ID": "caller-7"})
    assert given.status_code == 200 and given.headers["x-request-id"] == "caller-7"
    # A made one: this process's 8 hex digits, then a count, one up for each id made since.
    made = client.post(PREDICT, json=body).headers["x-request-id"]
    after = new_request_id()
    following = client.post(PREDICT, json=body).headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{16}", made) and re.fullmatch("[0-9a-f]{16}", following)
    assert made[:8] == after[:8] == following[:8]
    assert int(made[8:], 16) < int(after[8:], 16) < int(following[8:], 16)
    # FastAPI's routes as the direct ones
    assert (
        client.get("/v2/health/live", headers={"X-Request-ID": "h"}).headers["x-request-id"] == "h"
    )


@pytest.mark.parametrize("path", [PREDICT, "/v2/health/live"])
def test_an_unsafe_request_id_is_refused(client: TestClient, path: str) -> None:
    for bad in ("x" * 129, "two words"):
        response = client.request(
            "POST" if path == PREDICT else "GET", path,
            json={"instances": DIGITS[:1].tolist()}, headers={"X-Request-ID": bad},
        )  # fmt: skip
        assert_error(response, 400, "X-Request-ID must be")
        assert len(response.headers["x-request-id"]) == 16  # a fresh one names the refusal


def test_a_v2_request_id_serves_as_the_request_id(client: TestClient) -> None:
    body = {"id": "v2-id-1", "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                         "data": DIGITS[0].tolist()}]}  # fmt: skip
    response = client.post("/v2/models/digits-mlp/infer", json=body)
    assert response.headers["x-request-id"] == "v2-id-1" and response.json()["id"] == "v2-id-1"
    header = client.post("/v2/models/digits-mlp/infer", json=body, headers={"X-Request-ID": "h"})
    assert header.headers["x-request-id"] == "h"  # the header wins


def test_log_settings_read_and_change(client: TestClient, verbose_off: None) -> None:
    settings = client.get("/v2/logging").json()
    assert settings == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}  # fmt: skip
    changed = client.post("/v2/logging", json={"log_verbose_level": 1}).json()
    assert changed["log_verbose_level"] == 1 and logger.isEnabledFor(logging.DEBUG)
    assert (
        client.post("/v2/logging", json={"log_verbose_level": 0}).json()["log_verbose_level"] == 0
    )
    assert "logging" in client.get("/v2").json()["extensions"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"log_level": 1}, "unknown log setting 'log_level'"),
        ({"log_info": "yes"}, "log_info must be true or false"),
        ({"log_verbose_level": -1}, "non-negative integer"),
        ({"log_verbose_level": 2**32}, "non-negative integer <= 4294967295"),  # Triton's uint32
        ({"log_verbose_level": 1.0}, "non-negative integer"),
        ({"log_format": "xml"}, "log_format must be one of default, ISO8601, json"),
        ({"log_file": "/tmp/x"}, "log_file: logs go to standard error"),
        ({"log_info": False, "log_format": "xml"}, "log_format"),
    ],
)
def test_bad_log_settings_are_refused_whole(client: TestClient, change: dict, needle: str) -> None:
    assert_error(client.post("/v2/logging", json=change), 400, needle)
    assert client.get("/v2/logging").json()["log_info"] is True  # nothing half-applied


def test_log_settings_are_restricted_with_the_control_token(settings_factory) -> None:
    app = create_app(settings_factory(control_token="s3cret-0123456789"))
    with TestClient(app) as client:
        assert_error(client.get("/v2/logging"), 401, "Bearer")
        ok = client.get("/v2/logging", headers={"Authorization": "Bearer s3cret-0123456789"})
        assert ok.status_code == 200


def test_verbose_logs_each_request_under_its_id(client, caplog, verbose_off: None) -> None:
    caplog.set_level(logging.DEBUG, logger="gelu_serve")
    client.post(PREDICT, json={"instances": DIGITS[:1].tolist()}, headers={"X-Request-ID": "q0"})
    assert not [r for r in caplog.records if getattr(r, "request_id", None) == "q0"]
    client.post("/v2/logging", json={"log_verbose_level": 1})
    client.post(PREDICT, json={"instances": DIGITS[:1].tolist()}, headers={"X-Request-ID": "q1"})
    client.post("/v2/logging", json={"log_verbose_level": 0})
    (line,) = [r for r in caplog.records if getattr(r, "request_id", None) == "q1"]
    assert line.levelno == logging.DEBUG and line.status == 200
    assert line.path == PREDICT and line.model == "digits-mlp"
    assert line.version and line.duration_ms > 0


def test_unsafe_characters_are_escaped() -> None:
    assert escape("/v2/models/m/infer") == "/v2/models/m/infer"  # as it was: nothing to do
    assert escape("/a\nb\r\x00\x7f") == "/a\\x0ab\\x0d\\x00\\x7f"
    assert escape('"q"\\') == "\\x22q\\x22\\x5c"
    assert escape("\x85\x9b\u2028\u2029") == "\\x85\\x9b\\u2028\\u2029"
    assert escape("café ß") == "café ß"  # printable text stays readable


@pytest.mark.parametrize("log_format", ["default", "json"])
def test_a_path_cannot_split_or_forge_an_access_line(
    client: TestClient, caplog, verbose_off: None, log_format: str
) -> None:
    """``%0A`` (and CR, NUL, NEL, a quote) in a path: one access line, its path escaped
    (issue 62, item 11)."""
    caplog.set_level(logging.DEBUG, logger="gelu_serve")
    client.post("/v2/logging", json={"log_verbose_level": 1})
    forged = "/v2/models/x%0D%0A2026-01-01 00:00:00,000 INFO gelu_serve: forged%00%C2%85%22"
    client.get(forged, headers={"X-Request-ID": "forger"})
    client.post("/v2/logging", json={"log_verbose_level": 0})
    (record,) = [r for r in caplog.records if getattr(r, "request_id", None) == "forger"]
    line = formatter(log_format).format(record)
    assert len(line.splitlines()) == 1 and "\x00" not in line and "\x85" not in line
    assert (
        record.path == "/v2/models/x\\x0d\\x0a2026-01-01 00:00:00,000 INFO gelu_serve: forged"
        "\\x00\\x85\\x22"
    )
    assert record.status == 404


def test_severities_turned_off_are_dropped(verbose_off: None) -> None:
    control = LogControl("info", "default")
    control.update({"log_warning": False})
    warning = logging.LogRecord("gelu_serve", logging.WARNING, "", 0, "w", None, None)
    error = logging.LogRecord("gelu_serve", logging.ERROR, "", 0, "e", None, None)
    assert not control.filter(warning) and control.filter(error)


def test_json_lines_carry_the_request_fields() -> None:
    record = logging.LogRecord("gelu_serve", logging.INFO, "", 0, "http %s", ("POST",), None)
    record.request_id, record.status, record.duration_ms = "r1", 200, 1.5
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "http POST" and line["level"] == "INFO"
    assert line["request_id"] == "r1" and line["status"] == 200 and line["duration_ms"] == 1.5
    assert line["time"].endswith("Z") and "model" not in line  # only the fields it has


@pytest.mark.slow
def test_log_settings_change_a_running_server_on_both_faces(model_repository: Path) -> None:
    """tritonclient over HTTP and gRPC against ``gelu-serve serve``: a verbose level raised
    on one face shows in the next requests' JSON log lines, on both faces, under their ids."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = DIGITS[:1]

    def infer_both(tag: str, http: httpclient.InferenceServerClient,
                   grpc: grpcclient.InferenceServerClient) -> None:  # fmt: skip
        inputs = [httpclient.InferInput("input", [1, 64], "FP32")]
        inputs[0].set_data_from_numpy(x)
        http.infer("digits-mlp", inputs, headers={"X-Request-ID": f"{tag}-http"})
        grpc_inputs = [grpcclient.InferInput("input", [1, 64], "FP32")]
        grpc_inputs[0].set_data_from_numpy(np.ascontiguousarray(x))
        grpc.infer("digits-mlp", grpc_inputs, headers={"x-request-id": f"{tag}-grpc"})

    with grpc_server(model_repository, GELU_LOG_FORMAT="json") as server:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = grpcclient.InferenceServerClient(server.address)
        assert http.get_log_settings()["log_format"] == "json"
        infer_both("before", http, grpc)
        assert grpc.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"][
            "log_verbose_level"
        ] == {"uint32_param": 1}
        assert http.get_log_settings()["log_verbose_level"] == 1  # one process, one setting
        infer_both("after", http, grpc)
        assert http.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
        infer_both("later", http, grpc)
    lines = [json.loads(line) for line in server.process.output.splitlines()  # type: ignore[attr-defined]
             if line.startswith("{")]  # fmt: skip
    by_id = {line.get("request_id"): line for line in lines if "status" in line}
    assert not {"before-http", "before-grpc", "later-http", "later-grpc"} & set(by_id)
    http_line, grpc_line = by_id["after-http"], by_id["after-grpc"]
    assert http_line["path"] == "/v2/models/digits-mlp/infer" and http_line["status"] == 200
    assert grpc_line["path"] == "/inference.GRPCInferenceService/ModelInfer"
    for line in (http_line, grpc_line):
        assert line["level"] == "DEBUG" and line["model"] == "digits-mlp"
        assert line["version"] and line["duration_ms"] > 0 and line["time"].endswith("Z")
