"""uv, configured as this machine's pip is: ``python -m workbench.uv pip install ...``.

uv reads neither ``pip.conf`` nor ``PIP_*`` variables. Where pip is configured with a local wheel
directory, extra indexes, constraints or a CA bundle, uv without them resolves elsewhere: on a
machine whose torch wheel lies in pip's ``find-links``, uv took torch from the registry with its
CUDA packages (several GB). So this asks pip for its configuration (``pip config list``: every
file and ``PIP_*`` variable, as pip merges them) and passes each setting on as uv's option or
variable. A setting given to uv directly (its ``UV_*`` variable is set) is left to uv.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The ``uv pip`` subcommands that resolve packages, and so take index options.
RESOLVING = frozenset({"install", "sync", "compile"})
TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Setting:
    """How one pip setting reaches uv: an option per value, or an environment variable."""

    uv_variable: str  # uv's own variable for it: when set, uv's value wins
    option: str | None = None  # repeated for each whitespace-separated value; None: the variable
    flag: bool = False  # an option without a value, given when pip's value is true


SETTINGS: dict[str, Setting] = {
    "index-url": Setting("UV_DEFAULT_INDEX", "--default-index"),
    "extra-index-url": Setting("UV_INDEX", "--index"),
    "find-links": Setting("UV_FIND_LINKS", "--find-links"),
    "no-index": Setting("UV_NO_INDEX", "--no-index", flag=True),
    "constraint": Setting("UV_CONSTRAINT", "--constraints"),
    "trusted-host": Setting("UV_INSECURE_HOST", "--allow-insecure-host"),
    "pre": Setting("UV_PRERELEASE", "--prerelease=allow", flag=True),
    "cert": Setting("SSL_CERT_FILE"),
    "client-cert": Setting("SSL_CLIENT_CERT"),
    "timeout": Setting("UV_HTTP_TIMEOUT"),
    "default-timeout": Setting("UV_HTTP_TIMEOUT"),
}
# pip settings that change nothing about what gets installed, or name pip's own files.
IGNORED = frozenset(
    {
        "cache-dir", "config-file", "disable-pip-version-check", "no-cache-dir", "no-color",
        "no-compile", "no-input", "no-python-version-warning", "no-warn-script-location",
        "progress-bar", "quiet", "require-virtualenv", "retries", "root-user-action", "verbose",
    }
)  # fmt: skip


def parse_config_list(text: str) -> dict[str, str]:
    """``pip config list``'s lines (``section.key='value'``, the value as Python's repr) as a
    mapping of ``section.key`` to value."""
    items = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and "." in key:
            items[key] = str(ast.literal_eval(value))
    return items


def effective(items: Mapping[str, str], command: str = "install") -> dict[str, str]:
    """The settings pip's ``command`` runs with: ``[global]``, overridden by ``[command]``,
    overridden by ``PIP_*`` variables (pip's section ``:env:``), as pip orders them."""
    chosen: dict[str, str] = {}
    for section in ("global", command, ":env:"):
        for key, value in items.items():
            name, _, option = key.partition(".")
            if name == section:
                chosen[option.lower().replace("_", "-").removeprefix("--")] = value
    return chosen


def translate(
    settings: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str], list[str]]:
    """uv's options and variables for pip's ``settings``, and the settings not passed on."""
    options: list[str] = []
    variables: dict[str, str] = {}
    for name, setting in SETTINGS.items():
        value = settings.get(name)
        if value is None or setting.uv_variable in environ:
            continue
        if setting.option is None:
            variables[setting.uv_variable] = value
        elif setting.flag:
            options += [setting.option] if value.strip().lower() in TRUE else []
        else:
            for item in value.split():
                options += [setting.option, item]
    # pip takes the best version that any index offers, uv by default the first index's only.
    if "--index" in options and "UV_INDEX_STRATEGY" not in environ:
        options += ["--index-strategy", "unsafe-best-match"]
    unknown = sorted(name for name in settings if name not in SETTINGS and name not in IGNORED)
    return options, variables, unknown


def pip_settings(pythons: Sequence[str] = ()) -> dict[str, str] | None:
    """What pip is configured with for ``pip install``, asked of the first of ``pythons``
    that has pip (default: this Python, then the one its venv was made from, whose pip
    installed uv where the venv has none); None where none has."""
    base = str(Path(sys.base_prefix) / "bin" / "python3")
    for python in pythons or dict.fromkeys([sys.executable, base]):
        try:
            listed = subprocess.run(
                [python, "-m", "pip", "config", "list"], capture_output=True, text=True
            )
        except OSError:  # no such interpreter
            continue
        if listed.returncode == 0:
            return effective(parse_config_list(listed.stdout))
    return None


def command(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    """``argv`` (uv's arguments) with ``options`` after a resolving ``uv pip`` subcommand."""
    if len(argv) >= 2 and argv[0] == "pip" and argv[1] in RESOLVING:
        return [argv[0], argv[1], *options, *argv[2:]]
    return list(argv)


def uv_binary() -> str:
    """The uv installed beside this Python (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        sys.exit("workbench.uv: no uv beside this Python or on PATH (`pip install uv`)")
    return found


def main(argv: Sequence[str] | None = None) -> None:
    """Run uv with ``argv``, given what pip is configured with; exits with uv's status."""
    argv = sys.argv[1:] if argv is None else argv
    settings = pip_settings()
    if settings is None:
        print("workbench.uv: no pip here, so no pip configuration to pass on", file=sys.stderr)
    options, variables, unknown = translate(settings or {}, os.environ)
    if unknown:
        print(f"workbench.uv: pip's {', '.join(unknown)} not passed on to uv", file=sys.stderr)
    uv = uv_binary()
    os.execve(uv, [uv, *command(argv, options)], {**os.environ, **variables})


if __name__ == "__main__":
    main()
