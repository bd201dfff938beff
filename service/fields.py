"""The request fields the service reads one value of, on both faces: a request that repeats one
is refused, before any of them is read.

A field that is not a list (``Authorization``, ``Host``, ``Content-Type``, a credentials
header) may come once (RFC 9110 5.3; RFC 9112 3.2 for ``Host``). Sent twice, each reader
picks its own: a proxy or gateway the first, this service the last (``dict(headers)``),
Starlette's ``Headers`` the first again. A key checked by one layer and another key acted on
by the next is the auth-bypass class of Envoy's CVE-2026-26308 (a multi-valued header matched
one way by RBAC and read another by the backend) and OAuth2-proxy's CVE-2025-64484; grpc-js
refuses a repeated ``authorization`` rather than pick one (grpc/grpc-node#1275). gRPC
metadata is the same multimap, so its keys are held to the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from opentelemetry import propagate

from service.auth import Restrictions
from service.codecs import HEADER_LENGTH, SHAPE_HEADER
from service.errors import BadInputError
from service.logs import REQUEST_ID_HEADER

# What some part of the service reads one value of, on some route or method (lower case, as
# ASGI scopes and gRPC metadata carry names). Content-Length's repeats the HTTP parser refuses
# first; a host without it (Ray Serve's proxy, another ASGI server) is held here.
READ_ONCE = (
    "host", "authorization", "content-type", "content-length", "content-encoding",
    HEADER_LENGTH.lower(), SHAPE_HEADER.lower(), REQUEST_ID_HEADER, "triton_grpc_error",
)  # fmt: skip
# The trace propagators' fields that are lists: W3C's tracestate and baggage may be split
# over several lines. Their other fields (traceparent, b3) are one value each.
LISTS = frozenset({"tracestate", "baggage"})
T = TypeVar("T", str, bytes)


def read_once(restrictions: Restrictions | None) -> frozenset[str]:
    """Every field the service reads one value of: ``READ_ONCE``, each restricted group's
    credentials header, and the trace propagators' single-valued fields (OTEL_PROPAGATORS)."""
    names = {*READ_ONCE, *(propagate.get_global_textmap().fields - LISTS)}
    if restrictions is not None:
        names.update(group.header for group in restrictions.groups)
    return frozenset(names)


def repeated(names: Iterable[T], once: frozenset[T]) -> T | None:
    """The first of ``once`` that ``names`` holds twice, or None."""
    seen: set[T] = set()
    for name in names:
        if name in once:
            if name in seen:
                return name
            seen.add(name)
    return None


def repeated_error(name: str | bytes) -> BadInputError:
    """The refusal of a request that sends ``name`` more than once."""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    return BadInputError(
        f"the {name!r} field comes more than once; this service reads one value of it, so send "
        "it once"
    )
