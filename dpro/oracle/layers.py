"""The oracle's input: the model's layers, their shapes and profiled times, from a Job.

A layer is a leaf module that ran forward ops in the trace (dpro's recorder annotates
each module's forward, ``dpro.layer::<path>``; its backward ops inherit the layer). Per
layer, over the job's typical steps and averaged over the workers:

* ``fw_us``/``bw_us``: the own time of its forward/backward ops (what the replayer charges,
  dpro/graph/stats.py) split into a part per call (the host gaps before the ops) and a
  part per sample (the rest, divided by the profiled per-device batch);
* ``wu_us``: the optimizer step's time, shared between the layers by weight bytes;
* shapes from ``record_shapes`` (``NodeTrace.meta["layer_shapes"]``): input (C, H, W),
  output channels F, kernel, stride; sizes in bytes per sample, weights from the trace's
  parameter list (else from the recorded weight shape).

With dpro's recorder's overhead measured (the steps after the window), each worker's
times are scaled by its own, by the function ``dpro replay`` uses to predict the
unprofiled job (:func:`dpro.graph.overhead.stats_without_overhead`). Forward/backward ops outside any layer (the loss, autograd glue) form the pseudo-layer
``(rest)``, run by every rank on its whole batch. OTHER ops (step markers, zero_grad...)
are a fixed ``overhead_us`` per iteration.

From one profile a layer's op time is taken **proportional** to the per-device batch (only
the host gaps are per call). From profiles at two or more per-device batches
(:func:`affine_profile`) each layer's forward and backward time per call is fitted as
**affine**, a + b·batch (least squares): b is its time per sample, a its fixed time per
call (host gaps and the ops' own fixed cost, which does not shrink with the batch;
benchmarks/oracle/batch_scaling.py measures it on the reference CNN, docs/oracle.md),
**guarded**: only where both parts stand out of the spread of the repeated profiles at
each batch (:func:`guard`); elsewhere the layer keeps the first profile's proportional times.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field, replace
from statistics import mean, median
from typing import TYPE_CHECKING

from dpro.errors import DproInputError
from dpro.graph.overhead import stats_without_overhead

if TYPE_CHECKING:
    from dpro.job import Job

#: key of the per-layer input shapes in NodeTrace.meta (dpro/importers/kineto/shapes.py)
LAYER_SHAPES = "layer_shapes"
#: kinds: weights sliced by filter/channel parallelism; per-channel ops (filter parallelism
#: runs them on its slice); everything else (replicated under filter/channel parallelism)
WEIGHTED, CHANNELWISE, OTHER = "weighted", "channelwise", "other"
_WEIGHTED_OPS = ("conv", "linear", "addmm", "matmul")
_CHANNELWISE_OPS = ("relu", "pool", "batch_norm", "gelu", "sigmoid", "tanh", "dropout", "silu", "leaky_relu")
#: how a layer's op time follows the per-device batch (ModelProfile.rule)
PROPORTIONAL, AFFINE = "proportional", "affine"
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "half": 2, "bfloat16": 2, "float16": 2}
NEEDS = ("the oracle needs per-layer annotations and shapes: record with dpro's recorder "
         "(dpro.Recorder(model), which annotates each module) under `dpro profile --shapes --memory`")


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer: times (µs) and sizes (bytes) as the formulas use them (docs/oracle.md)."""

    name: str
    kind: str
    #: forward / backward µs per sample, and per call (independent of the batch)
    fw_us: float
    bw_us: float
    fw_call_us: float = 0.0
    bw_call_us: float = 0.0
    #: weight update µs per iteration
    wu_us: float = 0.0
    #: input / output bytes per sample, weight (+bias) bytes
    x_bytes: int = 0
    y_bytes: int = 0
    w_bytes: int = 0
    #: input channels (features), output channels (filters), input height, width, kernel height
    channels: int = 1
    filters: int = 1
    height: int = 1
    width: int = 1
    kernel: int = 1
    dtype_bytes: int = 4

    @property
    def spatial(self) -> bool:
        """Has a height to split (4-D activations)."""
        return self.height > 1

    def halo_bytes(self) -> int:
        """Rows a neighbour needs before this layer per sample (kernel // 2 rows of the input)."""
        return (self.kernel // 2) * self.width * self.channels * self.dtype_bytes if self.kind == WEIGHTED and self.spatial else 0


@dataclass
class ModelProfile:
    """The layers in forward order, the profiled per-device batch, the fixed overhead."""

    layers: list[Layer]
    batch: int
    overhead_us: float = 0.0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: PROPORTIONAL (one profile) or AFFINE (fitted on the profiles at ``batches``)
    rule: str = PROPORTIONAL
    #: the per-device batches of the profiles the times come from
    batches: list[int] = field(default_factory=list)
    #: AFFINE: the rule each layer got (the guard, :func:`guard`), and the guard's figures
    layer_rules: dict[str, str] = field(default_factory=dict)
    guards: dict[str, Guard] = field(default_factory=dict)

    @property
    def weighted(self) -> list[Layer]:
        return [lay for lay in self.layers if lay.kind == WEIGHTED]

    def weight_bytes(self) -> int:
        return sum(lay.w_bytes for lay in self.layers)


def _kind(op: str) -> str:
    base = op.split("::")[-1].lower()
    if any(k in base for k in _WEIGHTED_OPS):
        return WEIGHTED
    if any(k in base for k in _CHANNELWISE_OPS):
        return CHANNELWISE
    return OTHER


def _ints(text: object) -> list[int]:
    try:
        v = ast.literal_eval(str(text)) if text not in ("", None) else []
    except (ValueError, SyntaxError):
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] if isinstance(v, int) else []


def _numel(dims: list[int]) -> int:
    return math.prod(dims) if dims else 0


def _batch(shapes: dict[str, dict]) -> int:
    """The profiled per-device batch: the most common leading dimension of the layers'
    first inputs (an embedding's first input is its table, not the batch)."""
    from collections import Counter

    lead = Counter(int(s["dims"][0][0]) for s in shapes.values()
                   if s.get("dims") and isinstance(s["dims"][0], list) and len(s["dims"][0]) >= 2)
    return lead.most_common(1)[0][0] if lead else 0


def _shape_fields(info: dict, batch: int) -> dict:
    """Layer fields from one layer's first op's recorded shapes (its input: the first
    tensor whose leading dimension is the batch)."""
    dims = [d for d in (info.get("dims") or []) if isinstance(d, list)]
    x = next(([int(v) for v in d] for d in dims if d and d[0] == batch), [int(v) for v in dims[0]] if dims else [])
    types = info.get("types") or ["float"]
    dt = DTYPE_BYTES.get(str(types[0]).lower(), 4)
    kind = _kind(str(info.get("op", "")))
    per_sample = x[1:]
    out = {"kind": kind, "dtype_bytes": dt, "x_bytes": _numel(per_sample) * dt}
    if len(per_sample) >= 3:
        out.update(channels=per_sample[0], height=per_sample[1], width=per_sample[2])
    elif per_sample:
        out.update(channels=per_sample[-1])
    w = [int(v) for v in dims[1]] if kind == WEIGHTED and len(dims) > 1 and isinstance(dims[1], list) else []
    if kind == WEIGHTED and w:
        out["filters"] = w[0]
        out["w_bytes"] = (_numel(w) + (w[0] if len(dims) > 2 and dims[2] else 0)) * dt
        if len(w) >= 3:
            out["kernel"] = w[2]
            conc = info.get("concrete") or []
            stride = (_ints(conc[3]) if len(conc) > 3 else []) or [1]
            pad = (_ints(conc[4]) if len(conc) > 4 else []) or [0]
            h = (x[2] + 2 * pad[0] - w[2]) // stride[0] + 1
            wd = (x[3] + 2 * pad[-1] - w[3]) // stride[-1] + 1 if len(x) > 3 and len(w) > 3 else 1
            out["y_bytes"] = w[0] * h * wd * dt
        else:
            out["y_bytes"] = w[0] * dt
    else:
        out["filters"] = out.get("channels", 1)
    return out


def model_profile(job: Job) -> ModelProfile:
    """The layers of ``job`` (one worker is enough; the workers' times are averaged).

    Raises DproInputError when the trace has no layer annotations or no recorded shapes.
    """
    where = job.path or job.trace.source or "trace"
    workers = [nt for nt in job.trace.workers()]
    shapes = next((nt.meta.get(LAYER_SHAPES) for nt in workers if nt.meta.get(LAYER_SHAPES)), None)
    annotated = any(op.layer for nt in workers for op in nt.ops.values() if op.cat == "FW")
    if not annotated:
        raise DproInputError(where, f"no layer annotations in the trace; {NEEDS}")
    if not shapes:
        raise DproInputError(where, f"no recorded layer shapes in the trace; {NEEDS}")
    batch = _batch(shapes)
    if batch <= 0:
        raise DproInputError(where, f"cannot tell the profiled batch from the recorded shapes; {NEEDS}")
    # each worker's recorder overhead taken out of its ops, as `dpro replay` predicts the
    # unprofiled job (one shared function: dpro/graph/overhead.py)
    stats, ov_notes = stats_without_overhead(job.trace, job.stats)
    # per worker: layer -> [fw dur, fw gap, bw dur, bw gap], in forward order
    per: list[dict[str, list[float]]] = []
    order: dict[str, float] = {}
    wu, overhead = [], []
    for nt in workers:
        st = stats.get(nt.info.name, {})
        acc: dict[str, list[float]] = {}
        u = o = 0.0
        for op in nt.ops.values():
            s = st.get(op.id)
            if s is None or op.cat == "COMM":
                continue
            if op.cat in ("FW", "BW"):
                name = op.layer or "(rest)"
                a = acc.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                k = 0 if op.cat == "FW" else 2
                a[k] += s.dur
                a[k + 1] += s.gap
                if op.cat == "FW" and op.layer:
                    order[name] = min(order.get(name, math.inf), s.offset)
            elif op.cat == "UPDATE":
                u += s.dur + s.gap
            else:
                o += s.dur + s.gap
        per.append(acc)
        wu.append(u)
        overhead.append(o)
    params: dict[str, int] = {}
    for nt in workers[:1]:
        for t in nt.tensors:
            params[t.name.rsplit(".", 1)[0]] = params.get(t.name.rsplit(".", 1)[0], 0) + t.bytes
    names = sorted((n for n in order if n in shapes), key=lambda n: order[n])
    missing = sorted(n for n in order if n not in shapes)
    notes = [f"layers without recorded shapes, counted with (rest): {', '.join(missing)}"] if missing else []
    notes += [f"layer times without the recorder's overhead: {n}" for n in ov_notes]
    fields = {n: _shape_fields(shapes[n], batch) for n in names}
    for i, n in enumerate(names):  # a layer's output is the next layer's input
        f = fields[n]
        if i + 1 < len(names):
            f["y_bytes"] = fields[names[i + 1]]["x_bytes"]
        f.setdefault("y_bytes", f["x_bytes"])
        if n in params:
            f["w_bytes"] = params[n]
    total_w = sum(f.get("w_bytes", 0) for f in fields.values()) or 1
    wu_total = mean(wu) if wu else 0.0

    def avg(name: str, k: int) -> float:
        return mean([sum(p[m][k] for m in p if m == name or (name == "(rest)" and m in missing)) for p in per])

    layers = [Layer(name=n, fw_us=avg(n, 0) / batch, fw_call_us=avg(n, 1), bw_us=avg(n, 2) / batch, bw_call_us=avg(n, 3),
                    wu_us=wu_total * fields[n].get("w_bytes", 0) / total_w, **fields[n]) for n in names]
    rest = Layer(name="(rest)", kind=OTHER, fw_us=avg("(rest)", 0) / batch, fw_call_us=avg("(rest)", 1),
                 bw_us=avg("(rest)", 2) / batch, bw_call_us=avg("(rest)", 3))
    if rest.fw_us or rest.bw_us or rest.fw_call_us or rest.bw_call_us:
        layers.append(rest)
    return ModelProfile(layers=layers, batch=batch, overhead_us=mean(overhead) if overhead else 0.0,
                        source=str(where), notes=notes, batches=[batch])


#: the fields two profiles of one model must agree on (shapes and kinds, not times)
_SHAPE = ("kind", "x_bytes", "y_bytes", "w_bytes", "channels", "filters", "height", "width", "kernel", "dtype_bytes")


def _fit(points: list[tuple[int, float]]) -> tuple[float, float, bool]:
    """(a, b, clamped) of the least-squares t = a + b·n through the median t of each batch
    n of ``points`` (n, t: repeated profiles at one batch give one point, their median); a
    negative slope (noise on a batch-independent time) gives b = 0, a = mean t; a negative
    intercept gives the proportional fit through 0 (a = 0)."""
    med = _medians(points)
    a, b = _line(med)
    if b < 0:
        return mean(t for _, t in med), 0.0, True
    if a < 0:
        return 0.0, sum(n * t for n, t in med) / sum(n * n for n, _ in med), True
    return a, b, False


def _medians(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """One point per batch: the median of its repeated times, in batch order."""
    by: dict[int, list[float]] = {}
    for n, t in points:
        by.setdefault(n, []).append(t)
    return [(n, median(ts)) for n, ts in sorted(by.items())]


def _weights(ns: list[int]) -> tuple[list[float], list[float]]:
    """The weights of the least-squares line through one point per batch ``ns``: a = Σ wa_k t_k,
    b = Σ wb_k t_k."""
    n0 = mean(ns)
    var = sum((n - n0) ** 2 for n in ns)
    wb = [(n - n0) / var for n in ns]
    return [1 / len(ns) - n0 * w for w in wb], wb


def _line(med: list[tuple[int, float]]) -> tuple[float, float]:
    wa, wb = _weights([n for n, _ in med])
    return sum(w * t for w, (_, t) in zip(wa, med)), sum(w * t for w, (_, t) in zip(wb, med))


@dataclass(frozen=True, slots=True)
class Guard:
    """Whether the launches support a layer's affine fit: its time per call (forward +
    backward) a + b·batch through the median of each batch's repeated profiles, and the
    uncertainty of a and b, the spread (max − min) of each batch's repeats propagated
    through the fit's weights, u = sqrt(Σ w_k² spread_k²) (docs/oracle.md)."""

    a_us: float
    b_us: float
    u_a_us: float
    u_b_us: float

    @property
    def supported(self) -> bool:
        """Both the fixed and the per-sample part stand out of the repeats' spread."""
        return self.a_us > self.u_a_us and self.b_us > self.u_b_us


def guard(points: list[tuple[int, float]]) -> Guard:
    """The :class:`Guard` of a layer's per-call times ``points`` (batch, µs), repeats included."""
    by: dict[int, list[float]] = {}
    for n, t in points:
        by.setdefault(n, []).append(t)
    med = _medians(points)
    wa, wb = _weights([n for n, _ in med])
    spread = [max(by[n]) - min(by[n]) for n, _ in med]
    a, b = _line(med)
    return Guard(a, b, math.sqrt(sum((w * s) ** 2 for w, s in zip(wa, spread))),
                 math.sqrt(sum((w * s) ** 2 for w, s in zip(wb, spread))))


def affine_profile(profiles: list[ModelProfile]) -> ModelProfile:
    """One model from profiles of it at different per-device batches (repeats at one batch
    welcome): each layer's forward and backward time per call fitted as a + b·batch through
    each batch's median (``fw_us``/``bw_us`` = b per sample, ``fw_call_us``/``bw_call_us`` =
    a per call) where the launches support it (:func:`guard`: both parts of the layer's
    forward + backward fit above the spread of the repeats), else the first profile's
    times (the proportional rule); the rule of each layer in ``layer_rules``. The weight
    update and the per-iteration overhead (independent of the batch) averaged; shapes, the
    profiled batch and the source from the first profile.

    Raises DproInputError when fewer than two distinct batches are given or when the
    profiles are not of one model (other layers or shapes).
    """
    base = profiles[0]
    if len(profiles) < 2:
        return base
    if len({m.batch for m in profiles}) < 2:
        raise DproInputError(profiles[1].source, f"profiled at the same per-device batch ({profiles[1].batch}) as "
                             f"{base.source}: the affine rule needs profiles at two different batches")
    ref = {x.name: x for x in base.layers if x.name != "(rest)"}
    for m in profiles[1:]:
        got = {x.name: x for x in m.layers if x.name != "(rest)"}
        if list(got) != list(ref):
            diff = sorted(set(got) ^ set(ref)) or ["the layer order"]
            raise DproInputError(m.source, f"not the model of {base.source}: its layers differ ({', '.join(diff[:3])})")
        for n, x in got.items():
            bad = next((f for f in _SHAPE if getattr(x, f) != getattr(ref[n], f)), None)
            if bad:
                raise DproInputError(m.source, f"not the model of {base.source}: layer {n} has {bad} "
                                     f"{getattr(x, bad)}, not {getattr(ref[n], bad)}")
    by = [{x.name: x for x in m.layers} for m in profiles]
    zero = Layer("(rest)", OTHER, 0.0, 0.0)
    layers, clamped, rules, guards = [], [], {}, {}
    for lay in base.layers:
        per = [(m.batch, d.get(lay.name, zero)) for m, d in zip(profiles, by)]
        wu = mean(x.wu_us for _, x in per)
        g = guards[lay.name] = guard([(n, (x.fw_us + x.bw_us) * n + x.fw_call_us + x.bw_call_us) for n, x in per])
        if not g.supported:  # the launches do not resolve both parts: the first profile's times, proportional
            rules[lay.name] = PROPORTIONAL
            layers.append(replace(lay, wu_us=wu))
            continue
        rules[lay.name] = AFFINE
        fa, fb, c1 = _fit([(n, x.fw_us * n + x.fw_call_us) for n, x in per])
        ba, bb, c2 = _fit([(n, x.bw_us * n + x.bw_call_us) for n, x in per])
        if c1 or c2:
            clamped.append(lay.name)
        layers.append(replace(lay, fw_us=fb, fw_call_us=fa, bw_us=bb, bw_call_us=ba, wu_us=wu))
    batches = [m.batch for m in profiles]
    repeats = len(batches) > len(set(batches))
    notes = base.notes + [f"{m.source}: {n}" for m in profiles[1:] for n in m.notes]
    notes.append(f"affine rule: each layer's time per call fitted as a + b x batch on {len(profiles)} profiles at "
                 f"{', '.join(map(str, batches))} samples per device ({', '.join(m.source for m in profiles)}), "
                 "through each batch's median")
    aff = [n for n, r in rules.items() if r == AFFINE]
    prop = [n for n, r in rules.items() if r == PROPORTIONAL]
    how = ("its fixed or per-sample part not above the spread of the repeated profiles at a batch, propagated "
           "through the fit" if repeats else "a negative fixed or per-sample part; no repeated profiles at one "
           "batch, so the fit's noise is not known")
    notes.append(f"guarded: affine for {', '.join(aff) or 'no layer'}; proportional (the first profile's times) for "
                 f"{', '.join(prop) or 'no layer'} ({how})")
    if clamped:
        notes.append(f"affine fit clamped (a negative slope or intercept, i.e. noise) for: {', '.join(clamped)}")
    return ModelProfile(layers=layers, batch=base.batch, overhead_us=mean(m.overhead_us for m in profiles),
                        source=base.source, notes=notes, rule=AFFINE, batches=batches, layer_rules=rules,
                        guards=guards)
