"""Property-based fuzzing of the OpenAPI document against a real server: no input schemathesis
generates, valid or not, gets a 5xx, and every error is the one error shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from tests.servers import running  # noqa: E402

pytestmark = pytest.mark.slow  # a real server and some thousand requests


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[int]:
    # Explicit model control, so the repository routes are fuzzed too; every model loaded.
    env = {"GELU_MODEL_CONTROL_MODE": "explicit", "GELU_LOAD_MODELS": "*"}
    with running(model_repository, **env) as (port, _):
        yield port


def operations(port: int) -> list:
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json")
    found = [result.ok() for result in schema.get_all_operations()]
    # Unloading would leave the rest of the run without models; its refusals are tested in
    # test_v2.py.
    return [o for o in found if not o.path.endswith("/unload")]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_input_gets_a_server_error(server: int, mode: str) -> None:
    """Every operation, with valid (positive) and invalid (negative) requests."""
    from schemathesis import GenerationMode

    checked = 0
    for operation in operations(server):
        strategy = operation.as_strategy(GenerationMode(mode))

        @given(case=strategy)
        @settings(
            max_examples=20,
            deadline=None,
            derandomize=True,  # the same cases every run: a failure reproduces
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def call(case) -> None:
            nonlocal checked
            response = case.call(timeout=30)
            checked += 1
            where = (case.method, case.formatted_path, case.query, case.body)
            assert response.status_code < 500, (where, response.text)
            if response.status_code >= 400:  # the one error shape, whatever went wrong
                assert list(response.json()) == ["error"], (where, response.text)

        try:
            call()
        except Unsatisfiable:  # an operation with nothing to get wrong (no parameters, no body)
            assert mode == "negative"
    assert checked > (200 if mode == "positive" else 100)  # the fuzz really ran
