"""Triton's trace settings: which requests are traced, changed while the service runs, for
the server and per model; refused with a reason, and off without an exporter."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.rest.app import create_app
from service.trace_settings import TraceSettings
from tests.helpers import DIGITS, assert_error


def test_the_trace_extension_is_off_without_an_exporter(client: TestClient) -> None:
    settings = client.get("/v2/trace/setting").json()
    assert settings == {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1",
                        "log_frequency": "0", "trace_mode": "opentelemetry"}  # fmt: skip
    refused = client.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
    assert_error(refused, 400, "set OTEL_TRACES_EXPORTER")
    assert "trace" in client.get("/v2").json()["extensions"]
    assert_error(client.get("/v2/models/nope/trace/setting"), 404, "nope")


def test_trace_settings_change_which_requests_are_traced(settings_factory, monkeypatch) -> None:
    """With an exporter, the settings pick one in trace_rate requests, trace_count of them,
    per model where a model overrides the server."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")  # nothing printed meanwhile
    with TestClient(create_app(settings_factory())) as client:
        plane = client.app.state.dataplane  # type: ignore[attr-defined]
        picked: list[bool] = []
        original = plane.trace_settings.pick

        def pick(model: str) -> bool:
            picked.append(original(model))
            return picked[-1]

        monkeypatch.setattr(plane.trace_settings, "pick", pick)
        body = {"instances": DIGITS[:1].tolist()}
        server = client.post("/v2/trace/setting", json={"trace_rate": "2", "trace_count": "3"})
        assert server.json()["trace_rate"] == "2" and server.json()["trace_level"] == ["TIMESTAMPS"]
        for _ in range(8):
            client.post("/v1/models/digits-mlp:predict", json=body)
        assert picked == [False, True, False, True, False, True, False, False]
        assert client.get("/v2/trace/setting").json()["trace_count"] == "0"
        model = client.post("/v2/models/digits-mlp/trace/setting",
                            json={"trace_count": "-1", "trace_rate": "1"}).json()  # fmt: skip
        assert model["trace_count"] == "-1" and model["trace_level"] == ["TIMESTAMPS"]
        picked.clear()
        client.post("/v1/models/digits-mlp:predict", json=body)
        client.post("/v1/models/digits-mlp-tanh:predict", json=body)  # the server's: spent
        assert picked == [True, False]
        cleared = client.post("/v2/models/digits-mlp/trace/setting", json={"trace_count": None})
        assert cleared.json()["trace_count"] == "0"  # the server's again
        client.post("/v2/trace/setting", json={"trace_level": ["OFF"]})
        assert client.get("/v2/models/digits-mlp/trace/setting").json()["trace_level"] == ["OFF"]
        plane.tracing.exporting.exporters.clear()  # nothing to print at the end


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"trace_level": ["TENSORS"]}, "TENSORS is not traced here"),
        ({"trace_rate": "0"}, "trace_rate must be at least 1"),
        ({"trace_count": "x"}, "trace_count must be an integer"),
        ({"trace_rate": True}, "trace_rate must be an integer"),  # not 1
        ({"trace_rate": 1.5}, "trace_rate must be an integer"),  # not 1
        ({"trace_count": ["1", "2"]}, "trace_count must be an integer"),
        ({"trace_file": "/tmp/t"}, "unknown trace setting 'trace_file'"),
        ({"trace_rate": None}, "only a model's setting can be cleared"),
        ({"trace_mode": "triton"}, "only opentelemetry"),
    ],
)
def test_bad_trace_settings_are_refused(change: dict[str, Any], needle: str) -> None:
    from service.errors import BadInputError

    settings = TraceSettings(enabled=True)
    with pytest.raises(BadInputError, match=needle):
        settings.update(change)
    assert settings.reply()["trace_rate"] == "1"
