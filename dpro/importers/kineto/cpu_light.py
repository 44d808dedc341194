"""The light steps of a CPU-light recording (``DPRO_CPU_LIGHT``) onto its structure step.

The recorder's CPU-light mode (:mod:`dpro.profiler.pytorch.anchors`) records the window's first
step with torch.profiler (``rank<r>.json.gz``: the structure, imported as usual into one step's
DFG) and times the other steps by hooks alone (the meta's ``cpu_light``): per light step the
step's call, each layer's forward, each DDP bucket's hook, and ``comm#k``, the k-th bucket's
all-reduce from its hook to its completion. This module gives each light step the structure
step's ops with the light step's timing:

* **anchors**: the same names in the structure step: the step's span, the layer ranges
  (``dpro.layer::``), bucket ranges (``dpro.bucket::``) and optimizer steps
  (``Optimizer.step#``) of the trace, and the k-th
  all-reduce of the step (its end: the hook's call is not when the collective started). The
  k-th range of a name in a light step pairs with the k-th of that name in the structure
  step; a name whose count differs is the reason the steps do not match (the light step ran
  other layers), except the all-reduces, which are then left out of the anchors;
* **time**: a monotone piecewise-linear map per light step (start and end of each anchor),
  as :mod:`dpro.importers.kineto.light` does with the runtime calls; an operator between two
  anchors is scaled to fill the interval the light step measured. Backward operators have no
  anchor of their own: they are placed between the last layer's forward and the bucket hooks
  or the optimizer's step.
  The hooks' clock is put on the trace's by the Unix time both record.

Where anything does not match the caller keeps the structure step alone, with one reason.
"""

from __future__ import annotations

from collections import defaultdict

from dpro.contracts.recording import BUCKET_PREFIX, LAYER_PREFIX, OPTIMIZER_STEP_PREFIX
from dpro.gtrace.schema import NodeTrace
from dpro.importers.kineto.light import TimeMap, monotone, retime_steps
from dpro.importers.kineto.read import RankFile

#: a light step's anchors: name -> [(start µs, end µs)] in order
Anchors = dict[str, list[tuple[float, float]]]
_COMM = "comm#"


def structure_anchors(nt: NodeTrace, rf: RankFile, st: int) -> Anchors:
    """The structure step's anchors (module doc), on the trace's clock."""
    t0, dur = nt.steps[st]
    out: Anchors = defaultdict(list)
    out["step"].append((t0, t0 + dur))
    for e in sorted(rf.events, key=lambda e: e.ts):
        if t0 <= e.ts < t0 + dur and e.name.startswith((LAYER_PREFIX, BUCKET_PREFIX, OPTIMIZER_STEP_PREFIX)):
            out[e.name].append((e.ts, e.ts + e.dur))
    comm = sorted((e for e in nt.events if e.step == st and nt.ops[e.op].cat == "COMM"
                   and "all_reduce" in nt.ops[e.op].name.replace("allreduce", "all_reduce")), key=lambda e: e.ts)
    for k, e in enumerate(comm):
        out[f"{_COMM}{k}"].append((e.ts, e.ts + e.dur))
    return dict(out)


def parse_anchors(raw: object, shift: float) -> Anchors | str:
    """One light step's anchors from the meta (``[[name, start, end], ...]``), shifted by
    ``shift`` µs onto the trace's clock; or why they are not anchors."""
    if not isinstance(raw, list):
        return "a light step's anchors are not a list"
    out: Anchors = defaultdict(list)
    for a in raw:
        if not (isinstance(a, list) and len(a) == 3 and isinstance(a[0], str)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in a[1:]) and a[1] <= a[2]):
            return f"anchor {str(a)[:60]} is not [name, start, end]"
        out[a[0]].append((float(a[1]) + shift, float(a[2]) + shift))
    for v in out.values():
        v.sort()
    return dict(out)


def step_map(struct: Anchors, light: Anchors) -> tuple[TimeMap, int, bool] | str:
    """The map of the structure step's time onto a light step's, how many anchors were left
    out to keep it monotone, and whether the all-reduces were anchors; or why the step does not match."""
    names = {n for n in struct if not n.startswith(_COMM)} | {n for n in light if not n.startswith(_COMM)}
    for n in sorted(names):
        if len(struct.get(n, ())) != len(light.get(n, ())):
            return (f"{n} ran {len(light.get(n, ()))} time(s) in a light step, {len(struct.get(n, ()))} in the "
                    f"structure step")
    if "step" not in struct or "step" not in light:
        return "no step span"
    sc = sorted(n for n in struct if n.startswith(_COMM))
    lc = sorted(n for n in light if n.startswith(_COMM))
    comm = sc == lc
    pairs: list[tuple[float, float]] = []
    for n in names:
        for (a, b), (c, d) in zip(struct[n], light[n]):
            pairs += [(a, c), (b, d)]
    if comm:  # the all-reduce's end only
        pairs += [(struct[n][0][1], light[n][0][1]) for n in sc]
    xs, ys, dropped = monotone(pairs)
    return TimeMap(xs, ys), dropped, comm


def apply_cpu_light(nt: NodeTrace, rf: RankFile, info: dict) -> str:
    """Replace ``nt``'s structure step by its light steps (``info``: the meta's ``cpu_light``);
    returns the note. Raises ValueError with the reason where they do not match (``nt`` is
    then unchanged)."""
    st, numbers, raw = info.get("structure_step"), info.get("steps"), info.get("anchors")
    offset, base = info.get("unix_minus_clock_us"), rf.meta.get("baseTimeNanoseconds")
    if not (isinstance(st, int) and isinstance(numbers, list) and isinstance(raw, list) and numbers
            and len(numbers) == len(raw) and all(isinstance(x, int) and not isinstance(x, bool) for x in numbers)):
        raise ValueError("'cpu_light' in its meta.json is not {structure_step, steps, anchors} of one length")
    if not isinstance(offset, (int, float)) or not isinstance(base, (int, float)):
        raise ValueError("no clock to put the light steps on the trace's (unix_minus_clock_us, baseTimeNanoseconds)")
    if st not in nt.steps:
        raise ValueError(f"the structure step {st} is not among the imported steps {sorted(nt.steps)}")
    struct = structure_anchors(nt, rf, st)
    shift = float(offset) - float(base) / 1e3
    maps: list[TimeMap] = []
    dropped, no_comm = 0, 0
    last = ""
    for k, r in enumerate(raw):
        light = parse_anchors(r, shift)
        got = light if isinstance(light, str) else step_map(struct, light)
        if isinstance(got, str):
            if k == len(raw) - 1 and k > 0:  # the job failed in it (the recorder ends the step it raised in)
                last = f"; light step {numbers[k]} left out, the window's last ({got}: cut short?)"
                numbers = numbers[:k]
                break
            raise ValueError(f"light step {numbers[k]}: {got}")
        maps.append(got[0])
        dropped += got[1]
        no_comm += not got[2]
    retime_steps(nt, st, numbers, maps)
    n = sum(len(v) for v in struct.values())
    what = f"{n} anchors per step{last}"
    if no_comm:
        what += f"; the all-reduces' ends not used in {no_comm} step(s) (their number differs)"
    if dropped:
        what += f"; {dropped} anchor times out of order left out"
    return (f"{nt.info.name}: CPU-light recording: steps {numbers} timed by the recorder's hooks ({what}), "
            f"on the ops and dependencies of step {st} (recorded by torch.profiler; its own timing is left out)")
