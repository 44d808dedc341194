"""Max-min fair sharing of links (dpro.whatif.fairshare): hand-computed expectations."""

from __future__ import annotations

import pytest

from dpro.whatif.fairshare import max_min_rates, transfer_ends
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.models import Transfer
from dpro.whatif.scaleout import async_port_bound, ps_links, simulate_async


def test_two_flows_on_one_link():
    assert max_min_rates([("L",), ("L",)], {"L": 1.0}) == pytest.approx([0.5, 0.5])
    # 100 B each at 0.5 B/µs: both end at 200 µs; a resource without a capacity is unlimited
    assert transfer_ends([(0, 100, ("L", "x")), (0, 100, ("L",))], {"L": 1.0}) == pytest.approx([200, 200])
    assert max_min_rates([("x",)], {"L": 1.0}) == [float("inf")]
    with pytest.raises(ValueError):
        max_min_rates([("L",)], {"L": 0.0})


def test_unequal_placement_small_flow_hands_its_share_back():
    """A lone worker pushes 7.4 MB to server 1 and 2.1 MB to server 0 through its own link
    (1 B/µs; ports 1 B/µs): both at 0.5 B/µs until the 2.1 MB one ends (4.2 s), then the
    7.4 MB one alone at the full link: 5.3 MB more, ends at 9.5 s, as 9.5 MB to one server."""
    caps = {("link", 0): 1.0, ("port", 0): 1.0, ("port", 1): 1.0}
    ends = transfer_ends([(0, 7.4e6, (("link", 0), ("port", 1))), (0, 2.1e6, (("link", 0), ("port", 0)))], caps)
    assert ends == pytest.approx([9.5e6, 4.2e6])
    assert transfer_ends([(0, 9.5e6, (("link", 0), ("port", 0)))], caps) == pytest.approx([9.5e6])


@pytest.mark.parametrize("workers, servers, rate", [(3, 2, 1 / 3), (2, 3, 1 / 3), (2, 2, 1 / 2), (1, 2, 1 / 2),
                                                    (4, 1, 1 / 4)])
def test_symmetric_workers_and_servers(workers, servers, rate):
    """Every worker sends to every server, links and ports 1 B/µs: a port carries N flows,
    a link S, so each flow gets 1/max(N, S)."""
    flows = [(("link", w), ("port", s)) for w in range(workers) for s in range(servers)]
    caps = {**{("link", w): 1.0 for w in range(workers)}, **{("port", s): 1.0 for s in range(servers)}}
    assert max_min_rates(flows, caps) == pytest.approx([rate] * len(flows))


def test_bottleneck_moves_from_port_to_link():
    """a: worker 0 -> server 0 (100 B), b: worker 0 -> server 1 (100 B), c, d: workers 1, 2 ->
    server 0 (10 B each); all capacities 1 B/µs. Server 0's port holds a, c, d at 1/3 each;
    b takes the rest of worker 0's link, 2/3. c and d end at 30 µs (a 90 B left, b 80 B);
    then a is bound by worker 0's link, shared with b: 1/2 each, b ends at 190 µs, a (10 B
    left) alone at 1 B/µs ends at 200 µs."""
    res = [(("link", 0), ("port", 0)), (("link", 0), ("port", 1)), (("link", 1), ("port", 0)),
           (("link", 2), ("port", 0))]
    caps = {**{("link", w): 1.0 for w in range(3)}, **{("port", s): 1.0 for s in range(2)}}
    assert max_min_rates(res, caps) == pytest.approx([1 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert max_min_rates(res[:2], caps) == pytest.approx([0.5, 0.5])
    sizes = [100, 100, 10, 10]
    assert transfer_ends([(0, b, r) for b, r in zip(sizes, res)], caps) == pytest.approx([200, 190, 30, 30])


def test_late_flow_takes_its_share():
    # alone for 50 µs, then 0.5 B/µs each (as models.share_bandwidth on one port)
    assert transfer_ends([(0, 100, ("L",)), (50, 100, ("L",))], {"L": 1.0}) == pytest.approx([150, 200])


def test_graph_replay_with_shared_link():
    """fw 0-10; m1 (100 B after a 5 µs overhead) and m2 (50 B, no overhead), on two
    connections, both through link L (1 B/µs): m2 alone 10-15 (5 B), then both at 0.5 B/µs,
    m2's 45 B end at 105; m1 has 55 B left, alone at 1 B/µs: 160; upd after both: 160-161."""
    g = WhatIfGraph()
    fw = g.add(Op(name="fw", cat="FW", device="cpu", dur=10.0))
    m1 = g.insert([fw], Op(name="m1", cat="COMM", device="conn0", dur=5.0, bytes=100, comm_device=True,
                            attrs={"links": ("L",)}))
    m2 = g.insert([fw], Op(name="m2", cat="COMM", device="conn1", dur=0.0, bytes=50, comm_device=True,
                            attrs={"links": ("L",)}))
    upd = g.insert([m1, m2], Op(name="upd", cat="UPDATE", device="cpu", dur=1.0))
    g.links = {"L": 1.0}
    r = g.simulate()
    assert (r.end_us(m2), r.end_us(m1), r.start_us(upd), r.iteration_us) == pytest.approx((105, 160, 160, 161))
    # a connection sends one message at a time: m2 on m1's connection waits for it
    m2op = g.ops[m2.id]
    m2op.device = "conn0"
    r = g.copy().simulate()
    assert r.iteration_us == pytest.approx(10 + 5 + 100 + 50 + 1)
    # without links the ops last their own time (the overhead only)
    g.links = None
    assert g.simulate().iteration_us == pytest.approx(10 + 5 + 0 + 1)


def test_ps_links_symmetric_share():
    """The representative of 4 workers: its whole link, 1/4 of each server's port."""
    caps = ps_links("w0", 2, 4, Transfer(0.0, 0.01))
    assert caps[("link", "w0", "out")] == pytest.approx(100.0)
    assert caps[("port", 1, "in")] == pytest.approx(25.0) and len(caps) == 6


def test_async_link_shared_by_a_workers_servers():
    """One worker, servers with 74 and 21 B (1 B/µs everywhere, no compute, no overhead):
    both pushes share its link out, 0.5 B/µs each, the 21 B one ends at 42 µs; its pull
    (21 B) has the link in to itself, 42-63, while the 74 B push, alone on the link out from
    42, ends at 95 (32 B left at 1 B/µs); its pull 95-169: 169 µs a step (95 B to one
    server: 95 + 95 = 190); the bound: its link's 95 per direction."""
    t = Transfer(0.0, 1.0)
    assert simulate_async(1, [0.0], [74, 21], [1, 1], t, 0, 0, 10) == pytest.approx(1e6 / 169)
    assert simulate_async(1, [0.0], [95], [1], t, 0, 0, 10) == pytest.approx(1e6 / 190)
    assert async_port_bound(1, [74, 21], [1, 1], t) == pytest.approx(95)
    assert async_port_bound(2, [74, 21], [1, 1], t) == pytest.approx(148)
