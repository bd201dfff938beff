"""Which request fields the service reads one value of (``service.fields``): the fixed ones,
each restricted group's header, and the trace propagators' single-valued fields, not their
lists; and how a repeat among them is found."""

from __future__ import annotations

from service.auth import Restrictions, parse
from service.fields import LISTS, read_once, repeated


def test_every_credentials_header_and_single_trace_field_is_read_once() -> None:
    restrictions = Restrictions(parse("inference:x-api-key=k;logging:X-Admin-Key=a"))
    once = read_once(restrictions)
    assert {"x-api-key", "x-admin-key", "host", "authorization", "x-request-id"} <= once
    assert "traceparent" in once and not LISTS & once
    assert "x-api-key" not in read_once(None)


def test_a_repeat_is_found_only_among_fields_read_once() -> None:
    once = frozenset({b"host", b"x-api-key"})
    assert repeated([b"accept", b"accept", b"host"], once) is None
    assert repeated([b"x-api-key", b"host", b"x-api-key", b"host"], once) == b"x-api-key"
