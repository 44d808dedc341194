"""The per-device Kahn simulation (dpro.replayer.engine) and the critical path.

Hand-computed schedules on small graphs, then properties of random DAGs (hypothesis), and
an exact comparison with a frozen copy of the straightforward reference implementation
(the engine is optimised; its results must not change by a single bit, ties included).
The exactness tests run each engine: the Python one and the compiled core (skipped, with
the reason, where the core was not built: a machine without a C compiler).
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpro.errors import DproInputError
from dpro.graph.compiled import compile_graph
from dpro.graph.builder import GraphBuilder
from dpro.replayer.critical_path import critical_path, critical_path_indices
from dpro.replayer import engine
from dpro.replayer.engine import Schedule, simulate
from scriptmod import load_script

needs_core = pytest.mark.skipif(not engine.compiled_available(), reason=f"compiled replay core {engine._core()}")
#: every engine, run directly (whatever DPRO_ENGINE says)
IMPLS = [
    pytest.param(engine.simulate_python, id="python"),
    pytest.param(engine.simulate_compiled, id="compiled", marks=needs_core),
]


def mk(dur, dev, edges=(), prio=None, gap=None):
    """A compiled graph: op i named op<i>, on device d<dev[i]>."""
    n = len(dur)
    ndev = max(dev) + 1 if n else 1
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    return compile_graph(
        names=[f"op{i}" for i in range(n)],
        dur=np.asarray(dur, dtype=float),
        gap=gap,
        cat=np.zeros(n, dtype=np.int8),
        device=np.asarray(dev, dtype=np.int64),
        prio=np.zeros(n) if prio is None else np.asarray(prio, dtype=float),
        src=src, dst=dst,
        devices=[f"d{k}" for k in range(ndev)], device_owner=np.zeros(ndev, dtype=np.int64), owners=["node"],
        device_is_comm=np.zeros(ndev, dtype=bool),
    )


def check(s: Schedule, start, end, binder):
    assert s.start.tolist() == list(map(float, start))
    assert s.end.tolist() == list(map(float, end))
    assert s.binder.tolist() == list(binder)


# ---------------------------------------------------------------- hand-computed cases


def test_empty_graph():
    s = simulate(mk([], []))
    assert s.makespan == 0.0 and len(s.start) == 0
    assert critical_path_indices(s) == []


def test_chain_is_sum_of_durations():
    # 0 -> 1 -> 2, each on its own device
    s = simulate(mk([1.0, 2.0, 3.5], [0, 1, 2], [(0, 1), (1, 2)]))
    check(s, [0, 1, 3], [1, 3, 6.5], [-1, 0, 1])
    assert s.makespan == 6.5
    assert critical_path_indices(s) == [0, 1, 2]


def test_chain_on_one_device():
    s = simulate(mk([1.0, 2.0, 3.0], [0, 0, 0], [(0, 1), (1, 2)]))
    check(s, [0, 1, 3], [1, 3, 6], [-1, 0, 1])


def test_two_independent_ops_serialize_on_one_device_by_index():
    s = simulate(mk([2.0, 3.0], [0, 0]))
    check(s, [0, 2], [2, 5], [-1, 0])  # same ready time and prio: lower index first
    assert critical_path_indices(s) == [0, 1]


def test_two_independent_ops_serialize_by_prio():
    s = simulate(mk([2.0, 3.0], [0, 0], prio=[1.0, 0.0]))
    check(s, [3, 0], [5, 3], [1, -1])  # op1 has the lower prio: it goes first
    assert critical_path_indices(s) == [1, 0]


def test_two_independent_ops_on_two_devices_run_in_parallel():
    s = simulate(mk([2.0, 3.0], [0, 1]))
    check(s, [0, 0], [2, 3], [-1, -1])
    assert s.makespan == 3.0
    assert critical_path_indices(s) == [1]


def test_fifo_by_ready_time_beats_prio():
    # d0 runs op0 (0..4).  op1 (d1, 0..1) -> op2 (d0) is ready at 1; op3 (d2, 0..3) -> op4 (d0)
    # is ready at 3.  When d0 frees at 4 both wait: op2 (ready 1) goes before op4 (ready 3)
    # although op4 has the lower prio; prio only breaks ties of ready time.
    g = mk([4.0, 1.0, 2.0, 3.0, 2.0], [0, 1, 0, 2, 0], [(1, 2), (3, 4)], prio=[0, 0, 10, 0, 0])
    s = simulate(g)
    check(s, [0, 0, 4, 0, 6], [4, 1, 6, 3, 8], [-1, -1, 0, -1, 2])
    assert critical_path_indices(s) == [0, 2, 4]


def test_ready_tie_broken_by_prio_then_index():
    # op0 (d1, 0..1) feeds op1, op2, op3 on d0, all ready at 1.
    g = mk([1.0, 1.0, 1.0, 1.0], [1, 0, 0, 0], [(0, 1), (0, 2), (0, 3)], prio=[0, 5, 2, 2])
    s = simulate(g)
    # prio 2 before 5; op2 before op3 by index
    check(s, [0, 3, 1, 2], [1, 4, 2, 3], [-1, 3, 0, 2])
    assert critical_path_indices(s) == [0, 2, 3, 1]


def test_diamond():
    #   0 -> 1 -> 3,  0 -> 2 -> 3, all on different devices
    g = mk([1.0, 2.0, 5.0, 1.0], [0, 1, 2, 3], [(0, 1), (0, 2), (1, 3), (2, 3)])
    s = simulate(g)
    check(s, [0, 1, 1, 6], [1, 3, 6, 7], [-1, 0, 0, 2])
    assert critical_path_indices(s) == [0, 2, 3]


def test_diamond_with_shared_device():
    # the two branches share d1: op1 (1..3) then op2 (3..8), op3 waits for op2
    g = mk([1.0, 2.0, 5.0, 1.0], [0, 1, 1, 2], [(0, 1), (0, 2), (1, 3), (2, 3)])
    s = simulate(g)
    check(s, [0, 1, 3, 8], [1, 3, 8, 9], [-1, 0, 1, 2])
    assert critical_path_indices(s) == [0, 1, 2, 3]
    names = [p.name for p in critical_path(g, s)]
    assert names == ["op0", "op1", "op2", "op3"]
    assert [p.dur_us for p in critical_path(g, s)] == [1.0, 2.0, 5.0, 1.0]


def test_waits_for_predecessor_and_device():
    # d0: op0 (0..3); d1: op1 (0..5).  op2 on d0 needs op1: its device is free at 3, its
    # input at 5 -> starts 5, bound by op1.  op3 on d1 needs op0 (input at 3) but d1 is busy
    # until 5 -> starts 5, bound by its device predecessor op1.
    g = mk([3.0, 5.0, 1.0, 2.0], [0, 1, 0, 1], [(1, 2), (0, 3)])
    s = simulate(g)
    check(s, [0, 0, 5, 5], [3, 5, 6, 7], [-1, -1, 1, 1])
    assert critical_path_indices(s) == [1, 3]


def test_device_binding_wins_a_tie_with_the_input():
    # op2 on d0 needs op1 (d1, 0..2); d0 is busy with op0 until 2 as well: the device
    # predecessor is the binder when both end at the same moment.
    g = mk([2.0, 2.0, 1.0], [0, 1, 0], [(1, 2)])
    s = simulate(g)
    check(s, [0, 0, 2], [2, 2, 3], [-1, -1, 0])


def test_zero_duration_ops():
    # 0 -> 1 -> 2, op0 and op1 take no time.  Everything starts at 0.  Ties between an
    # input and the device go to the device: op2 is bound by op0 (its device predecessor,
    # which also ended at 0), and op1, first on its idle device at time 0, by nothing.
    g = mk([0.0, 0.0, 2.0], [0, 1, 0], [(0, 1), (1, 2)])
    s = simulate(g)
    check(s, [0, 0, 0], [0, 0, 2], [-1, -1, 0])
    assert critical_path_indices(s) == [0, 2]


def test_release_delays_a_start():
    # 0 -> 1; op1 may not start before 10
    g = mk([2.0, 3.0], [0, 1], [(0, 1)])
    s = simulate(g, release=np.array([0.0, 10.0]))
    check(s, [0, 10], [2, 13], [-1, -1])
    assert critical_path_indices(s) == [1]  # starts at its release time
    s = simulate(g, release=np.array([1.0, 0.0]))
    check(s, [1, 3], [3, 6], [-1, 0])
    # a release exactly at the predecessor's end: the predecessor binds
    s = simulate(g, release=np.array([0.0, 2.0]))
    check(s, [0, 2], [2, 5], [-1, 0])


def test_release_on_a_shared_device():
    # op0 released at 5, op1 at 0 on the same device: op1 runs first (0..4), op0 at 5.
    g = mk([1.0, 4.0], [0, 0])
    s = simulate(g, release=np.array([5.0, 0.0]))
    check(s, [5, 0], [6, 4], [-1, -1])
    # released at 3 while op1 runs until 4: the device binds
    s = simulate(g, release=np.array([3.0, 0.0]))
    check(s, [4, 0], [5, 4], [1, -1])


def test_release_accepts_integer_array():
    g = mk([2.0, 3.0], [0, 1], [(0, 1)])
    s = simulate(g, release=np.array([0, 10]))
    check(s, [0, 10], [2, 13], [-1, -1])


def test_subgraph():
    # diamond plus a tail: keep the branch 0 -> 2 -> 3 -> 4 only
    g = mk([1.0, 2.0, 5.0, 1.0, 4.0], [0, 1, 2, 3, 0], [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])
    keep = np.array([True, False, True, True, True])
    sub, old = g.subgraph(keep)
    assert old.tolist() == [0, 2, 3, 4]
    assert sub.names == ["op0", "op2", "op3", "op4"]
    assert sub.dur.tolist() == [1.0, 5.0, 1.0, 4.0]
    assert sub.device.tolist() == [0, 2, 3, 0]
    src, dst = sub.edges()
    assert sorted(zip(src.tolist(), dst.tolist())) == [(0, 1), (1, 2), (2, 3)]
    assert sub.devices == g.devices
    s = simulate(sub)
    check(s, [0, 1, 6, 7], [1, 6, 7, 11], [-1, 0, 1, 2])
    # partial replay: the kept ops released at their times in the full schedule
    full = simulate(g)
    s2 = simulate(sub, release=full.start[old])
    assert s2.start.tolist() == full.start[old].tolist()
    assert s2.end.tolist() == full.end[old].tolist()


def test_duplicate_edges_are_merged():
    g = mk([1.0, 1.0], [0, 1], [(0, 1), (0, 1), (0, 1)])
    assert g.indegree().tolist() == [0, 1]
    check(simulate(g), [0, 1], [1, 2], [-1, 0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("edges", [[(0, 1), (1, 0)], [(0, 0)], [(0, 1), (1, 2), (2, 1)]])
def test_cycle_raises(edges, impl):
    g = mk([1.0, 1.0, 1.0], [0, 1, 0], edges)
    with pytest.raises(DproInputError, match="cycle"):
        impl(g)


def test_graph_builder_gap_is_charged():
    b = GraphBuilder()
    d0 = b.add_device("w0/cpu", owner="w0", is_comm=False)
    d1 = b.add_device("w0/comm", owner="w0", is_comm=True)
    i = b.add_op("a", dur=3.0, gap=1.0, cat="FW", device=d0, prio=0.0)
    j = b.add_op("b", dur=2.0, gap=0.5, cat="COMM", device=d1, prio=4.0)
    b.add_edge(i, j)
    g = b.compile()
    s = simulate(g)
    check(s, [0, 4], [4, 6.5], [-1, 0])
    p = critical_path(g, s)
    assert [(x.name, x.cat, x.device, x.start_us, x.dur_us) for x in p] == [
        ("a", "FW", "w0/cpu", 0.0, 4.0),
        ("b", "COMM", "w0/comm", 4.0, 2.5),
    ]


# ---------------------------------------------------------------- random DAGs


@st.composite
def dags(draw, max_n=24):
    """(graph, release or None, edge list).  Durations are multiples of 1/4 (exact float
    sums), with zeros and ties on purpose; edges go forward in a random topological order."""
    n = draw(st.integers(1, max_n))
    ndev = draw(st.integers(1, 4))
    dur = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    dev = draw(st.lists(st.integers(0, ndev - 1), min_size=n, max_size=n))
    prio = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = [(order[min(a, b)], order[max(a, b)]) for a, b in pairs if a != b]
    release = None
    if draw(st.booleans()):
        release = np.array(draw(st.lists(st.integers(-4, 20), min_size=n, max_size=n)), dtype=float) / 2
    g = mk(np.array(dur, dtype=float) / 4, dev, edges, prio=prio)
    return g, release, sorted(set(edges))


def longest_path_ends(g, edges):
    preds = {}
    for a, b in edges:
        preds.setdefault(b, []).append(a)
    indeg = g.indegree().tolist()
    succ = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    lp = [0.0] * g.n
    stack = [i for i in range(g.n) if indeg[i] == 0]
    while stack:
        i = stack.pop()
        lp[i] = max((lp[p] for p in preds.get(i, [])), default=0.0) + float(g.dur[i])
        for j in succ.get(i, []):
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    return lp


PROP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROP
@given(dags())
def test_properties_of_random_dags(case):
    g, release, edges = case
    s = simulate(g, release)
    start, end, dur = s.start, s.end, g.dur
    rel = np.zeros(g.n) if release is None else release
    assert np.array_equal(end, start + dur)
    assert (start >= rel).all() and (start >= 0).all()
    # every op starts after all its predecessors end
    for a, b in edges:
        assert start[b] >= end[a]
    # ops on one device never overlap
    for d in range(len(g.devices)):
        on = np.flatnonzero(g.device == d)
        iv = sorted(zip(start[on].tolist(), end[on].tolist()))
        for (s0, e0), (s1, e1) in zip(iv, iv[1:]):
            assert s1 >= e0
    mk_ = s.makespan
    # lower bounds: the longest path, the busiest device
    assert mk_ >= max(longest_path_ends(g, edges))
    for d in range(len(g.devices)):
        assert mk_ >= float(dur[g.device == d].sum())
    # upper bound: work-conserving, never idle while something could run
    assert mk_ <= max(0.0, float(rel.max())) + float(dur.sum())
    # determinism
    s2 = simulate(g, None if release is None else release.copy())
    assert np.array_equal(s.start, s2.start) and np.array_equal(s.end, s2.end) and np.array_equal(s.binder, s2.binder)
    # every binder ended exactly when its op started, and is a DFG or device predecessor
    es = set(edges)
    for i in range(g.n):
        b = int(s.binder[i])
        if b >= 0:
            assert end[b] == start[i]
            assert (b, i) in es or g.device[b] == g.device[i]
        else:
            assert start[i] == max(0.0, rel[i])
    # the critical path: a chain from time 0 (or a release) to the makespan
    path = critical_path_indices(s)
    assert path and end[path[-1]] == mk_
    assert start[path[0]] == 0.0 or (release is not None and start[path[0]] == release[path[0]])
    for a, b in zip(path, path[1:]):
        assert start[b] == end[a]
        assert (a, b) in es or g.device[a] == g.device[b]
    assert len(set(path)) == len(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_subgraph_of_random_dag(case, data):
    g, _, edges = case
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=g.n, max_size=g.n)), dtype=bool)
    sub, old = g.subgraph(keep)
    assert old.tolist() == np.flatnonzero(keep).tolist()
    src, dst = sub.edges()
    got = sorted(zip(old[src].tolist(), old[dst].tolist()))
    assert got == sorted((a, b) for a, b in edges if keep[a] and keep[b])
    assert np.array_equal(sub.dur, g.dur[keep]) and np.array_equal(sub.device, g.device[keep])
    simulate(sub)  # a subgraph of a DAG is a DAG


# ---------------------------------------------------------------- exactness vs the reference


def reference_simulate(g, release=None) -> Schedule:
    """Frozen copy of the original straightforward engine (the semantics to keep)."""
    n = g.n
    dur = g.dur.tolist()
    dev = g.device.tolist()
    prio = g.prio.tolist()
    ptr = g.succ_ptr.tolist()
    succ = g.succ_idx.tolist()
    pending = g.indegree().tolist()
    ready = release.astype(float).tolist() if release is not None else [0.0] * n
    binder = [-1] * n
    start = [0.0] * n
    end = [0.0] * n
    ndev = len(g.devices)
    clock = [0.0] * ndev
    last = [-1] * ndev
    queues: list[list] = [[] for _ in range(ndev)]
    key = [float("inf")] * ndev
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    for i in range(n):
        if pending[i] == 0:
            push(queues[dev[i]], (ready[i], prio[i], i))
    for d in range(ndev):
        if queues[d]:
            key[d] = queues[d][0][0]
            push(heap, (key[d], d))
    done = 0
    while heap:
        cs, d = pop(heap)
        if cs != key[d]:
            continue
        q = queues[d]
        c = clock[d]
        top = heap[0][0] if heap else float("inf")
        while True:
            r, _, i = pop(q)
            if c >= r:
                s = c
                binder[i] = last[d]
            else:
                s = r
            e = s + dur[i]
            start[i] = s
            end[i] = e
            c = e
            last[d] = i
            done += 1
            for k in range(ptr[i], ptr[i + 1]):
                j = succ[k]
                if e > ready[j] or binder[j] == -1 and e == ready[j]:
                    ready[j] = e
                    binder[j] = i
                pending[j] -= 1
                if pending[j] == 0:
                    dj = dev[j]
                    qj = queues[dj]
                    push(qj, (ready[j], prio[j], j))
                    if dj != d:
                        cand = ready[j] if ready[j] > clock[dj] else clock[dj]
                        if cand < key[dj]:
                            key[dj] = cand
                            push(heap, (cand, dj))
                            if cand < top:
                                top = cand
            if not q:
                key[d] = float("inf")
                break
            nxt = q[0][0] if q[0][0] > c else c
            if nxt > top:
                key[d] = nxt
                push(heap, (nxt, d))
                break
        clock[d] = c
    if done != n:
        raise DproInputError(None, "cycle")
    return Schedule(np.array(start), np.array(end), np.array(binder, dtype=np.int64))


def same(a: Schedule, b: Schedule) -> bool:
    return (
        a.start.tolist() == b.start.tolist()
        and a.end.tolist() == b.end.tolist()
        and a.binder.tolist() == b.binder.tolist()
        and a.start.dtype == b.start.dtype and a.binder.dtype == b.binder.dtype
    )


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(max_n=40))
def test_matches_reference_exactly(impl, case):
    g, release, _ = case
    assert same(impl(g, release), reference_simulate(g, release))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(4))
def test_matches_reference_on_larger_random_graphs(impl, seed):
    rng = np.random.default_rng(seed)
    n, ndev = 3000, 12
    order = rng.permutation(n)
    a = rng.integers(0, n, 3 * n)
    b = rng.integers(0, n, 3 * n)
    m = a != b
    lo, hi = np.minimum(a[m], b[m]), np.maximum(a[m], b[m])
    keep = hi - lo < 50  # local edges: long chains, deep device queues
    edges = list(zip(order[lo[keep]].tolist(), order[hi[keep]].tolist()))
    dur = rng.integers(0, 5, n) * (rng.random(n) < 0.8) + rng.random(n) * (seed % 2)
    g = mk(dur, rng.integers(0, ndev, n).tolist(), edges, prio=rng.integers(0, 4, n))
    release = None if seed < 2 else rng.integers(0, 30, n).astype(float)
    assert same(impl(g, release), reference_simulate(g, release))


def random_graph(seed: int):
    """A random DAG whose floats are not exact sums: (graph, release or None).

    Ties on purpose (integer durations and prios on some seeds, zero durations, duplicate
    ready times), release times on half the seeds (some negative, some huge), and many
    devices or one, long chains or wide fans."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 1500))
    ndev = int(rng.integers(1, 40))
    order = rng.permutation(n)
    m = int(rng.integers(0, 4 * n + 1))
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = a != b
    if seed % 3 == 0:
        keep &= np.abs(a - b) < 20  # local edges: long chains, deep queues
    lo, hi = np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])
    edges = list(zip(order[lo].tolist(), order[hi].tolist()))
    if seed % 2:
        dur = rng.integers(0, 4, n).astype(float)
        prio = rng.integers(0, 3, n).astype(float)
    else:
        dur = rng.exponential(7.3, n) * (rng.random(n) < 0.85)
        prio = rng.normal(0.0, 1e3, n)
    g = mk(dur, rng.integers(0, ndev, n).tolist(), edges, prio=prio)
    release = None
    if seed % 4 >= 2:
        release = np.where(rng.random(n) < 0.5, 0.0, rng.normal(5.0, 10.0, n))
        release[rng.random(n) < 0.01] = 1e300
    return g, release


@needs_core
@pytest.mark.parametrize("seed", range(60))
def test_compiled_core_is_bit_identical_on_random_graphs(seed):
    g, release = random_graph(seed)
    want = reference_simulate(g, release)
    for got in (engine.simulate_compiled(g, release), engine.simulate_python(g, release)):
        assert same(got, want)
        # bit for bit, signs of zeros included
        assert got.start.view(np.int64).tolist() == want.start.view(np.int64).tolist()
        assert got.end.view(np.int64).tolist() == want.end.view(np.int64).tolist()


@needs_core
def test_both_engines_switch_reports_a_difference(monkeypatch):
    g, _ = random_graph(4)
    monkeypatch.setenv("DPRO_ENGINE", "both")
    s = simulate(g)
    assert same(s, reference_simulate(g))
    real = engine.simulate_python

    def off_by_one_ulp(g, release=None):
        out = real(g, release)
        out.end[-1] = np.nextafter(out.end[-1], np.inf)
        return out

    monkeypatch.setattr(engine, "simulate_python", off_by_one_ulp)
    with pytest.raises(engine.EngineMismatch, match="differ on the end of 1 of"):
        simulate(g)


def test_engine_switch(monkeypatch):
    g, release = random_graph(2)
    want = reference_simulate(g, release)
    monkeypatch.setenv("DPRO_ENGINE", "python")
    assert engine.engine_choice() == "python" and same(simulate(g, release), want)
    monkeypatch.setenv("DPRO_ENGINE", "fastest")
    with pytest.raises(DproInputError, match="DPRO_ENGINE='fastest': expected one of auto, compiled, python, both"):
        simulate(g, release)
    # without the core: the Python engine, and the line says why; forcing the core is an error
    monkeypatch.setattr(engine, "_core", lambda: "not built (No module named 'dpro.replayer._core')")
    monkeypatch.delenv("DPRO_ENGINE")
    assert engine.engine_choice() == "python" and same(simulate(g, release), want)
    assert "python (the compiled core is not built (No module named" in engine.engine_line()
    monkeypatch.setenv("DPRO_ENGINE", "compiled")
    with pytest.raises(DproInputError, match="DPRO_ENGINE=compiled: the compiled replay core is not built"):
        simulate(g, release)


@needs_core
def test_compiled_core_rejects_bad_arrays():
    core = engine._core()
    f, i = np.zeros(2), np.zeros(2, dtype=np.int64)
    ptr = np.array([0, 1, 1], dtype=np.int64)
    out = (np.empty(2, dtype=np.int64), np.empty(2), np.empty(2))
    assert core.simulate(1, f, i, f, ptr, np.array([1]), f, *out) == 2
    assert core.simulate(1, f, i, f, ptr, np.array([1]), None, *out) == 2
    with pytest.raises(ValueError, match="release has 8 bytes, expected 16"):
        core.simulate(1, f, i, f, ptr, np.array([1]), f[:1].copy(), *out)
    with pytest.raises(ValueError, match="successor index out of range"):
        core.simulate(1, f, i, f, ptr, np.array([2]), f, *out)
    with pytest.raises(ValueError, match="device index out of range"):
        core.simulate(1, f, np.array([0, 1]), f, ptr, np.array([1]), f, *out)
    with pytest.raises(ValueError, match="ptr has 16 bytes, expected 24"):
        core.simulate(1, f, i, f, ptr[:2], np.array([1]), f, *out)
    with pytest.raises(TypeError):
        core.simulate(1, f, i, f, ptr, np.array([1]), f, out[0], out[1], f[:1].copy().tobytes())


def _bench():
    return load_script("replay_speed", "benchmarks/replay_speed.py")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("workers,buckets", [(4, 0), (5, 6)])
def test_matches_reference_on_ring_allreduce_graphs(impl, workers, buckets):
    g, _ = _bench().build(workers, buckets)
    s = impl(g)
    assert same(s, reference_simulate(g))
    # the benchmark graph itself is sane: links FIFO, ring steps in order
    path = critical_path_indices(s)
    assert s.end[path[-1]] == s.makespan and s.start[path[0]] == 0.0


def _same_or_same_error(g, release=None, impl=simulate):
    try:
        want = reference_simulate(g, release)
    except Exception as e:  # a cycle; an IndexError for some infinite times
        with pytest.raises(type(e)):
            impl(g, release)
        return
    got = impl(g, release)
    for a, b in ((got.start, want.start), (got.end, want.end)):
        assert np.array_equal(a, b, equal_nan=True)
    assert got.binder.tolist() == want.binder.tolist()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["nan_dur", "inf_dur", "neg_inf_dur", "nan_prio", "inf_release", "inf_release_first",
                                  "nan_release", "neg_release"])
def test_odd_inputs_behave_like_the_reference(case, impl):
    dur = np.array([1.0, 2.0, 0.0, 3.0, 1.0])
    prio = np.array([0.0, 1.0, 0.0, 2.0, 0.0])
    release = None
    if case == "nan_dur":
        dur[1] = np.nan
    elif case == "inf_dur":
        dur[1] = np.inf
    elif case == "neg_inf_dur":  # inf - inf: NaN out of finite input
        dur[1] = np.inf
        dur[2] = -np.inf
    elif case == "nan_prio":
        prio[2] = np.nan
    elif case == "inf_release":
        release = np.array([0.0, 0.0, np.inf, 0.0, np.inf])
    elif case == "inf_release_first":  # the reference fails (ops never run): so must the others
        release = np.array([np.inf, 0.0, 0.0, 0.0, 0.0])
    elif case == "nan_release":
        release = np.array([0.0, np.nan, 0.0, 0.0, 0.0])
    else:
        release = np.array([-3.0, -1.0, 0.0, -2.0, 5.0])
    g = mk(dur, [0, 1, 0, 1, 0], [(0, 1), (1, 2), (0, 3), (3, 4), (2, 4)], prio=prio)
    _same_or_same_error(g, release, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", [2, 3, 7])
def test_infinite_release_times_like_the_reference(seed, impl):
    # the reference itself fails on some (an IndexError: a device comes up with an empty
    # queue); the compiled core must not crash there, but fail or agree the same way
    g, release = random_graph(seed)
    release[np.random.default_rng(seed).random(g.n) < 0.01] = np.inf
    _same_or_same_error(g, release, impl)


def test_replay_says_which_engine(run_cli, kineto_dir, monkeypatch):
    monkeypatch.setenv("DPRO_ENGINE", "python")
    code, out, _ = run_cli("replay", kineto_dir)
    assert code == 0 and out.splitlines()[-1] == "  replay engine: python (DPRO_ENGINE=python)"
    monkeypatch.delenv("DPRO_ENGINE")
    code, out, _ = run_cli("replay", kineto_dir)
    want = "compiled (C core)" if engine.compiled_available() else "python (the compiled core is not built"
    assert code == 0 and out.splitlines()[-1].startswith(f"  replay engine: {want}")
    monkeypatch.setenv("DPRO_ENGINE", "turbo")
    code, out, err = run_cli("replay", kineto_dir)
    assert code == 2 and err.strip().startswith("dpro: error: DPRO_ENGINE='turbo': expected one of")
