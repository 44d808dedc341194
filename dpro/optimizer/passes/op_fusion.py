"""Op fusion: run adjacent computation ops on the critical path as one (Theorems 1 and 3).

Cost model of a fused op (:func:`fused_duration`): **measured** when the recorder timed
the module around the ops eagerly and under ``torch.compile`` (``dpro profile
--measure-compile``): the ops' time (own + host gaps) × compiled / eager of the smallest
such module. Otherwise an estimate: the ops' own times, scaled by ``compute_factor``
(1.0 by default: no arithmetic speed-up is assumed), plus only the first op's host gap —
a fused kernel is dispatched once, so the host gaps between the ops disappear. On eager frameworks these gaps are what fusion mostly saves (dispatch,
Python, kernel launch); the estimate is conservative where a compiler also saves memory
traffic. The strategy lists the fused ops and their layers, to hand to ``torch.compile``
(docs/optimizer.md). Not on TensorFlow jobs: there op fusion is XLA of the whole
gradient computation, weighed apart (:mod:`dpro.optimizer.xla`).
"""

from __future__ import annotations

from collections import defaultdict

from dpro.optimizer.evaluate import sync_time
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.theorems import fused_tensor_gain_after_op_fusion, op_fusion_gain
from dpro.optimizer.worker_graph import KIND_COMP, KIND_IN

FUSIBLE = ("FW", "BW", "UPDATE")


def measured_module(model: JobModel, ops: tuple[str, ...]) -> str | None:
    """The smallest module measured under torch.compile that holds every op of ``ops``."""
    if not model.compile:
        return None
    layers = [model.ops[o].layer or "" for o in ops]
    best = None
    for name in model.compile:
        if all(name == "" or l == name or l.startswith(name + ".") for l in layers):
            if best is None or name.count(".") + (name != "") > best.count(".") + (best != ""):
                best = name
    return best


def enclosing_module(model: JobModel, ops: tuple[str, ...]) -> str:
    """The deepest module that holds every op of ``ops`` (``""``: the model; also where an
    op belongs to no module): compiling it is what can fuse them, not compiling each op's
    own layer apart (a Linear and the ReLU after it are fused by compiling their parent)."""
    paths = [(model.ops[o].layer or "").split(".") if model.ops[o].layer else [] for o in ops]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common) if all(paths) else ""


def outermost(modules: set[str]) -> list[str]:
    """The modules not inside another one of the set (compiling those covers the rest)."""
    def inside(m: str, a: str) -> bool:
        return a == "" or m.startswith(a + ".")
    return sorted(m for m in modules if not any(a != m and inside(m, a) for a in modules))


def fused_duration(model: JobModel, ops: tuple[str, ...], compute_factor: float = 1.0) -> float:
    """Estimated duration (µs) of ``ops`` run as one (see the module docstring)."""
    mod = measured_module(model, ops)
    if mod is not None:
        m = model.compile[mod]  # type: ignore[index]
        return m["compiled_us"] / m["eager_us"] * sum(model.ops[o].dur + model.ops[o].gap for o in ops)
    return model.ops[ops[0]].gap + compute_factor * sum(model.ops[o].dur for o in ops)


def _node_dur(model: JobModel, st: Strategy, ops: tuple[str, ...]) -> float:
    f = st.fusion_of(ops[0])
    return f.dur if f is not None and f.ops == ops else sum(model.ops[o].dur + model.ops[o].gap for o in ops)


class OpFusion(GraphPass):
    """Fuse adjacent computation ops on the critical path when Theorem 1 holds (+ their syncs, Theorem 3)."""

    name = "op_fusion"

    def __init__(self, compute_factor: float = 1.0) -> None:
        self.compute_factor = compute_factor

    def _links(self, model: JobModel) -> tuple[dict[str, list[str]], dict[str, list[str]], set[str]]:
        succ: dict[str, list[str]] = defaultdict(list)
        pred: dict[str, list[str]] = defaultdict(list)
        for a, b in model.edges:
            succ[a].append(b)
            pred[b].append(a)
        waits = {c for u in model.units for c in u.consumers}
        return succ, pred, waits

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        """Adjacent single-edge chains of computation ops on the critical path where Theorem 1 gains."""
        m, st, a = ctx.model, ctx.strategy, ctx.analysis
        if m.framework == "tensorflow":  # no helper compiles a TF region: XLA of it all (dpro.optimizer.xla)
            return []
        b = a.built
        succ, pred, waits = self._links(m)
        in_node = {int(b.group[i]): i for i in range(b.graph.n) if b.kind[i] == KIND_IN}
        out = []
        path = a.critical
        for x, y in zip(path, path[1:]):
            if b.kind[x] != KIND_COMP or b.kind[y] != KIND_COMP or b.graph.device[x] != b.graph.device[y]:
                continue
            ox, oy = b.ops[x], b.ops[y]
            last, first = ox[-1], oy[0]
            if succ[last] != [first] or pred[first] != [last] or first in waits:
                continue
            cx, cy = m.ops[last].cat, m.ops[first].cat
            if cx != cy or cx not in FUSIBLE:
                continue
            chain = ox + oy
            t_x, t_y = _node_dur(m, st, ox), _node_dur(m, st, oy)
            t_xy = fused_duration(m, chain, self.compute_factor)
            delays = [(t_xy - t_x, float(a.slack[in_node[st.group_of(ui)]]))
                      for ui, u in enumerate(m.units) if set(u.ready) & set(ox)]
            gain = op_fusion_gain(t_x, t_y, t_xy, delays)
            if gain > 1e-9:
                out.append(Candidate(self.name, ("fuse", chain), (
                    f"Theorem 1: {last} -> {first} on the critical path, {t_x / 1e3:.3f} + {t_y / 1e3:.3f} ms "
                    f"run as one in {t_xy / 1e3:.3f} ms; delayed syncs within their slack"), gain))
        return out

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        """The chain fused, then its gradients' adjacent groups merged while Theorem 3 gains."""
        m = ctx.model
        chain = cand.target[1]
        st = ctx.strategy.with_fusion(chain, fused_duration(m, chain, self.compute_factor))
        # Theorem 3: gradients of the fused ops are now ready together; fuse their syncs.
        groups = sorted({st.group_of(ui) for ui, u in enumerate(m.units) if set(u.ready) & set(chain)})
        while len(groups) > 1 and groups[1] == groups[0] + 1:
            g = groups[0]
            s1, s2 = st.group_bytes(m, g), st.group_bytes(m, g + 1)
            gain = fused_tensor_gain_after_op_fusion(sync_time(m, s1, st.partitions[g]),
                                                     sync_time(m, s2, st.partitions[g + 1]),
                                                     sync_time(m, s1 + s2, max(st.partitions[g], st.partitions[g + 1])))
            if gain <= 0:
                break
            st = st.merge_groups(g)
            groups = [g] + [x - 1 for x in groups[2:]]
        return st
