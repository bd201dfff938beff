"""The autoscaling components of deploy/k8s, validated offline: the HPA through the Prometheus
adapter (deploy/k8s/autoscaling/prometheus-adapter) and KEDA's ScaledObject
(deploy/k8s/autoscaling/keda). Each is built into the base by kustomize (kubectl's, when
installed) and every resource validated: Kubernetes' own kinds against the schemas of a pinned
version (kubernetes-validate), the ScaledObject against a subset of KEDA's CRD schema kept in
tests/deploy/schemas (nothing is downloaded here), the adapter's rules against its config
types. The queries they hold are evaluated by tests/deploy/test_prometheus_rules.py."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
ADAPTER = K8S / "autoscaling" / "prometheus-adapter"
KEDA = K8S / "autoscaling" / "keda"
RULES = ROOT / "deploy" / "prometheus" / "gelu-serve.rules.yml"
KEDA_SCHEMA = Path(__file__).parent / "schemas" / "keda-scaledobject-v1alpha1.json"
KUBERNETES_VERSION = "1.33"  # as tests/deploy/test_k8s.py

# prometheus-adapter's config, as its Go types say (kubernetes-sigs/prometheus-adapter v0.12.0,
# pkg/config/config.go; read with yaml.UnmarshalStrict, so an unknown field is an error).
_GROUP_RESOURCE = {
    "type": "object", "additionalProperties": False, "required": ["resource"],
    "properties": {"group": {"type": "string"}, "resource": {"type": "string"}},
}  # fmt: skip
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["seriesQuery", "resources", "name", "metricsQuery"],
    "properties": {
        "seriesQuery": {"type": "string", "minLength": 1},
        "seriesFilters": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "maxProperties": 1,
            "properties": {"is": {"type": "string"}, "isNot": {"type": "string"}},
        }},
        "resources": {"type": "object", "additionalProperties": False, "properties": {
            "template": {"type": "string"},
            "overrides": {"type": "object", "additionalProperties": _GROUP_RESOURCE},
            "namespaced": {"type": "boolean"},
        }},
        "name": {"type": "object", "additionalProperties": False, "required": ["matches"],
                 "properties": {"matches": {"type": "string"}, "as": {"type": "string"}}},
        "metricsQuery": {"type": "string", "minLength": 1},
    },
}  # fmt: skip
ADAPTER_CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["rules"],
    "properties": {
        "rules": {"type": "array", "items": _RULE},
        "externalRules": {"type": "array", "items": _RULE},
        "resourceRules": {"type": "object"},
    },
}


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def keda_errors(document: dict[str, Any]) -> list[str]:
    """What KEDA's schema (and its CRD's one CEL rule) finds wrong with a ScaledObject."""
    schema = json.loads(KEDA_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]
    spec = document.get("spec", {})
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        errors.append("minReplicaCount must be less than or equal to maxReplicaCount")
    return errors


def validate(document: dict[str, Any]) -> None:
    """One resource of a build: KEDA's kind against KEDA's schema, the rest Kubernetes'."""
    if document["apiVersion"].startswith("keda.sh/"):
        assert keda_errors(document) == []
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@cache
def built(component: str) -> tuple[dict[str, Any], ...]:
    """The base with ``component`` added, as `kustomize edit add component` leaves it, built by
    kubectl's kustomize."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl missing: its kustomize builds the components")
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "k8s"
        shutil.copytree(K8S, base)
        kustomization = load(base / "kustomization.yaml")
        kustomization["components"] = [component]
        (base / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        done = subprocess.run(
            [kubectl, "kustomize", str(base)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    return tuple(yaml.safe_load_all(done.stdout))


def by_kind(documents: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    kinds = [d["kind"] for d in documents]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in documents}


# ---- the components as files ----------------------------------------------------------------


def test_the_components_hold_what_their_kustomizations_name() -> None:
    for directory, listed in ((ADAPTER, {"hpa.yaml"}), (KEDA, {"scaledobject.yaml"})):
        kustomization = load(directory / "kustomization.yaml")
        assert kustomization["kind"] == "Component"
        named = set(kustomization.get("resources", []))
        named |= {p["path"] for p in kustomization.get("patches", []) if "path" in p}
        assert named == listed
    # Besides: the adapter's own config, which is no resource of the deployment.
    assert {p.name for p in ADAPTER.iterdir()} == {
        "kustomization.yaml", "hpa.yaml", "adapter-config.yaml"
    }  # fmt: skip
    assert {p.name for p in KEDA.iterdir()} == {"kustomization.yaml", "scaledobject.yaml"}


def test_the_hpa_and_the_scaled_object_are_valid_alone() -> None:
    validate(load(ADAPTER / "hpa.yaml"))
    validate(load(KEDA / "scaledobject.yaml"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["spec"].update(minReplicas=2), "Additional properties"),
        (lambda s: s["spec"].update(minReplicaCount=20), "less than or equal"),
        (lambda s: s["spec"]["triggers"][0]["metadata"].pop("threshold"), "'threshold'"),
        (lambda s: s["spec"]["triggers"][0]["metadata"].update(treshold="16"), "treshold"),
        (lambda s: s["spec"]["triggers"][0]["metadata"].update(threshold=16), "not of type"),
        (lambda s: s["spec"]["triggers"][0].update(metricType="Utilization"), "is not one of"),
        (lambda s: s["spec"]["triggers"][1].pop("metricType"), "'metricType'"),
        (lambda s: s["spec"].update(triggers=[]), "should be non-empty"),
    ],
)
def test_a_planted_error_in_the_scaled_object_is_caught(change, message: str) -> None:
    scaled = copy.deepcopy(load(KEDA / "scaledobject.yaml"))
    change(scaled)
    errors = keda_errors(scaled)
    assert any(message in e for e in errors), errors


def test_a_planted_error_in_the_hpa_is_caught() -> None:
    hpa = copy.deepcopy(load(ADAPTER / "hpa.yaml"))
    hpa["spec"]["metrics"][1]["pods"]["target"]["averageValue"] = [16]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    hpa["spec"]["metrics"][1]["pods"]["target"] = {"type": "AverageValue", "averagevalue": "16"}
    with pytest.raises(kubernetes_validate.ValidationError, match="unexpected"):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def test_the_adapter_config_is_one_the_adapter_reads() -> None:
    config = load(ADAPTER / "adapter-config.yaml")
    jsonschema.Draft202012Validator(ADAPTER_CONFIG_SCHEMA).validate(config)
    planted = copy.deepcopy(config)
    planted["rules"][0]["metricQuery"] = planted["rules"][0].pop("metricsQuery")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(planted, ADAPTER_CONFIG_SCHEMA)
    for rule in config["rules"] + config["externalRules"]:
        # The series it discovers are the ones its name maps; a pod's value is a sum.
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"])
        assert series is not None and re.fullmatch(rule["name"]["matches"], series.group())
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]
        assert not rule["metricsQuery"].startswith("avg")
    for rule in config["rules"]:  # per pod: the labels the HPA's pods are found by
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


# ---- built into the base --------------------------------------------------------------------


def test_the_adapter_component_replaces_the_hpa_with_one_on_cpu_and_requests_held() -> None:
    resources = by_kind(built("autoscaling/prometheus-adapter"))
    assert set(resources) == {
        "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"
    }  # fmt: skip
    for document in resources.values():
        validate(document)
    hpa = resources["HorizontalPodAutoscaler"]["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "gelu-serve")
    types = [m["type"] for m in hpa["metrics"]]
    assert types == ["Resource", "Pods"]  # the list is replaced whole, CPU kept
    served = {r["name"]["as"] for r in load(ADAPTER / "adapter-config.yaml")["rules"]}
    assert hpa["metrics"][1]["pods"]["metric"]["name"] in served


def test_the_keda_component_replaces_the_hpa_with_a_scaled_object() -> None:
    resources = by_kind(built("autoscaling/keda"))
    assert set(resources) == {
        "ConfigMap", "Deployment", "Service", "ScaledObject", "PodDisruptionBudget"
    }  # fmt: skip  # KEDA makes the HPA: a second one would fight it
    for document in resources.values():
        validate(document)
    spec = resources["ScaledObject"]["spec"]
    deployment = resources["Deployment"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert spec["minReplicaCount"] >= 1  # a pod loads its models before it is ready
    (prometheus,) = [t for t in spec["triggers"] if t["type"] == "prometheus"]
    # The query names what the rules record (and test_prometheus_rules.py evaluates it).
    recorded = {r["record"] for g in load(RULES)["groups"] for r in g["rules"]}
    names = set(re.findall(r"[a-z_]+:[a-z_:]+", prometheus["metadata"]["query"]))
    assert names and names <= recorded
    # A CPU trigger needs the container's CPU request.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "cpu" in container["resources"]["requests"]
