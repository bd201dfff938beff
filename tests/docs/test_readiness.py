"""docs/serving.md's "Readiness" examples are what a server answers: its curl session, each
command run in order against a real `gelu-serve serve` started as the page says, each answer
compared with the one written; then its tritonclient session over gRPC, run as a doctest."""

from __future__ import annotations

import doctest
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.servers import free_port, serving

PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def section() -> str:
    """The page's "## Readiness" section, up to the next section."""
    text = PAGE.read_text()
    start = text.index("## Readiness\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def settings_named(text: str) -> dict[str, str]:
    """The ``GELU_*=...`` settings of the section's ``... make run`` line."""
    (line,) = re.findall(r"`((?:GELU_\w+=\S+ )+)make run`", text)
    return dict(item.split("=", 1) for item in line.split())


def console(text: str) -> list[tuple[str, list[str]]]:
    """Each ``$`` command of the section's console block, with the lines it answers."""
    (block,) = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_page_names_the_setup_and_the_steps() -> None:
    text = section()
    assert settings_named(text) == {
        "GELU_MODEL_CONTROL_MODE": "on_demand",
        "GELU_PINNED_MODELS": "digits-mlp",
        "GELU_MAX_LOADED_MODELS": "2",
    }
    steps = console(text)
    assert len(steps) == 8 and all(answer for _, answer in steps)
    for command, _ in steps:
        assert shlex.split(command)[0] == "curl"


@pytest.mark.slow
def test_the_sessions_answer_as_written(model_repository: Path) -> None:
    text = section()
    grpc_port = free_port()
    env = {**settings_named(text), "GELU_GRPC_PORT": str(grpc_port), "GELU_WARMUP_RUNS": "0"}
    with serving(model_repository, **env) as port:
        for command, answer in console(text):
            command = command.replace("localhost:8000", f"127.0.0.1:{port}")
            result = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=60
            )
            assert result.stdout.splitlines() == answer, (command, result.stdout, result.stderr)
        (block,) = re.findall(r"```pycon\n(.*?)```", text, re.DOTALL)
        block = block.replace("localhost:8001", f"127.0.0.1:{grpc_port}")
        test = doctest.DocTestParser().get_doctest(block, {}, "serving.md Readiness", None, 0)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, out=report.append)
        assert runner.failures == 0 and runner.tries == 5, "".join(report)
