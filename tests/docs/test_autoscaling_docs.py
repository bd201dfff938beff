"""The autoscaling pages' examples are the project's own: docs/deployment.md's "Autoscaling on
the queue" quotes the manifests and the rules as they are (and its commands run), and
docs/observability.md's "Autoscaling signals" shows /metrics as the service writes it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import app_client, service_settings

ROOT = Path(__file__).resolve().parents[2]
AUTOSCALING = ROOT / "deploy" / "k8s" / "autoscaling"
RULES = ROOT / "deploy" / "prometheus" / "gelu-serve.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "gelu-serve.rules.test.yml"


def section(page: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above (a ``#`` line
    inside a fenced block is no heading)."""
    lines = (ROOT / "docs" / page).read_text().splitlines(keepends=True)
    level = len(heading.split(" ")[0])
    start = lines.index(heading + "\n")
    fenced = False
    for end in range(start + 1, len(lines)):
        line = lines[end]
        fenced ^= line.startswith("```")
        hashes = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < hashes <= level and line[hashes : hashes + 1] == " ":
            return "".join(lines[start:end])
    return "".join(lines[start:])


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


DEPLOYMENT = section("deployment.md", "### Autoscaling on the queue")
SIGNALS = section("observability.md", "## Autoscaling signals")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_the_yaml_examples_are_the_manifests() -> None:
    hpa = load(AUTOSCALING / "prometheus-adapter" / "hpa.yaml")
    triggers = load(AUTOSCALING / "keda" / "scaledobject.yaml")["spec"]["triggers"]
    config = load(AUTOSCALING / "prometheus-adapter" / "adapter-config.yaml")
    examples = [item for block in blocks(DEPLOYMENT, "yaml") for item in yaml.safe_load(block)]
    assert [e["type"] for e in examples] == ["Pods", "External", "prometheus"]
    pods, external, prometheus = examples
    assert pods in hpa["spec"]["metrics"]
    assert prometheus in triggers
    # The External example is one the adapter serves, and valid in the HPA beside the others.
    assert external["external"]["metric"]["name"] in {
        r["name"]["as"] for r in config["externalRules"]
    }
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    hpa["spec"]["metrics"].append(external)
    kubernetes_validate.validate(hpa, "1.33", strict=True)


def test_the_promql_examples_are_the_rules() -> None:
    expressions = [" ".join(r["expr"].split()) for g in load(RULES)["groups"] for r in g["rules"]]
    examples = blocks(DEPLOYMENT, "promql")
    assert len(examples) == 2
    for example in examples:
        assert " ".join(example.split()) in expressions, example


def test_the_figures_are_the_rule_tests() -> None:
    tests = RULE_TESTS.read_text()
    for figure in ("495.05", "value: 12", "value: 8", "value: 4", "value: 1000", "value: 3000"):
        assert figure in tests
    assert "495.05 µs" in DEPLOYMENT and "12 and 4 a pod and 8 on average" in DEPLOYMENT


def test_the_commands_name_what_exists_and_run() -> None:
    shell = "\n".join(blocks(DEPLOYMENT, "shell"))
    components = set(re.findall(r"autoscaling/[a-z-]+", shell))
    assert components == {"autoscaling/prometheus-adapter", "autoscaling/keda"}
    for component in components:
        assert (ROOT / "deploy" / "k8s" / component / "kustomization.yaml").is_file()
    commands = [line for line in shell.splitlines() if "promtool" in line]
    assert len(commands) == 2
    if shutil.which("promtool") is None:
        pytest.skip("promtool missing: Debian's `prometheus` package has it")
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_metrics_example_is_what_the_service_writes(model_repository: Path) -> None:
    (example,) = blocks(SIGNALS, "text")
    with app_client(service_settings(model_repository)) as client:
        scraped = client.get("/metrics").text.splitlines()
    for line in example.splitlines():
        if line.startswith("#"):
            assert line in scraped
        else:
            family = line.split("{")[0]
            assert any(s.startswith(family + '{model="digits-mlp",version=') for s in scraped)
