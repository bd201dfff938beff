"""deploy/k8s/: the Kubernetes manifests, validated offline against the Kubernetes schemas of a
pinned version (kubernetes-validate), and for the promises they make to each other."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"  # a version every supported managed Kubernetes offered in 2026


def manifests() -> dict[str, dict[str, Any]]:
    """Each resource of the kustomization, by kind."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = {}
    for name in kustomization["resources"]:
        for document in yaml.safe_load_all((K8S / name).read_text()):
            resources[document["kind"]] = document
    return resources


def validate(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert set(manifests()) == {
        "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"
    }  # fmt: skip


@pytest.mark.parametrize("kind", sorted(manifests()))
def test_each_manifest_is_valid_kubernetes(kind: str) -> None:
    validate(manifests()[kind])


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["spec", "replicas"], "two", "'two' is not of type 'integer'"),
        (["spec", "template", "spec", "containers", 0, "livenessProbes"], {}, "unexpected"),
        (["spec", "template", "spec", "terminationGracePeriodSeconds"], "45s", "not of type"),
    ],
)
def test_a_planted_error_is_caught(path: list, value: Any, message: str) -> None:
    deployment = copy.deepcopy(manifests()["Deployment"])
    target = deployment
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        validate(deployment)


def test_the_deployment_keeps_its_promises() -> None:
    resources = manifests()
    deployment, config = resources["Deployment"], resources["ConfigMap"]["data"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "startupProbe" in container
    # The kubelet waits for the pause, the drain and the graceful shutdown before SIGKILL.
    sleep = re.search(
        r"sleep\((\d+)\)", " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    )
    assert sleep is not None
    pause = float(sleep.group(1))
    needed = (
        pause
        + float(config["GELU_DRAIN_SECONDS"])
        + float(config["GELU_GRACEFUL_SHUTDOWN_SECONDS"])
    )
    assert pod["terminationGracePeriodSeconds"] > needed
    # Non-root, read-only root filesystem, no privilege, resources bounded.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert set(container["resources"]) == {"requests", "limits"}
    # Settings from the ConfigMap, the repository from a volume where the settings say.
    assert (
        container["envFrom"][0]["configMapRef"]["name"]
        == resources["ConfigMap"]["metadata"]["name"]
    )
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[config["GELU_MODEL_REPOSITORY"]] in {v["name"] for v in pod["volumes"]}
    # Every GELU_* key is a real setting.
    from service.settings import Settings

    variables = {Settings.variable(f) for f in Settings.model_fields}
    assert set(config) <= variables


def test_service_hpa_and_pdb_point_at_the_deployment() -> None:
    resources = manifests()
    deployment = resources["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}
    service = resources["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["ports"]} <= port_names
    assert resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= (
        labels.items()
    )
    target = resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
