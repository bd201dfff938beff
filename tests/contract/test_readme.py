"""The README's generated blocks, found and replaced between their markers."""

from __future__ import annotations

import pytest

from contract.readme import block, replace_block

MARKERS = ("<!-- x: generated -->\n", "<!-- /x -->\n")
TEXT = "see <!-- /x -->\n above\n<!-- x: generated -->\nold\n<!-- /x -->\nafter\n"


def test_a_block_is_found_from_its_begin_marker_to_the_end_marker_after_it() -> None:
    # The end marker also stands before the block: only the one after its begin counts.
    assert block(TEXT, MARKERS) == "<!-- x: generated -->\nold\n<!-- /x -->\n"


def test_a_block_is_replaced_and_the_rest_kept() -> None:
    new = MARKERS[0] + "new\n" + MARKERS[1]
    replaced = replace_block(TEXT, MARKERS, new)
    assert replaced == "see <!-- /x -->\n above\n<!-- x: generated -->\nnew\n<!-- /x -->\nafter\n"
    assert replace_block(replaced, MARKERS, block(TEXT, MARKERS)) == TEXT


def test_a_missing_marker_is_an_error() -> None:
    with pytest.raises(ValueError):
        block("no block here\n", MARKERS)
    with pytest.raises(ValueError):
        block(MARKERS[0] + "unterminated\n", MARKERS)
