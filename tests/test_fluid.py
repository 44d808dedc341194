"""The flow-level replay of a PS worker's messages (dpro/replayer/port_sharing.py), by hand."""

import numpy as np
import pytest

from dpro.graph.compiled import CAT_CODE, compile_graph
from dpro.replayer.port_sharing import PULL, PUSH, Flow, simulate_port_sharing


def _graph(devs: list[str], durs: list[float], edges: list[tuple[int, int]], dev_names: list[str]):
    n = len(devs)
    return compile_graph(names=[f"op{i}" for i in range(n)], dur=np.array(durs, float), cat=[CAT_CODE["COMM"]] * n,
                         device=[dev_names.index(d) for d in devs], prio=np.arange(n, dtype=float),
                         src=[a for a, _ in edges], dst=[b for _, b in edges], devices=dev_names,
                         device_owner=np.zeros(len(dev_names), dtype=np.int64), owners=["w"],
                         device_is_comm=np.ones(len(dev_names), dtype=bool))


def test_messages_to_different_servers_share_the_port():
    """Beta 1 µs/B, one worker: 100, 100 and 300 B to three servers at once share the port
    (a third each) until the two small ones end at 300 µs; the last 200 B then move alone:
    500 µs. A pull (other direction) of 100 B beside them is not slowed: 100 µs."""
    names = ["c0", "c1", "c2", "c3"]
    g = _graph(names, [0] * 4, [], names)
    flows = {0: Flow(100, PUSH), 1: Flow(100, PUSH), 2: Flow(300, PUSH), 3: Flow(100, PULL)}
    s = simulate_port_sharing(g, flows, alpha=0.0, beta=1.0, workers=1)
    assert s.end.tolist() == pytest.approx([300, 300, 500, 100])


def test_one_connection_is_fifo_and_a_server_port_takes_every_worker():
    """Two messages of 100 B on one connection, 2 workers (each gets half of the server's
    port), 10 µs per message: 10 + 200, then 10 + 200 after it. An op after the first
    message (the server's update, 5 µs) starts when it ends."""
    g = _graph(["c0", "c0", "srv"], [0, 0, 5], [(0, 2)], ["c0", "srv"])
    s = simulate_port_sharing(g, {0: Flow(100, PUSH), 1: Flow(100, PUSH)}, alpha=10.0, beta=1.0, workers=2)
    assert s.start.tolist() == pytest.approx([0, 210, 210])
    assert s.end.tolist() == pytest.approx([210, 420, 215])
    assert s.binder[1] == 0 and s.binder[2] == 0


def test_a_cycle_is_refused():
    g = _graph(["c0", "c1"], [1, 1], [(0, 1), (1, 0)], ["c0", "c1"])
    with pytest.raises(RuntimeError, match="cycle"):
        simulate_port_sharing(g, {}, alpha=0.0, beta=1.0, workers=1)
