"""The token bucket over a step's messages (dpro/oracle/bucket.py), hand-computed: a bucket
of K bytes refilled at 1/β while no byte moves, a message going at the line rate while
tokens last (docs/oracle.md "Calibration")."""

from __future__ import annotations

import pytest

from dpro.oracle.bucket import Message, drain, key, send, steady_wires, stream_alpha, stream_wire
from dpro.oracle.calibration import Cost

#: 1000 B bucket emptied at 1 ns/B, then 0.1 µs/B
SMALL = Cost(10, 0.1, 1000, 0.001)
#: 200 Mbit/s (0.04 µs/B) behind a 128 KiB bucket that lets its bytes through at once
TBF = Cost(0, 0.04, 131072, 0.0)


def test_send_takes_the_tokens_there_are() -> None:
    # 200 B held + 30 µs / 0.1 = 300 B refilled: 500 B fast, 300 B at the rate
    assert send(SMALL, 200, 30, 800) == pytest.approx((0.5 + 30, 0))
    # refill capped at the depth: 900 + 500 -> 1000; 400 B fast, 600 left
    assert send(SMALL, 900, 50, 400) == pytest.approx((0.4, 600))
    assert send(Cost(10, 0.1), 123, 50, 400) == pytest.approx((40, 123))  # no bucket: βS


def test_drain_equal_messages() -> None:
    # R = 200 B per message, 150 B sent: the level climbs by 50 B (17 messages: 50 ... 850),
    # then the depth caps it at 1000 - 150 = 850: every message fast
    assert drain(SMALL, 0, 20, 150, 100) == pytest.approx((100 * 0.15, 850))
    # R = 100 B < 150 B from full: fast while the bucket lasts, then 100 B fast + 50 B at the rate
    total, level = drain(SMALL, 1000, 10, 150, 100)
    assert level == pytest.approx(0)
    one_by_one, lv = 0.0, 1000.0
    for _ in range(100):
        w, lv = send(SMALL, lv, 10, 150)
        one_by_one += w
    assert total == pytest.approx(one_by_one)
    assert send(SMALL, 0, 10, 150)[0] == pytest.approx(0.1 + 5)  # the steady message: 5.1 µs


def test_steady_state_of_a_step() -> None:
    x, g = Message(TBF, 1, 32768), Message(TBF, 1, 131072)
    # 3 x 32 KiB, 100 µs apart: demand above the rate, 2500 B per message: 30268 B at the rate
    assert steady_wires([x, x, x], 100)[key(TBF, 32768)] == pytest.approx(0.04 * 30268)   # 1210.72
    # 1000 µs apart: 25 000 B per message
    assert steady_wires([x], 1000)[key(TBF, 32768)] == pytest.approx(0.04 * 7768)          # 310.72
    # the same + 500 µs of per-call α: 37 500 B refill, more than the message: the burst carries it
    slow = Cost(500, 0.04, 131072, 0.0)
    assert steady_wires([Message(slow, 1, 32768)], 1000)[key(slow, 32768)] == pytest.approx(0)
    # a halo of 32 KiB and a row gather of 128 KiB, 2000 µs apart (50 000 B each): the gather
    # empties the bucket, so the step starts empty; the halo leaves 17 232 B, the gather gets
    # 67 232 B fast and 63 840 B at the rate (an empty bucket refilled by 50 000 B: 81 072 B)
    w = steady_wires([x, g], 2000)
    assert w[key(TBF, 32768)] == pytest.approx(0)
    assert w[key(TBF, 131072)] == pytest.approx(0.04 * 63840)                            # 2553.6
    # a message passing one rank's link twice per step counts twice in the demand
    two = steady_wires([Message(TBF, 1, 32768, 4, 2)], 1000)
    assert two[key(TBF, 32768)] == pytest.approx(0.04 * 7768)


def test_stream_with_refill() -> None:
    """8 calls of 32 KiB from a full 128 KiB bucket (1 ns/B, then 0.04 µs/B), 250 µs of α
    each (6250 B): 4 calls fast (131 072 -> 18 750 B), the 5th 25 000 B fast, the last 3
    6250 B each: 174 822 B fast, 87 322 B at the rate."""
    bucket = Cost(0, 0.04, 131072, 0.001)
    assert stream_wire(bucket, 1, 32768, 8, 250) == pytest.approx(174.822 + 0.04 * 87322)   # 3667.702
    t = 250 + 3667.702 / 8
    assert stream_alpha(bucket, 1, 32768, 8, t) == pytest.approx(250)
    # faster than the rate allows at α = 0 (all but the bucket at 0.04 µs/B): the shortfall, negative
    f0 = stream_wire(bucket, 1, 32768, 8, 0)
    assert f0 == pytest.approx(131.072 + 0.04 * 131072)
    assert stream_alpha(bucket, 1, 32768, 8, f0 / 8 - 100) == pytest.approx(-100)


def test_pipeline_through_one_stage_link() -> None:
    """GPipe on 2 stages of the two-layer network (B = 8, 2 micro-batches of 4): 4 transfers
    of 4 x 256 B on the critical path, but each stage's link carries 2 per step; the
    compute (3 x (40 + 80) + 5 = 365 µs) is spread over those 2: 182.5 µs + α 10 µs refill
    192.5 / 0.4 = 481.25 B, the 1024 B transfer empties the bucket each time."""
    from dpro.oracle.calibration import Calibration
    from dpro.oracle.formulas import P2P, Options, predict
    from dpro.oracle.platform import Platform
    from test_oracle import B, two_layers

    slow = Cost(10, 0.4, 1000, 0.001)
    plat = Platform(10.0, 0.4, calibration=Calibration({2: {"allreduce": slow}}))
    x = predict(two_layers(), "pipeline", 2, plat, Options(batch=B, micro=2))
    assert x.busy_us == pytest.approx(365) and x.refill_us == pytest.approx(182.5)
    fast = 192.5 / 0.4
    assert x.communication_us[P2P] == pytest.approx(4 * (10 + 0.001 * fast + 0.4 * (1024 - fast)))  # 910.325
