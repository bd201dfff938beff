"""Credentials by route class, as Triton's restricted-API groups.

``GELU_RESTRICTED_API`` restricts classes of routes to a header carrying one of some keys:
groups separated by ``;``, each ``<class>[,<class>...]:<header>=<key>[|<key>...]``, for example
``inference:x-api-key=file:/run/secrets/api-keys;model-repository,trace,logging:x-admin-key=
env:ADMIN_KEY``. A key is ``file:PATH`` (each non-empty line of the file a key, read once, at
start-up), ``env:NAME`` (the variable's value), or the key itself. A restricted request without
the header, or with a value that is no key at all, is answered 401; with a key of another
class, 403. gRPC reads the same header from the call's metadata (UNAUTHENTICATED,
PERMISSION_DENIED). Keys are compared in constant time (``hmac.compare_digest``), each against
every key, and never logged. ``GELU_CONTROL_TOKEN`` is one case of this: the classes
``model-repository``, ``trace`` and ``logging`` behind ``Authorization: Bearer <token>``,
unless ``GELU_RESTRICTED_API`` restricts them itself.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.errors import ForbiddenError, UnauthorizedError

CLASSES = (
    "inference", "metadata", "health", "metrics", "model-repository", "statistics", "trace",
    "logging",
)  # fmt: skip
CONTROL_CLASSES = ("model-repository", "trace", "logging")  # what GELU_CONTROL_TOKEN guards


@dataclass(frozen=True)
class Group:
    """Classes restricted to ``header`` carrying one of ``keys``."""

    classes: frozenset[str]
    header: str  # lower-case
    keys: tuple[bytes, ...]
    hint: str = "GELU_RESTRICTED_API"  # where a client's operator finds the key


def _keys(source: str) -> list[bytes]:
    """The keys one ``|``-separated entry names."""
    if source.startswith("file:"):
        path = Path(source.removeprefix("file:"))
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"{path}: {exc.strerror} (GELU_RESTRICTED_API)") from None
        return [line.strip().encode() for line in lines if line.strip()]
    if source.startswith("env:"):
        name = source.removeprefix("env:")
        if not os.environ.get(name):
            raise ValueError(f"environment variable {name} is unset or empty (GELU_RESTRICTED_API)")
        return [os.environ[name].encode()]
    return [source.encode()] if source else []


def parse(text: str) -> list[Group]:
    """``GELU_RESTRICTED_API``'s groups; ``ValueError`` names what is wrong (never a key)."""
    groups: list[Group] = []
    seen: set[str] = set()
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        match = re.fullmatch(r"([a-z,\- ]+):([A-Za-z0-9\-_]+)=(.+)", entry, re.DOTALL)
        if match is None:
            raise ValueError("each group must read <class>[,<class>...]:<header>=<key>[|<key>]")
        classes = {c.strip() for c in match.group(1).split(",") if c.strip()}
        unknown = classes - set(CLASSES)
        if unknown:
            raise ValueError(
                f"unknown route class(es) {sorted(unknown)}; known: {', '.join(CLASSES)}"
            )
        if classes & seen:
            raise ValueError(f"route class(es) {sorted(classes & seen)} in two groups")
        seen |= classes
        keys = [key for source in match.group(3).split("|") for key in _keys(source.strip())]
        if not keys:
            raise ValueError(f"no key for {sorted(classes)}")
        groups.append(Group(frozenset(classes), match.group(2).lower(), tuple(keys)))
    return groups


class Restrictions:
    """Which classes need which header and keys; ``check`` answers a request."""

    def __init__(self, groups: Iterable[Group]) -> None:
        self.groups = list(groups)
        self.by_class = {c: g for g in self.groups for c in g.classes}

    @classmethod
    def from_settings(cls, settings: object) -> Restrictions | None:
        """The settings' restrictions, or None where every class is open."""
        restricted = getattr(settings, "restricted_api", None)
        groups = parse(restricted.get_secret_value() if restricted is not None else "")
        token = getattr(settings, "control_token", None)
        taken = {c for g in groups for c in g.classes}
        control = frozenset(CONTROL_CLASSES) - taken
        if token is not None and control:
            bearer = f"Bearer {token.get_secret_value()}".encode()
            hint = "'Authorization: Bearer <token>', GELU_CONTROL_TOKEN"
            groups.append(Group(control, "authorization", (bearer,), hint))
        return cls(groups) if groups else None

    def restricts(self, route_class: str) -> bool:
        return route_class in self.by_class

    def check(self, route_class: str, value_of: dict[str, str]) -> None:
        """Pass, or raise 401 / 403 for a request of ``route_class`` whose headers (or
        metadata; lower-case names) are ``value_of``."""
        group = self.by_class.get(route_class)
        if group is None:
            return
        given = value_of.get(group.header)
        if given is not None and _matches(given.encode(), group.keys):
            return
        if given is not None:
            for other in self.groups:
                if (
                    other is not group
                    and other.header == group.header
                    and _matches(given.encode(), other.keys)
                ):
                    raise ForbiddenError(
                        f"{route_class} routes are restricted: this key is not for them"
                    )
        raise UnauthorizedError(
            f"{route_class} routes are restricted: send the '{group.header}' header with a key "
            f"for them ({group.hint})"
        )


def _matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether ``given`` is one of ``keys``, comparing against every one in constant time."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


# Routes by class: HTTP by method and path, gRPC by method name. Inference routes (the
# direct ones) are "inference" without a lookup.
INFERENCE = (
    r"/v1/models/[^/]+(/versions/[^/]+)?:predict|/v2/models/[^/]+(/versions/[^/]+)?/infer"
    r"|/v1/activations/[^/]+"
)
_HTTP = [
    ("health", re.compile(r"/|/v2/health/(live|ready)|/v2/models/[^/]+(/versions/[^/]+)?/ready")),
    ("metrics", re.compile(r"/metrics")),
    ("model-repository", re.compile(r"/v2/repository/.*")),
    ("statistics", re.compile(r"/v2/models/(stats|[^/]+(/versions/[^/]+)?/stats)")),
    ("trace", re.compile(r"/v2(/models/[^/]+)?/trace/setting")),
    ("logging", re.compile(r"/v2/logging")),
    ("inference", re.compile(INFERENCE)),
]
GRPC = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "Watch": "health", "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelConfig": "metadata", "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelStatistics": "statistics", "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository", "RepositoryModelUnload": "model-repository",
    "TraceSetting": "trace", "LogSettings": "logging",
}  # fmt: skip


def http_class(method: str, path: str) -> str:
    """The class of an HTTP route (everything not named above is metadata: models, the
    server, activation listings, the API's documentation)."""
    for name, pattern in _HTTP:
        if pattern.fullmatch(path):
            return name
    return "metadata"
