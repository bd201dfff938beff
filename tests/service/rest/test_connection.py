"""The connection's parts, in process: a body held in pieces, the spare buffers (the limits
they enforce against a real server: test_protocol.py's slow tests)."""

from __future__ import annotations

import os

from service.rest.connection import Pieces, Spare


def test_a_body_read_in_one_piece_is_handed_on_without_a_copy() -> None:
    body = Pieces()
    piece = os.urandom(1 << 20)
    body += piece
    assert len(body) == len(piece) and bytes(body) is piece
    body += b"tail"
    assert len(body) == len(piece) + 4 and bytes(body) == piece + b"tail"
    assert bytes(Pieces()) == b""


def test_the_spare_buffers_stay_within_their_limit() -> None:
    spare = Spare(100)
    first, second = spare.take(60), spare.take(30)
    assert len(first) == 60 and len(second) == 30
    spare.give(first)
    spare.give(second)  # 90 bytes held
    spare.give(bytearray(20))  # would be 110: let go
    assert spare.buffers == [first, second] and spare.held == 90
    assert spare.take(50) is first and spare.take(50) is not second  # too small: a new one
    assert spare.held == 30
