"""The house's rules, read from the code's own imports: no import cycles, no face importing
another face, the service free of models/ and torch, no private server internals or the C
API through ctypes in the service, and no test importing another test module or a conftest;
and from the tests' names: each test module named after the module it tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "bench", "export", "models", "contract", "deploy")
FACES = ("service.rest", "service.grpc")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (lazy imports count too)."""
    found: set[str] = set()
    package = _module(path).rpartition(".")[0] if path.name != "__init__.py" else _module(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    sources = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {_module(p): p for p in sources if "_pb2" not in p.name}
    return {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("face", FACES)
def test_no_face_imports_another(face: str) -> None:
    others = [f for f in FACES if f != face]
    for module, imported in _graph().items():
        if module.startswith(face):
            crossing = [m for m in imported if m.startswith(tuple(others))]
            assert not crossing, f"{module} imports {crossing}"


def test_the_service_needs_neither_torch_nor_models() -> None:
    for path in (ROOT / "service").rglob("*.py"):
        imported = _imports(path)
        assert not any(m == "torch" or m.startswith(("torch.", "models")) for m in imported), path


# The one module allowed a private import, pinned and guarded (rest/test_protocol.py).
PRIVATE_HOOK = ROOT / "service" / "rest" / "protocol.py"


def test_the_service_uses_no_private_server_modules_or_the_c_api() -> None:
    hooks = []
    for path in (ROOT / "service").rglob("*.py"):
        assert "pythonapi" not in path.read_text(), f"{path} reaches the C API through ctypes"
        if any(m.startswith("uvicorn.protocols") for m in _imports(path)):
            hooks.append(path)
    assert hooks == [PRIVATE_HOOK]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_is_over_80_lines() -> None:
    long = []
    for path in (p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not long, long


def _is_test_module(name: str) -> bool:
    """Whether the module ``name`` is one pytest collects (``test_*``) or a ``conftest``."""
    return name.startswith("tests.") and any(
        part.startswith("test_") or part == "conftest" for part in name.split(".")
    )


def test_no_test_imports_another_test_module_or_a_conftest() -> None:
    """Helpers shared by tests live in modules of their own (``tests/servers.py``,
    ``tests/helpers.py``, ``tests/onnx_models.py``, ...), fixtures in each folder's
    ``conftest.py``, which pytest finds without an import."""
    tests = ROOT / "tests"
    importing = []
    for path in sorted([*tests.rglob("test_*.py"), *tests.rglob("conftest.py")]):
        crossing = sorted(m for m in _imports(path) if _is_test_module(m))
        if crossing:
            importing.append(f"{path.relative_to(ROOT)} imports {crossing[0]}")
    assert not importing, importing


def test_the_rule_knows_a_test_module() -> None:
    assert _is_test_module("tests.service.rest.test_protocol")
    assert _is_test_module("tests.service.rest.test_protocol.reset")  # from ... import reset
    assert _is_test_module("tests.conftest") and _is_test_module("tests.service.conftest")
    assert not _is_test_module("tests.servers") and not _is_test_module("tests.helpers.DIGITS")
    assert not _is_test_module("service.rest.limits")


# Test modules named after the modules they test (Starlette's tests/ mirrors starlette/):
# tests/A/B/test_X.py tests A/B/X.py, tests/test_X.py tests X.py; a module's tests split by
# topic name it first (test_batching_policy.py: batching.py's priority levels). Held to it:
# these folders and files (tests/contract/, models/, export/ and bench/ can join as their tests
# are named).
MIRRORED_FOLDERS = ("tests/service",)
MIRRORED_FILES = ("tests/test_cli.py",)
# Suites of no one module in those folders, each with its reason. The suites across the whole
# house (tests/security/, test_e2e.py, test_lifecycle.py) sit outside them.
ACROSS_MODULES = {
    "tests/service/rest/test_fuzz.py": "schemathesis over every operation of the OpenAPI "
    "document against a real server: every route, codec and error path at once",
}


def _tested_module(test: Path) -> Path:
    """The source module a test module is named after: ``tests/A/test_X.py`` -> ``A/X.py``,
    or, for ``tests/A/test_X_TOPIC.py``, ``A/X.py`` where that exists and ``A/X_TOPIC.py``
    does not."""
    relative = test.relative_to(ROOT / "tests")
    name = relative.name.removeprefix("test_").removesuffix(".py")
    parts = name.split("_")
    for end in range(len(parts), 0, -1):
        module = ROOT / relative.parent / ("_".join(parts[:end]) + ".py")
        if module.is_file():
            return module
    return ROOT / relative.parent / f"{name}.py"


def test_test_modules_are_named_after_the_modules_they_test() -> None:
    held = [p for folder in MIRRORED_FOLDERS for p in (ROOT / folder).rglob("test_*.py")]
    held += [ROOT / name for name in MIRRORED_FILES]
    unnamed = [
        f"{test.relative_to(ROOT)}: no {_tested_module(test).relative_to(ROOT)}"
        for test in sorted(held)
        if not _tested_module(test).is_file() and str(test.relative_to(ROOT)) not in ACROSS_MODULES
    ]
    assert not unnamed, unnamed
    for name in ACROSS_MODULES:  # the allow-list names suites that exist and need it
        assert (ROOT / name).is_file(), f"{name} is gone: take it off ACROSS_MODULES"
        assert not _tested_module(ROOT / name).is_file(), f"{name} is named after its module"


def test_the_rule_knows_the_module_a_test_module_is_named_after() -> None:
    assert _tested_module(ROOT / "tests/service/rest/test_v2.py") == ROOT / "service/rest/v2.py"
    policy = ROOT / "tests/service/test_batching_policy.py"
    assert _tested_module(policy) == ROOT / "service/batching.py"
    assert _tested_module(ROOT / "tests/service/test_trace_settings.py") == (
        ROOT / "service/trace_settings.py"
    )
    assert not _tested_module(ROOT / "tests/service/test_nothing_here.py").is_file()
    assert _tested_module(ROOT / "tests/service/test_errors.py") == ROOT / "service/errors.py"
    assert _tested_module(ROOT / "tests/test_cli.py") == ROOT / "cli.py"
    # a package has no module of its name: its tests are in its folder
    assert not _tested_module(ROOT / "tests/service/test_repository.py").is_file()
    assert not _tested_module(ROOT / "tests/service/rest/test_errors.py").is_file()
