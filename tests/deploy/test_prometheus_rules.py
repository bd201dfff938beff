"""The Prometheus side of autoscaling: the recording rules (deploy/prometheus/
gelu-serve.rules.yml) under `promtool test rules`, their unit tests able to fail, and the
queries the prometheus adapter and KEDA send (deploy/k8s/autoscaling/) evaluated by promtool
over the same series; every metric they name is one the service exports.

promtool is Debian's `prometheus` package (`apt-get install prometheus`); without it the tests
that run it skip, saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import DIGITS, app_client, service_settings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "gelu-serve.rules.yml"
RULE_TESTS = PROMETHEUS / "gelu-serve.rules.test.yml"
ADAPTER_CONFIG = (
    ROOT / "deploy" / "k8s" / "autoscaling" / "prometheus-adapter" / "adapter-config.yaml"
)
SCALED_OBJECT = ROOT / "deploy" / "k8s" / "autoscaling" / "keda" / "scaledobject.yaml"
PODS = ("gelu-serve-a", "gelu-serve-b")  # RULE_TESTS' pods, in namespace "default"
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {"sum", "avg", "max", "count", "by", "rate", "delta", "clamp_min", "round"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool missing: Debian's `prometheus` package has it (apt-get install prometheus)"
        )
    return found


def run_promtool(*args: str | Path, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def metric_names(expression: str) -> set[str]:
    """The names an expression reads: outside label matchers, ranges, strings and templates."""
    bare = re.sub(r"<<[^>]*>>|\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|by \([^)]*\)", " ", expression)
    words = set(NAME.findall(bare)) - PROMQL_WORDS
    return {w for w in words if not re.fullmatch(r"[0-9e]+", w)}


def adapter_query(rule: dict[str, Any], selector: str = "") -> str:
    """A rule's metricsQuery as prometheus-adapter renders it for an HPA's Pods metric over
    PODS in namespace "default" (pkg/naming/metrics_query.go, ``Build``): its series, the
    metric selector's matchers, the namespace's, then the pods' (``=~`` for several); grouped
    by pod."""
    series = NAME.match(rule["seriesQuery"])
    assert series is not None
    matchers = [*filter(None, [selector]), 'namespace="default"', f'pod=~"{"|".join(PODS)}"']
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series.group())
        .replace("<<.LabelMatchers>>", ",".join(matchers))
        .replace("<<.GroupBy>>", "pod")
    )


def evaluate(tmp_path: Path, cases: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``cases`` (promql_expr_test entries) over RULE_TESTS' first group of series, with the
    rules loaded, by `promtool test rules`."""
    group = load(RULE_TESTS)["tests"][0]
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [{"interval": group["interval"], "input_series": group["input_series"],
                   "promql_expr_test": [{"eval_time": "2m", **c} for c in cases]}],
    }  # fmt: skip
    (tmp_path / "cases.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return run_promtool("test", "rules", "cases.yml", cwd=tmp_path)


# ---- the rules ---------------------------------------------------------------------------------


def test_the_rules_are_valid() -> None:
    done = run_promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    done = run_promtool("test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("record", "wrong"),
    [
        # A pod's load averaged over its model versions: half of it with one idle (PR #8980).
        (
            "namespace_pod:gelu_inference_in_flight_requests:sum",
            "avg by (namespace, pod) (gelu_inference_in_flight_requests)",
        ),
        # Queue time as the mean of per-model ratios, Triton's Helm query before the fix.
        (
            "namespace_pod:gelu_batch_queue_seconds:mean1m",
            "avg by (namespace, pod) (rate(gelu_batch_queue_seconds_sum[1m])"
            " / clamp_min(rate(gelu_batch_queue_seconds_count[1m]), 1e-9))",
        ),
    ],
)
def test_the_unit_tests_catch_the_averaging_mistake(
    tmp_path: Path, record: str, wrong: str
) -> None:
    """The rules file with one rule averaged the wrong way fails its unit tests, on that
    rule (and on those built on it): they show the right value where the mistake gives
    half."""
    rules = load(RULES)
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r["record"] == record]
    rule["expr"] = wrong
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path)
    done = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "FAILED" in output
    failed = re.findall(r'expr: "([^"]*)"', output)
    assert any(record in expression for expression in failed), output


# ---- the queries the autoscalers send ------------------------------------------------------------


def test_the_adapter_reads_each_pod_whole(tmp_path: Path) -> None:
    """As an HPA's Pods metric: each pod's requests over every model it holds, and one
    model's when the HPA selects it."""
    in_flight, pending = load(ADAPTER_CONFIG)["rules"]
    rendered = adapter_query(in_flight)
    assert rendered == (
        'sum by (pod) (gelu_inference_in_flight_requests{namespace="default",'
        'pod=~"gelu-serve-a|gelu-serve-b"})'
    )
    cases = [
        {"expr": rendered, "exp_samples": [{"labels": '{pod="gelu-serve-a"}', "value": 12},
                                           {"labels": '{pod="gelu-serve-b"}', "value": 4}]},
        {"expr": adapter_query(pending), "exp_samples": [
            {"labels": '{pod="gelu-serve-a"}', "value": 8},
            {"labels": '{pod="gelu-serve-b"}', "value": 1}]},
        {"expr": adapter_query(in_flight, 'model="digits-mlp-tanh"'), "exp_samples": [
            {"labels": '{pod="gelu-serve-a"}', "value": 0},
            {"labels": '{pod="gelu-serve-b"}', "value": 0}]},
    ]  # fmt: skip
    done = evaluate(tmp_path, cases)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_adapter_external_metric_is_one_models_queue_time(tmp_path: Path) -> None:
    (rule,) = load(ADAPTER_CONFIG)["externalRules"]
    # BuildExternal: the selector's matchers and the namespace's; no group-by label.
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", "namespace_model:gelu_batch_queue_seconds:mean1m")
        .replace("<<.LabelMatchers>>", 'model="digits-mlp",namespace="default"')
        .replace("<<.GroupBy>>", "")
    )
    cases = [{"expr": f"round(1e6 * {query}, 0.01)",
              "exp_samples": [{"labels": "{}", "value": 1333.33}]}]  # fmt: skip
    done = evaluate(tmp_path, cases)
    assert done.returncode == 0, done.stdout + done.stderr


def test_keda_reads_one_number_the_sum_over_pods(tmp_path: Path) -> None:
    """KEDA refuses a query that answers several series; an AverageValue trigger needs the
    sum, which the HPA it makes divides by the pods: 16 on two pods here."""
    (trigger,) = [t for t in load(SCALED_OBJECT)["spec"]["triggers"] if t["type"] == "prometheus"]
    assert trigger["metricType"] == "AverageValue"
    cases = [{"expr": trigger["metadata"]["query"],
              "exp_samples": [{"labels": "{}", "value": 16}]}]  # fmt: skip
    done = evaluate(tmp_path, cases)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- names -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exposition(model_repository: Path) -> str:
    with app_client(service_settings(model_repository)) as client:
        client.post("/v1/models/digits-mlp:predict", json={"instances": DIGITS[:2].tolist()})
        return client.get("/metrics").text


def test_every_metric_the_autoscalers_read_is_exported(exposition: str) -> None:
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE))
    exported = set(families)
    exported |= {f"{f}_{s}" for f, t in families.items() if t == "histogram"
                 for s in ("sum", "count", "bucket")}  # fmt: skip
    recorded = {r["record"] for g in load(RULES)["groups"] for r in g["rules"]}
    expressions = [r["expr"] for g in load(RULES)["groups"] for r in g["rules"]]
    config = load(ADAPTER_CONFIG)
    expressions += [r["seriesQuery"] for r in config["rules"] + config["externalRules"]]
    expressions += [t["metadata"]["query"] for t in load(SCALED_OBJECT)["spec"]["triggers"]
                    if t["type"] == "prometheus"]  # fmt: skip
    named: set[str] = set()
    for expression in expressions:
        names = metric_names(expression)
        assert names, expression
        assert names <= exported | recorded, (expression, names - exported - recorded)
        named |= names
    assert {"gelu_inference_in_flight_requests", "gelu_inference_pending_requests",
            "gelu_batch_queue_seconds_sum", "gelu_batch_queue_seconds_count"} <= named  # fmt: skip
    assert families["gelu_inference_in_flight_requests"] == "gauge"


def test_the_exposition_passes_promtools_lint(exposition: str) -> None:
    """Triton's name for the pending gauge ends in _count, which Prometheus keeps for
    histograms and summaries: promtool refuses it, and accepts ours."""
    done = subprocess.run([promtool(), "check", "metrics"], input=exposition,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    triton = (
        "# TYPE nv_inference_pending_request_count gauge\nnv_inference_pending_request_count 1\n"
    )
    done = subprocess.run([promtool(), "check", "metrics"], input=triton,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and '"_count" suffix' in done.stdout + done.stderr


def test_names_are_read_outside_matchers_and_templates() -> None:
    query = 'sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>}) / a:b_c{x="y_z"}[1m]'
    assert metric_names(query) == {"a:b_c"}
    assert metric_names("clamp_min(sum by (pod) (rate(x_count[1m])), 1e-9)") == {"x_count"}
