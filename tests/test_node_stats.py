"""dpro.graph.stats.node_stats (vectorised over the ops) against the per-op definition, bit for bit."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from dpro.gtrace.schema import Event, NodeInfo, NodeTrace, Op
from dpro.graph.stats import node_stats, typical_steps
from dpro.loader import open_trace

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def reference(nt: NodeTrace, steps: list[int] | None = None) -> dict[str, tuple]:
    """The definition, one op at a time (the implementation before it was vectorised)."""
    use = set(steps) if steps else set(nt.steps)
    ev = {(e.op, e.step): (e.ts, e.ts + e.dur) for e in nt.events if e.step in use}
    preds: dict[str, list[str]] = {}
    for a, b in nt.edges:
        preds.setdefault(b, []).append(a)
    out = {}
    for op in nt.ops:
        samples = {}
        for s in use:
            if (x := ev.get((op, s))) is None:
                continue
            p = [ev[(q, s)][1] for q in preds.get(op, ()) if (q, s) in ev]
            samples[s] = (x[0], x[1], max(p) if p else nt.steps[s][0] if s in nt.steps else x[0])
        if not samples:
            out[op] = (0.0, 0.0, 0.0, {})
            continue
        arr = np.array(list(samples.values()))
        ts, end, P = arr[:, 0], arr[:, 1], arr[:, 2]
        starts = np.array([nt.steps[s][0] if s in nt.steps else 0.0 for s in samples])
        out[op] = (float(np.mean(np.maximum(0.0, end - np.maximum(ts, P)))), float(np.mean(np.maximum(0.0, ts - P))),
                   float(np.median(ts - starts)), samples)
    return out


def same(nt: NodeTrace, steps: list[int] | None) -> None:
    got, want = node_stats(nt, steps), reference(nt, steps)
    assert list(got) == list(want)
    for op, st in got.items():
        assert (st.dur, st.gap, st.offset) == want[op][:3], op  # exact, not approx
        assert list(st.samples.items()) == list(want[op][3].items()), op


def test_bundled_trace_bit_identical():
    gt = open_trace(EXAMPLE, cache=False, progress=False)
    steps = typical_steps(list(gt.nodes.values()), gt.manifest.steps)
    for nt in gt.nodes.values():
        same(nt, steps)
        same(nt, None)


@pytest.mark.parametrize("seed", range(4))
def test_random_nodes_bit_identical(seed: int):
    """Ops with different sample counts (1 to 40 steps, some missing), chains and fan-ins."""
    rng = random.Random(seed)
    n_steps = rng.choice([1, 2, 7, 9, 17, 40])
    steps = {s: (s * 1000.0 + rng.random(), 900.0) for s in range(n_steps)}
    ops = {f"op{i}": Op(f"op{i}", f"op{i}", "FW", "cpu:0") for i in range(60)}
    edges = [(f"op{rng.randrange(i)}", f"op{i}") for i in range(1, 60) for _ in range(rng.randint(0, 3))]
    events = [Event(op, s, steps[s][0] + rng.uniform(-5, 800), rng.uniform(0, 50))
              for op in ops for s in steps if rng.random() < 0.8]
    nt = NodeTrace(NodeInfo("w0", "worker", 0, "h"), ops, edges, events, steps)
    same(nt, None)
    same(nt, sorted(rng.sample(range(n_steps), max(1, n_steps // 2))) + [n_steps + 5])
    same(nt, [rng.randrange(n_steps)])  # one step: its own path, ops without an event in it included
    nt.edges.append(("op3", "ghost"))  # an edge to an op of neither the DFG nor the events: left out
    same(nt, None)
    same(nt, [0])


def test_stalled_steps_are_named_in_the_replay_notes():
    """A step in which one rank took 5x its time is left out, and the replay says which."""
    from dpro.graph.stats import stalled_steps
    from dpro.replayer.replay import replay_on_one_clock

    gt = open_trace(Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp")
    steps = list(gt.manifest.steps)
    nt = next(iter(gt.nodes.values()))
    t0, dur = nt.steps[steps[1]]
    nt.steps[steps[1]] = (t0, 5 * dur)
    assert stalled_steps(list(gt.nodes.values()), steps) == [steps[1]]
    res = replay_on_one_clock(gt)
    assert steps[1] not in res.steps
    assert any(n.startswith(f"steps [{steps[1]}] left out as stalls") for n in res.notes)


def test_duplicate_events_and_events_outside_the_dfg():
    """Two events of one op in one step (the last counts: the per-op way) and events of an op
    that is not in the DFG (still a predecessor's end) give the definition's results too."""
    rng = random.Random(7)
    steps = {s: (s * 1000.0, 900.0) for s in range(6)}
    ops = {f"op{i}": Op(f"op{i}", f"op{i}", "FW", "cpu:0") for i in range(20)}
    edges = [(f"op{rng.randrange(i)}", f"op{i}") for i in range(1, 20)] + [("ghost", "op5"), ("op3", "ghost")]
    events = [Event(op, s, steps[s][0] + rng.uniform(0, 800), rng.uniform(0, 50)) for op in ops for s in steps]
    events += [Event("ghost", s, steps[s][0] + 850.0, 1.0) for s in steps]
    nt = NodeTrace(NodeInfo("w0", "worker", 0, "h"), ops, edges, events, steps)
    same(nt, None)
    same(nt, [1, 2, 3, 4])  # even counts: the median of the two middle values
    nt.events.append(Event("op4", 2, 2100.0, 3.0))  # op4 twice in step 2
    same(nt, None)


def test_median_rows_is_numpy_median():
    rng = np.random.default_rng(0)
    from dpro.graph.stats import _median, _median_rows

    for k in range(1, 12):
        a = rng.normal(size=(5, k)) * 1e6
        assert (_median_rows(a) == np.median(a, axis=1)).all()
        assert all(_median(list(r)) == float(np.median(r)) for r in a)
