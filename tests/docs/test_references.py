"""What the documents name still exists: settings, files, signatures, make targets, sections.

The README and every page under docs/ (and runs/README.md) are read as text, no server started:

- every ``GELU_*`` variable is a setting of ``service.settings.Settings``, or one of
  ``NOT_SETTINGS``, each of which the file given as its reason still names;
- every repository path in backticks exists (from the root, from the page, or, for a bare
  name such as ``host.py``, as the end of a file's path), unless ``NOT_PATHS`` says what it is;
- every Python signature in backticks, ``name(params)`` or ``Class.method(params) -> T``, is
  the code's (``inspect.signature``): the same parameters in order, the same defaults, the same
  return annotation; ``name()`` is a call that must bind;
- every ``make TARGET`` is a target of the Makefile;
- every relative link leads to a file, and its ``#section`` to a heading of that file;
- every ``docs/PAGE.md`` that code names exists, and a section it names (``docs/PAGE.md,
  "Heading"``) is a heading of that page, or the bold words a paragraph of it opens with.

``tests/service/test_settings.py`` checks the settings page against the code the other way
round (every setting documented, the generated block current).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
from collections.abc import Iterator
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "runs" / "README.md", *(ROOT / "docs").rglob("*.md")])

# Variables named GELU_* that are not settings, each with the file that reads it, which must
# still name it.
NOT_SETTINGS = {
    "GELU_PORT": "docker-compose.yml",  # the compose file's published HTTP address
    "GELU_GRPC_PUBLISH": "docker-compose.yml",  # ... and gRPC's
    "GELU_MODELS": "docker-compose.yml",  # ... and the repository it mounts
    "GELU_RECORD_FIGURES": "tests/deploy/test_ray.py",  # a test's switch to record its figures
}
# What looks like a path in backticks but names no file of the repository.
NOT_PATHS = {
    "config.pbtxt": "a model's file in a model repository (Triton's layout)",
    "model.onnx": "a version's file in a model repository",
    "model.sig": "a version's signature in a model repository",
    "warmup/": "a model's warm-up data in a model repository",
    "warmup/...": "the same",
    "1/": "a version directory in a model repository",
    ".onnx": "a file extension",
    ".json": "a file extension",
    ".md": "a file extension",
    ".venv/bin/python": "made by `make install`",
    ".bench-peers/": "made by `make bench-peers`",
    "../x": "a path a client sends, in the threat model",
    "n/a": "not a path",
    "application/octet-stream": "a media type",
    "http/protobuf": "an OTLP protocol",
    "handlers/model_repository.py": "MLServer's",
    "inference.GRPCInferenceService/ModelInfer": "a gRPC method",
    "inference.GRPCInferenceService/ModelStreamInfer": "a gRPC method",
    "ray.serve.RayServeAPIService/Healthz": "a gRPC method of Ray Serve's proxy",
    "served.txt": "what bench/on-gpu.sh writes, kept in runs/ as served-N.txt",
}
# Beside the checkout on the machines this project is built on, never in a clone: the shared
# notes and the lent GPU machine's kit (../shared/GPU.md, ../shared/gpu/unpack.sh).
OUTSIDE = "../shared/"
# Signatures quoted in backticks that are not the repository's.
NOT_OURS = {
    "load_model": "tritonclient's",
    "get_inference_statistics": "tritonclient's",
}
EXTENSIONS = r"\.(py|pyi|md|sh|json|png|yaml|yml|toml|pbtxt|proto|txt|patch|csv|onnx|sig)"
PACKAGES = ("service", "bench", "export", "contract", "models", "deploy")


def _text(page: Path) -> str:
    """A page without its fenced code blocks (commands and output, not prose)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)


def _spans(page: Path) -> Iterator[str]:
    """The page's inline code spans, a span broken over lines joined with one space."""
    for match in re.finditer(r"`([^`]+)`", _text(page)):
        yield " ".join(match.group(1).split())


def _where(page: Path) -> str:
    return str(page.relative_to(ROOT))


@cache
def _files() -> frozenset[str]:
    """The repository's files, tracked or not yet added (never ignored ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    return frozenset(name for name in listed if name and (ROOT / name).exists())


@cache
def _dirs() -> frozenset[str]:
    return frozenset(str(Path(name).parents[i]) for name in _files()
                     for i in range(len(Path(name).parents) - 1))  # fmt: skip


# ---- settings ---------------------------------------------------------------------------------


def _variables() -> set[str]:
    return {Settings.variable(name) for name in Settings.model_fields}


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_gelu_variable_named_is_a_setting(page: Path) -> None:
    variables = _variables()
    for name in sorted(set(re.findall(r"\bGELU_[A-Z0-9_]*", page.read_text()))):
        if name.endswith("_"):  # a family, `GELU_CUDA_*`
            assert any(v.startswith(name) for v in variables), (
                f"{_where(page)}: no setting's variable starts with {name}"
            )
        elif name not in variables:
            assert name in NOT_SETTINGS, (
                f"{_where(page)}: {name} is no setting of service/settings.py (renamed or "
                "removed?); if it is not meant to be one, list it in NOT_SETTINGS with the file "
                "that reads it"
            )


@pytest.mark.parametrize(("name", "reader"), sorted(NOT_SETTINGS.items()))
def test_each_variable_that_is_no_setting_is_read_where_it_says(name: str, reader: str) -> None:
    assert name not in _variables(), f"{name} is a setting now: drop it from NOT_SETTINGS"
    assert name in (ROOT / reader).read_text(), f"{reader} no longer names {name}"


# ---- paths ------------------------------------------------------------------------------------


def _expanded(token: str) -> list[str]:
    """``docs/accuracy.{md,png}`` as its two paths."""
    braces = re.search(r"\{([^{}]*)\}", token)
    if braces is None:
        return [token]
    head, tail = token[: braces.start()], token[braces.end() :]
    return [path for part in braces.group(1).split(",") for path in _expanded(head + part + tail)]


def _looks_like_a_path(token: str) -> bool:
    if token.startswith("/") or " " in token or "://" in token or "=" in token:
        return False  # a route, an absolute path, a command, a URL, a setting
    if not re.fullmatch(r"(\.\.?/)*[\w.\-*{},]+(/[\w.\-*{},]*)*", token):
        return False
    return "/" in token or re.search(EXTENSIONS + "$", token) is not None


def _exists(page: Path, path: str) -> bool:
    """From the root (strictly, when it starts at a top-level entry), from the page, or as the
    end of a file's path in the repository."""
    bare = path.rstrip("/")
    top = bare.split("/")[0]
    if top in {name.split("/")[0] for name in _files()} and "/" in bare and "*" not in bare:
        return (ROOT / bare).exists()
    if "*" not in bare and ((ROOT / bare).exists() or (page.parent / bare).exists()):
        return True
    known = _files() | _dirs()
    if any(fnmatch(name, bare) or fnmatch(name, "*/" + bare) for name in known):
        return True
    # a name with a placeholder in capitals, `sitting-N.txt`, `DATE-TIME-REV.json`: the files so
    # named (`README.md` exists as it is, above)
    pattern = re.sub(r"(?<![A-Za-z])[A-Z]+(?![A-Za-z])", "*", bare)
    return pattern != bare and any(fnmatch(name, "*/" + pattern) for name in known)


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_path_named_exists(page: Path) -> None:
    missing = [
        token
        for token in dict.fromkeys(_spans(page))
        if _looks_like_a_path(token) and token not in NOT_PATHS and not token.startswith(OUTSIDE)
        and not all(_exists(page, path) for path in _expanded(token))
    ]  # fmt: skip
    assert not missing, (
        f"{_where(page)} names paths that do not exist (moved or renamed?): {missing}; if one "
        "is not meant to be a repository path, list it in NOT_PATHS"
    )


def test_what_is_no_path_is_not_one() -> None:
    """An entry of NOT_PATHS that names a repository file now should be checked as one."""
    for token in NOT_PATHS:
        assert token.rstrip("/") not in _files() | _dirs(), token


# ---- signatures -------------------------------------------------------------------------------

SIGNATURE = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)(?:\s*->\s*(.+))?")


@cache
def _definitions() -> dict[str, list[tuple[str, str]]]:
    """Each function, class and method the packages define, by name (``f``, ``C``, ``C.m``):
    (module, qualified name) for each."""
    found: dict[str, list[tuple[str, str]]] = {}
    sources = [ROOT / "cli.py", *(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))]
    for source in sources:
        module = ".".join(source.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.setdefault(node.name, []).append((module, node.name))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        name = f"{node.name}.{item.name}"
                        found.setdefault(name, []).append((module, name))
    return found


def _split(params: str) -> list[str]:
    """Top-level comma-separated items (a default may hold commas in brackets)."""
    items, depth, current = [], 0, ""
    for char in params:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    return [item for item in [*items, current.strip()] if item]


def _signature(module: str, qualified: str) -> tuple[inspect.Signature, dict[str, Any]]:
    namespace = importlib.import_module(module)
    target: Any = namespace
    for part in qualified.split("."):
        target = getattr(target, part)
    signature = inspect.signature(target)
    parameters = list(signature.parameters.values())
    if "." in qualified and parameters and parameters[0].name in ("self", "cls"):
        signature = signature.replace(parameters=parameters[1:])
    return signature, vars(namespace)


def _disagreement(quoted: str, signature: inspect.Signature, names: dict[str, Any]) -> str | None:
    """How ``quoted`` (the text in the parentheses, then any ``-> T``) differs from the code's
    ``signature``; None where it agrees."""
    match = SIGNATURE.fullmatch(quoted)
    assert match is not None
    params, returns = _split(match.group(2)), match.group(3)
    if not params:  # `create_app()`: a call, which must bind
        try:
            signature.bind()
        except TypeError as exc:
            return f"it cannot be called so ({exc})"
    else:
        code = list(signature.parameters.values())
        if [p.split("=")[0].strip() for p in params] != [p.name for p in code]:
            return "its parameters differ"
        for param, actual in zip(params, code, strict=True):
            shown = param.partition("=")[2].strip()
            has_default = actual.default is not inspect.Parameter.empty
            if bool(shown) != has_default:
                return f"{actual.name}'s default is shown where there is none, or not shown"
            if shown and shown != "...":
                try:
                    value = ast.literal_eval(shown)
                except ValueError:
                    value = names.get(shown, shown)
                if value != actual.default and value is not actual.default:
                    return f"{actual.name}'s default is {actual.default!r}"
    if returns is not None:
        annotation = signature.return_annotation
        shown = getattr(annotation, "__name__", str(annotation))
        if shown != returns.strip():
            return f"it returns {shown}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_signature_quoted_is_the_codes(page: Path) -> None:
    wrong = []
    for span in dict.fromkeys(_spans(page)):
        match = SIGNATURE.fullmatch(span)
        if match is None or re.fullmatch(r"\w+\(\d\)", span):  # send(2): a manual page
            continue
        name = match.group(1)
        if name.split(".")[0] in NOT_OURS:
            continue
        candidates = _definitions().get(name, [])
        if not candidates:
            wrong.append(f"`{span}` names nothing the repository defines (renamed or removed? "
                         "if it is another project's, list it in NOT_OURS)")  # fmt: skip
            continue
        found = []
        for module, qualified in candidates:
            signature, names = _signature(module, qualified)
            differs = _disagreement(span, signature, names)
            if differs is None:
                break
            found.append(f"{module}.{qualified}{signature}: {differs}")
        else:
            wrong.append(f"`{span}` is not the code's: {'; '.join(found)}")
    assert not wrong, f"{_where(page)}: " + "\n".join(wrong)


def test_a_stale_signature_is_caught() -> None:
    """The comparison itself: the old DataPlane signature, a missing default, a wrong return."""
    from service.dataplane import DataPlane
    from service.runtime import ONE_INSTANCE

    plane = inspect.signature(DataPlane)
    assert _disagreement("DataPlane(settings, metrics=None, runtime=None)", plane, {}) is None
    assert _disagreement("DataPlane(settings, runtime=None)", plane, {}) is not None
    assert _disagreement("DataPlane(settings, metrics, runtime=None)", plane, {}) is not None
    assert _disagreement("DataPlane()", plane, {}) is not None  # settings has no default
    opened, names = _signature("service.runtime", "Runtime.open")
    assert names["ONE_INSTANCE"] is ONE_INSTANCE
    quoted = "Runtime.open(model, label, placement=ONE_INSTANCE) -> Session"
    assert _disagreement(quoted, opened, names) is None
    assert _disagreement(quoted.replace("Session", "Model"), opened, names) is not None


# ---- make targets -----------------------------------------------------------------------------


@cache
def _targets() -> frozenset[str]:
    makefile = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, flags=re.M))


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_make_target_named_exists(page: Path) -> None:
    named = [span.split()[1] for span in _spans(page) if re.match(r"make [a-z]", span)]
    named += re.findall(r"^\s*make ([a-z][\w-]*)", page.read_text(), flags=re.M)  # in blocks
    missing = sorted(set(named) - _targets())
    assert not missing, f"{_where(page)} names make targets the Makefile lacks: {missing}"


# ---- links and sections -----------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(page: Path) -> list[str]:
    return [h.strip() for h in re.findall(r"^#{1,6} (.+)$", _text(page), flags=re.M)]


def _sections(page: Path) -> list[str]:
    """Its headings, and the bold words a paragraph opens with (``**Where Ray sends a
    request:**``), which code may name as sections too."""
    leads = re.findall(r"^\*\*([^*]+?)[:.]?\*\*", _text(page), flags=re.M)
    return _headings(page) + [lead.strip() for lead in leads]


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    for heading in _headings(page):
        slug = _slug(heading)
        count = sum(1 for a in anchors if a == slug or re.fullmatch(rf"{re.escape(slug)}-\d+", a))
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_link_leads_to_a_file_and_its_section(page: Path) -> None:
    for target, section in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", _text(page)):
        if "://" in target or target.startswith("mailto:"):
            continue
        linked = (page.parent / target) if target else page
        assert linked.exists(), f"{_where(page)}: a link to {target}, which does not exist"
        if section and linked.suffix == ".md":
            assert section in _anchors(linked), (
                f"{_where(page)}: a link to {target or 'itself'}#{section}, a section "
                f"{_where(linked)} does not have (its headings: {_headings(linked)})"
            )


def _code_files() -> list[Path]:
    kinds = (".py", ".sh", ".yaml", ".yml", ".toml")
    names = ("Makefile", "Dockerfile", "Dockerfile.cuda")
    return sorted(ROOT / name for name in _files()
                  if name.endswith(kinds) or Path(name).name in names)  # fmt: skip


def test_every_page_and_section_code_points_to_exists() -> None:
    """``docs/performance.md, "The batcher's constants, and other measured choices"`` in a
    comment or docstring, even broken over lines: the page, and its heading."""
    wrong = []
    for source in _code_files():
        if source.is_relative_to(ROOT / "tests" / "docs"):
            continue  # this module's own examples
        text = re.sub(r"\n\s*#\s?", " ", source.read_text())  # comments joined across lines
        text = " ".join(text.split())
        for page, section in re.findall(r"\bdocs/([\w/.-]+?\.md)(?:, \"([^\"]+)\")?", text):
            where = f"{source.relative_to(ROOT)} -> docs/{page}"
            if not (ROOT / "docs" / page).exists():
                wrong.append(f"{where}: no such page")
            elif section and section not in _sections(ROOT / "docs" / page):
                wrong.append(f'{where}, "{section}": no such section')
    assert not wrong, wrong


def test_the_checks_see_what_they_check() -> None:
    """Each check finds its kind of reference in the pages, so none passes by reading nothing."""
    spans = [span for page in PAGES for span in _spans(page)]
    assert sum(_looks_like_a_path(span) for span in spans) > 200
    assert sum(bool(SIGNATURE.fullmatch(span)) for span in spans) >= 5
    assert sum(bool(re.match(r"make [a-z]", span)) for span in spans) > 50
    assert len(_targets()) > 10 and "bench-pool" in _targets()
    assert _slug("What the hardening of issue 62 cost (settled)") == (
        "what-the-hardening-of-issue-62-cost-settled"
    )
    assert _slug("Inference: HTTP driven by wrk, gRPC by `bench.grpc_load`") == (
        "inference-http-driven-by-wrk-grpc-by-benchgrpc_load"
    )
