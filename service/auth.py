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
unless ``GELU_RESTRICTED_API`` restricts them itself (left open, as TorchServe's management
API was for ShellTorch, anyone who reaches the port could load and unload models).

An HTTP request's class is that of the route the router dispatches it to (``HTTP_ROUTES``, by
route template), found on the path the router matches: the request's path less the ASGI
``root_path`` that a ``--root-path``, a Ray ``route_prefix`` or a mount puts before it. A
class taken from the whole path let every restricted route answer without credentials under a
root path (issue 62, item 6; the class of Starlette GHSA-86qp-5c8j-p5mr). A path that matches
no route is ``UNMATCHED``, which needs every group's key: a disagreement between the classes
and the router fails closed.
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

    def credential(self, route_class: str) -> dict[str, str]:
        """The header that passes ``route_class``: its group's first key (none where the class
        is open). For the service's own health probe, which reads the service's settings."""
        group = self.by_class.get(route_class)
        return {} if group is None else {group.header: group.keys[0].decode("latin-1")}

    def check(self, route_class: str, value_of: dict[str, str]) -> None:
        """Pass, or raise 401 / 403 for a request of ``route_class`` whose headers (or
        metadata; lower-case names) are ``value_of``. ``UNMATCHED`` needs a key of every
        group: it is the most restrictive class there is."""
        if route_class == UNMATCHED:
            for every in self.groups:
                self._check(every, route_class, value_of)
            return
        group = self.by_class.get(route_class)
        if group is not None:
            self._check(group, route_class, value_of)

    def _check(self, group: Group, route_class: str, value_of: dict[str, str]) -> None:
        given = value_of.get(group.header)
        if given is not None and _matches(given.encode(), group.keys):
            return
        what = (
            "this path matches no route, so it is restricted as every class"
            if route_class == UNMATCHED
            else f"{route_class} routes are restricted"
        )
        if given is not None:
            for other in self.groups:
                if (
                    other is not group
                    and other.header == group.header
                    and _matches(given.encode(), other.keys)
                ):
                    raise ForbiddenError(f"{what}: this key is not for them")
        raise UnauthorizedError(
            f"{what}: send the '{group.header}' header with a key for them ({group.hint})"
        )


def _matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether ``given`` is one of ``keys``, comparing against every one in constant time."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


# HTTP routes by class, each named by the template it is registered under (its
# ``/versions/{version}`` form as the unversioned one). ``service.rest.routing.RouteClasses``
# gives every route of the app its class from here when the app is built, and refuses to build
# an app with a route missing here; a request is classed by the route the router dispatches it
# to, never by a pattern of its own over the path (Starlette GHSA-86qp-5c8j-p5mr; issue 62,
# item 6).
HTTP_ROUTES = {
    "/": "health", "/v2/health/live": "health", "/v2/health/ready": "health",
    "/v2/models/{name}/ready": "health",
    "/metrics": "metrics",
    "/v2/repository/index": "model-repository",
    "/v2/repository/models/{name}/load": "model-repository",
    "/v2/repository/models/{name}/unload": "model-repository",
    "/v2/models/stats": "statistics", "/v2/models/{name}/stats": "statistics",
    "/v2/trace/setting": "trace", "/v2/models/{name}/trace/setting": "trace",
    "/v2/logging": "logging",
    "/v1/models/{name}:predict": "inference", "/v2/models/{name}/infer": "inference",
    "/v1/activations/{name}": "inference",
    "/v2": "metadata", "/v2/models": "metadata", "/v2/models/{name}": "metadata",
    "/v2/models/{name}/config": "metadata", "/v1/models": "metadata",
    "/v1/models/{name}": "metadata", "/v1/activations": "metadata",
    "/openapi.json": "metadata", "/docs": "metadata", "/redoc": "metadata",
    "/docs-assets": "metadata",
}  # fmt: skip
# A request no route answers: checked as every restricted class at once, so that a path the
# router might dispatch where the classes do not expect fails closed.
UNMATCHED = "unmatched"
GRPC = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "Watch": "health", "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelConfig": "metadata", "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelStatistics": "statistics", "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository", "RepositoryModelUnload": "model-repository",
    "TraceSetting": "trace", "LogSettings": "logging",
}  # fmt: skip


def route_class(template: str) -> str:
    """The class of the HTTP route registered under ``template``; ``KeyError`` for a route no
    class names (an app with one is not built: see ``HTTP_ROUTES``)."""
    return HTTP_ROUTES[template.replace("/versions/{version}", "")]
