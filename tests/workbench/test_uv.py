"""workbench.uv: pip's configuration, as pip reports it, passed on to uv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from workbench.uv import command, effective, parse_config_list, pip_settings, translate

# This machine's kind of configuration, as `pip config list` prints it.
LISTED = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/elsewhere'
install.find-links='/overridden/by/the/variable'
download.no-index='true'
"""


def test_the_listing_is_read_as_pip_merges_it() -> None:
    settings = effective(parse_config_list(LISTED))
    assert settings == {
        "cert": "/etc/ssl/certs/ca-certificates.crt",
        "default-timeout": "180",
        "disable-pip-version-check": "1",
        "find-links": "/opt/wheels",  # PIP_FIND_LINKS over [install] over [global]
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
    }  # [download]'s no-index is not install's
    assert parse_config_list('global.index-url="http://h/it\'s"\n') == {
        "global.index-url": "http://h/it's"
    }


def test_each_setting_becomes_uv_s_option_or_variable() -> None:
    options, variables, unknown = translate(effective(parse_config_list(LISTED)), environ={})
    assert options == [
        "--index", "file:///opt/pypi/simple",
        "--index", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
        "--constraints", "/etc/xdg/pip/constraints.txt",
        "--index-strategy", "unsafe-best-match",  # pip takes the best version of any index
    ]  # fmt: skip
    assert variables == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
                         "UV_HTTP_TIMEOUT": "180"}  # fmt: skip
    assert unknown == []


def test_an_index_of_its_own_no_index_and_trusted_hosts() -> None:
    settings = {"index-url": "https://mirror/simple", "no-index": "yes",
                "trusted-host": "mirror other", "pre": "0", "proxy": "http://p:3128"}  # fmt: skip
    options, variables, unknown = translate(settings, environ={})
    assert options == [
        "--default-index", "https://mirror/simple", "--no-index",
        "--allow-insecure-host", "mirror", "--allow-insecure-host", "other",
    ]  # fmt: skip
    assert variables == {}
    assert unknown == ["proxy"]  # said, not dropped silently


def test_what_uv_is_told_directly_wins() -> None:
    settings = {"find-links": "/opt/wheels", "extra-index-url": "file:///x", "cert": "/ca.pem"}
    environ = {"UV_FIND_LINKS": "/mine", "UV_INDEX_STRATEGY": "first-index", "SSL_CERT_FILE": "/c"}
    options, variables, _ = translate(settings, environ)
    assert options == ["--index", "file:///x"]
    assert variables == {}


def test_options_go_after_a_resolving_subcommand_only() -> None:
    assert command(["pip", "install", "-e", "."], ["--no-index"]) == [
        "pip", "install", "--no-index", "-e", ".",
    ]  # fmt: skip
    assert command(["pip", "list"], ["--no-index"]) == ["pip", "list"]
    assert command(["--version"], ["--no-index"]) == ["--version"]


def test_pip_s_own_report_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A configuration file and a variable, through the real `pip config list`."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /from/file\nno-index = true\n"
                      "[install]\nconstraint = /c.txt\n")  # fmt: skip
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/variable")
    # The first with pip: a venv that uv installed has none, the Python it was made from has.
    base = str(Path(sys.base_prefix) / "bin" / "python3")
    settings = pip_settings(["/nonexistent/python", sys.executable, base])
    assert settings is not None
    assert {k: settings[k] for k in ("find-links", "no-index", "constraint")} == {
        "find-links": "/from/variable",
        "no-index": "true",
        "constraint": "/c.txt",
    }
    assert pip_settings(["/nonexistent/python"]) is None


def test_the_images_install_with_the_makefiles_uv() -> None:
    """The Dockerfile's ARG UV_VERSION (docker/fetch-wheels.sh downloads it) is the Makefile's."""
    root = Path(__file__).resolve().parents[2]

    def pinned(path: str, prefix: str) -> str:
        (line,) = [x for x in (root / path).read_text().splitlines() if x.startswith(prefix)]
        return line.removeprefix(prefix).strip()

    assert pinned("Dockerfile", "ARG UV_VERSION=") == pinned("Makefile", "UV_VERSION :=")
