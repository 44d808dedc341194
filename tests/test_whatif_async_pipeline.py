"""The asynchronous simulation's per-message pipeline (issue #28): a worker sends its
messages to a server one at a time in its order and pulls each once the server has updated
it, so its own pushes and pulls overlap; hand-computed expectations (1 B/µs everywhere,
no overhead unless said)."""

from __future__ import annotations

import pytest

from dpro.whatif.async_sim import simulate_async
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.models import Transfer
from dpro.whatif.scaleout import _Piece, async_messages

T = Transfer(0.0, 1.0)


def test_lone_worker_pulls_its_first_message_while_it_pushes_the_next():
    """Messages of 50 and 30 B: push 0-50 then 50-80; the first pull 50-100 (the port's and
    the link's other direction), the second, updated at 80, waits for the connection back:
    100-130. 130 µs a step, where one message of 80 B takes 80 + 80 = 160."""
    assert simulate_async(1, [0.0], [80], [2], T, 0, 0, 10, messages=[[50, 30]]) == pytest.approx(1e6 / 130)
    assert simulate_async(1, [0.0], [80], [2], T, 0, 0, 10) == pytest.approx(1e6 / 160)


def test_update_per_message_before_its_pull():
    """As above with a 10 µs update per message: push 0-50, update 50-60, pull 60-110; push
    50-80, update 80-90, its pull waits for the first: 110-140."""
    assert simulate_async(1, [0.0], [80], [2], T, 10, 0, 10, messages=[[50, 30]]) == pytest.approx(1e6 / 140)


def test_overhead_per_message():
    """alpha 5 µs at 1 B/µs is 5 B more per message: push 0-55, 55-90; pulls 55-110, 110-145."""
    assert simulate_async(1, [0.0], [80], [2], Transfer(5.0, 1.0), 0, 0, 10,
                          messages=[[50, 30]]) == pytest.approx(1e6 / 145)


def test_two_workers_share_the_port_in_both_directions():
    """Two workers start together (no computation), 50 and 30 B each: both first pushes share
    the port in (0.5 B/µs), 0-100; the second pushes 100-160; the first pulls share the port
    out from 100 to 200, the second pulls 200-260: both steps end at 260, and again from
    there: 2 steps per 260 µs (unpipelined: 160 + 160 = 320; the port alone allows 160)."""
    assert simulate_async(2, [0.0], [80], [2], T, 0, 0, 1000, messages=[[50, 30]]) == pytest.approx(2e6 / 260)
    assert simulate_async(2, [0.0], [80], [2], T, 0, 0, 1000) == pytest.approx(2e6 / 320)


def test_a_workers_link_shared_by_its_two_servers():
    """Server A gets [40], server B [20, 20]: A's and B's first push share the worker's link
    out (0.5 each); B's ends at 40 (A has 20 left); B's second and A's share it until 80.
    B's first pull has the link in alone 40-60; A's and B's second pulls share it from 80:
    B's 20 B end at 120, A's last 20 B alone until 140."""
    assert simulate_async(1, [0.0], [40, 40], [1, 2], T, 0, 0, 10,
                          messages=[[40], [20, 20]]) == pytest.approx(1e6 / 140)


def test_messages_in_the_workers_profiled_order():
    """The pushes' order is their profiled start offset (prio): b (prio 1) before a (prio
    2), whatever the names' order; a split gradient's pieces go to their servers in the
    gradient's place."""
    g = WhatIfGraph()
    for name, nbytes, prio in (("a", 8, 2.0), ("b", 2, 1.0)):
        g.add(Op(name=f"push:{name}", cat="COMM", device="c", dur=1.0, bytes=nbytes, prio=prio,
                 attrs={"sub_op": "PUSH_REQ", "tensor": name}))
    assert async_messages(g, {"a": [_Piece("a", 0, 8)], "b": [_Piece("b", 0, 2)]}, 1) == [[2.0, 8.0]]
    pieces = {"a": [_Piece("a", 0, 4), _Piece("a", 1, 4)], "b": [_Piece("b", 1, 2)]}
    assert async_messages(g, pieces, 2) == [[4.0], [2.0, 4.0]]


def test_observe_sees_every_interval():
    """One step of the 50 + 30 B case: 130 µs in all, 80 B pushed and 80 B pulled."""
    seen: list[tuple[dict, float]] = []
    simulate_async(1, [0.0], [80], [2], T, 0, 0, 1, messages=[[50, 30]], observe=lambda r, dt: seen.append((r, dt)))
    assert sum(dt for _, dt in seen) == pytest.approx(130)
    for d in (0, 1):
        assert sum(r * dt for rates, dt in seen for f, r in rates.items() if f[1] == d) == pytest.approx(80)
