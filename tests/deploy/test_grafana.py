"""The Grafana dashboard asks only for metrics the service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.helpers import DIGITS, app_client, service_settings

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gelu-serve.json"
# PromQL's functions, keywords and the dashboard's variables: every other name is a metric.
NOT_METRICS = {"sum", "by", "rate", "max", "histogram_quantile", "label_values", "le"}


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["query"]["query"] for v in dashboard["templating"]["list"]
                    if v["type"] == "query"]  # fmt: skip
    return expressions


def _metric_names(expression: str) -> set[str]:
    """The names in a PromQL expression outside label matchers, ranges and strings."""
    bare = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"|\([a-z, ]*\) |, [a-z]+\)', " ", expression)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare))
    return {n for n in names if n not in NOT_METRICS and not n.startswith("$")}


def test_every_query_names_metrics_the_service_exports(model_repository: Path) -> None:
    with app_client(service_settings(model_repository)) as client:
        client.post("/v1/models/digits-mlp:predict", json={"instances": DIGITS[:2].tolist()})
        client.post("/v1/models/digits-mlp:predict", json={"instances": [[1.0]]})  # a 400
        metrics = client.get("/metrics").text
    exported = set(re.findall(r"^([a-z_:]+)[{ ]", metrics, re.MULTILINE))
    expressions = _expressions()
    assert len(expressions) >= 9
    named: set[str] = set()
    for expression in expressions:
        assert expression.count("(") == expression.count(")"), expression
        names = _metric_names(expression)
        assert names, expression
        assert names <= exported, (expression, names - exported)
        named |= names
    # Requests, errors, latency, queue, compute, batches, in-flight, providers: all shown.
    for family in ("gelu_requests_total", "gelu_request_failures_total",
                   "gelu_request_duration_seconds_bucket", "gelu_batch_queue_seconds_bucket",
                   "gelu_compute_seconds_bucket", "gelu_batch_size_sum",
                   "gelu_requests_in_flight", "gelu_execution_provider"):  # fmt: skip
        assert family in named


def test_names_are_read_outside_matchers() -> None:
    expression = 'sum by (model, le) (rate(gelu_x_bucket{model=~"a_b"}[5m])) / gelu_y'
    assert _metric_names(expression) == {"gelu_x_bucket", "gelu_y"}
    assert _metric_names("label_values(gelu_z_total, model)") == {"gelu_z_total"}
