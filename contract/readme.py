"""The documents' generated blocks: text between a begin and an end marker that one of the
project's commands writes (``make bench``, ``make accuracy``, ``make paper``) or a test records
(the default models' table, the Ray cluster's run), and a test reads back to check it against
what produced it."""

from __future__ import annotations

Markers = tuple[str, str]  # the block's first and last text, both part of it


def _span(text: str, markers: Markers) -> tuple[int, int]:
    """Where the block ``markers`` delimit starts and stops in ``text`` (ValueError if absent)."""
    begin, end = markers
    start = text.index(begin)
    return start, text.index(end, start) + len(end)


def block(text: str, markers: Markers) -> str:
    """The block ``markers`` delimit in ``text``, markers included (ValueError if absent)."""
    start, stop = _span(text, markers)
    return text[start:stop]


def replace_block(text: str, markers: Markers, new: str) -> str:
    """``text`` with the block ``markers`` delimit replaced by ``new`` (markers included)."""
    start, stop = _span(text, markers)
    return text[:start] + new + text[stop:]
