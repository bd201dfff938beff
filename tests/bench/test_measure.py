"""bench.measure: the order a pass drives its points in, and a peer's answer read."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from bench.launch import Server
from bench.measure import answer, drive_order
from bench.wrk import Request


def test_a_pass_drives_batching_on_and_off_one_after_the_other() -> None:
    """Every pass drives every scenario once, starting at a different one; batching on and off
    of one protocol one right after the other, in the other order every other pass."""
    groups = [["floor"], ["naive"], ["v1 on", "v1 off"], ["v2 on", "v2 off"]]
    passes = [drive_order(groups, i, 3) for i in range(3)]
    assert passes == [
        ["floor", "naive", "v1 on", "v1 off", "v2 on", "v2 off"],
        ["naive", "v1 off", "v1 on", "v2 off", "v2 on", "floor"],
        ["v1 on", "v1 off", "v2 on", "v2 off", "floor", "naive"],
    ]


def test_a_peers_answer_is_read_as_the_models_probabilities(
    stub_server: Callable[..., str],
) -> None:
    """Before a pass is timed, each peer's answer is compared with the model's: read from a V2
    JSON answer (MLServer's) or a JSON list (BentoML's); an error answer stops the run."""
    v2 = {"outputs": [{"name": "probabilities", "shape": [1, 2], "data": [0.25, 0.75]}]}
    answers = {"/v2": v2, "/list": [[0.25, 0.75]]}

    def peer_answer(path: str) -> tuple[int, bytes]:
        body = json.dumps(answers.get(path, {"error": "no"})).encode()
        return (200 if path in answers else 500), body

    peer = Server(stub_server(peer_answer), 0, {0})
    for path in answers:
        got = answer(peer, Request(path, b"{}", {"Content-Type": "application/json"}))
        assert got.tolist() == [[0.25, 0.75]]
    with pytest.raises(AssertionError, match="answered 500"):
        answer(peer, Request("/broken", b"{}", {}))
