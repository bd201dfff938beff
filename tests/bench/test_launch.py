"""bench.launch: the order a pass starts its servers in."""

from __future__ import annotations

from bench.launch import start_order


def test_each_server_of_a_pass_starts_in_each_position_in_turn() -> None:
    orders = [start_order(3, i) for i in range(6)]
    assert orders[:3] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]] and orders[3:] == orders[:3]
    for server in range(3):  # first, second and third once in every three passes
        assert sorted(order.index(server) for order in orders[:3]) == [0, 1, 2]
