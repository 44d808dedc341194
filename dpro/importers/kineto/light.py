"""The light steps of a CUDA-light recording (``DPRO_CUDA_LIGHT``) onto its structure step.

The recorder's light mode (:mod:`dpro.profiler.pytorch.backend`) records the window's first
step with CPU + CUDA activities (``rank<r>.json.gz``: the structure, imported as usual into
one step's DFG) and the other steps with the CUDA activity alone (``rank<r>.light.gz``:
every kernel, copy and memset, and the runtime / driver call that launched it, with
correlation ids; no CPU operators, layers or step markers). This module gives each light
step the structure step's ops with the light step's timing:

* **step split**: on each CPU thread, the structure step made ``K`` runtime calls; the light
  session's calls of that thread are cut into runs of ``K`` (the same number of runs on
  every thread), and each run must repeat the structure step's call names in order. Calls
  before the first run, between two runs or after the last are allowed only if none of them
  launched GPU work (the session's own ``cudaDeviceSynchronize`` at its start and stop, a
  ``torch.cuda.synchronize()`` of the training loop between two steps). Where the calls
  differ, the split is tried again on the calls that launched GPU work or waited for it
  (``SYNC_CALLS``) alone, and the note says so;
* **CPU side**: the runtime calls are anchors; a monotone piecewise-linear map takes the
  structure step's time to the light step's (each call's start and end onto the same
  call's start and end in the light step), so the CPU work between two consecutive calls
  is scaled to fill the interval the light step measured. After the last call the
  structure step's time is kept; before the first call a light step takes what is left of
  the gap from the previous light step's last call (:func:`step_maps`);
* **GPU side**: each stream's GPU ops of a light step (those its calls launched), in start
  order, must carry the structure step's names on that stream; they take their own times.

Each light step becomes a step of the node with the structure step's ops and its own
times, and the structure step's own (profiled) times are left out; the medians over the
light steps are not taken here: the replay's per-op statistics take a trimmed mean over
whole steps, stalls dropped (:mod:`dpro.graph.stats`: a sum of per-op medians
underestimates a step), as for any recording. The window's walls then compose with the
unprofiled correction as before (:mod:`dpro.graph.overhead` compares the pace after the
window with the window's calls after its first, which are the light steps).

Anything that does not match gives one reason, and the caller keeps today's import of the
structure step alone (:func:`apply_light_steps` returns False and adds the note).
"""

from __future__ import annotations

import bisect
import logging
import statistics
from collections import defaultdict
from dataclasses import dataclass

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, NodeTrace
from dpro.importers.kineto.read import KEvent, RankFile
from dpro.importers.kineto.segments import SYNC_CALLS, BadCorrelation, Seg, _correlation, gpu_segments

log = logging.getLogger(__name__)

#: the categories of the calls on the CPU side that a CUDA-only session records
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})


@dataclass(frozen=True, slots=True)
class Call:
    """One runtime or driver call (µs as recorded); ``corr``: its correlation id, if any."""

    name: str
    ts: float
    end: float
    corr: int | None = None


def runtime_calls(events: list[KEvent], t0: float = float("-inf"), t1: float = float("inf")) -> dict[object, list[Call]]:
    """The runtime and driver calls starting in ``[t0, t1)``, per thread, in start order (an
    enclosing call before the calls inside it)."""
    out: dict[object, list[Call]] = defaultdict(list)
    for e in events:
        if e.cat in RUNTIME_CATS and t0 <= e.ts < t1:
            a = e.args or {}
            try:
                corr = _correlation(e.name, e.ts, a) if "correlation" in a else None
            except BadCorrelation:
                corr = None
            out[e.tid].append(Call(e.name, e.ts, e.ts + e.dur, corr))
    for calls in out.values():
        calls.sort(key=lambda c: (c.ts, -c.end))
    return dict(out)




def _tname(tid: object) -> str:
    return f"thread {tid}"


def split_steps(struct: dict[object, list[Call]], light: dict[object, list[Call]],
                launched: set[int]) -> list[dict[object, list[Call]]] | str:
    """The light session's calls cut into steps like the structure step's (module doc), or
    the reason they cannot be. ``launched``: correlation ids of the light GPU ops."""
    if not struct:
        return "the structure step made no runtime calls"
    extra = sorted((str(t) for t in light if t not in struct))
    if extra:
        return f"threads {extra} made runtime calls in the light steps but none in the structure step"
    counts: dict[object, int] = {}
    runs: dict[object, list[list[Call]]] = {}
    for tid, calls in struct.items():
        got = runs[tid] = _runs(calls, light.get(tid, []), launched)
        if isinstance(got, str):
            return f"{_tname(tid)}: {got}"
        counts[tid] = len(got)
    if len(set(counts.values())) != 1 or not next(iter(counts.values())):
        return "light steps per thread differ: " + ", ".join(
            f"{_tname(t)} {len(light.get(t, []))} calls / {len(struct[t])} per step" for t in struct)
    n = next(iter(counts.values()))
    return [{tid: runs[tid][k] for tid in struct} for k in range(n)]


def _runs(calls: list[Call], got: list[Call], launched: set[int]) -> list[list[Call]] | str:
    """One thread's light calls cut into runs that repeat ``calls``' names in order. Calls
    between two runs (or before the first, after the last) are dropped if they launched no
    GPU work: the session's own start and stop, a ``torch.cuda.synchronize()`` of the
    training loop between two steps. A call that launched GPU work outside a run is the
    reason the steps do not match."""
    names = [c.name for c in calls]
    k, out, i = len(names), [], 0
    while i < len(got):
        if got[i].name == names[0] and [c.name for c in got[i:i + k]] == names:
            out.append(got[i:i + k])
            i += k
        elif got[i].corr is not None and got[i].corr in launched:
            part = got[i:i + k]
            j = next((j for j, (a, b) in enumerate(zip(names, (c.name for c in part))) if a != b), len(part))
            why = (f"runtime call {j} is {part[j].name}, the structure step's is {names[j]}" if j < len(part)
                   else f"{len(got) - i} calls left, fewer than the structure step's {k}")
            return f"light step {len(out) + 1} does not repeat the structure step's calls ({why}; it launched GPU work)"
        else:
            i += 1
    return out


@dataclass
class TimeMap:
    """A monotone piecewise-linear map (anchors ``xs`` -> ``ys``, both non-decreasing)."""

    xs: list[float]
    ys: list[float]

    def __call__(self, t: float) -> float:
        xs, ys = self.xs, self.ys
        if t <= xs[0]:
            return ys[0] + (t - xs[0])
        if t >= xs[-1]:
            return ys[-1] + (t - xs[-1])
        i = bisect.bisect_right(xs, t) - 1
        x0, x1 = xs[i], xs[i + 1]
        if x1 <= x0:
            return ys[i + 1]
        return ys[i] + (ys[i + 1] - ys[i]) * (t - x0) / (x1 - x0)


def anchors(struct: dict[object, list[Call]], light: dict[object, list[Call]]) -> tuple[list[float], list[float], int]:
    """(structure times, light times) of every call's start and end, sorted and made
    monotone (an anchor whose light time would go back is dropped), and how many were."""
    return monotone([(x, y) for tid, calls in struct.items() for a, b in zip(calls, light[tid])
                     for x, y in ((a.ts, b.ts), (a.end, b.end))])


def monotone(pairs: list[tuple[float, float]]) -> tuple[list[float], list[float], int]:
    """Anchor pairs (structure time, light time) sorted by the first and made monotone in the
    second (a pair whose light time would go back is dropped); and how many were dropped."""
    xs: list[float] = []
    ys: list[float] = []
    dropped = 0
    for x, y in sorted(pairs):
        if ys and y < ys[-1]:
            dropped += 1
            continue
        xs.append(x)
        ys.append(y)
    return xs, ys, dropped


def step_maps(struct: dict[object, list[Call]], light_steps: list[dict[object, list[Call]]],
              span: tuple[float, float]) -> tuple[list[TimeMap], int]:
    """One :class:`TimeMap` per light step, from the structure step's ``span`` (t0, t1) onto
    the light step's; and how many anchors were dropped to keep them monotone."""
    t0, t1 = span
    per = [anchors(struct, s) for s in light_steps]
    if not per or not per[0][0]:
        raise ValueError("no anchors")
    before, after = max(0.0, per[0][0][0] - t0), max(0.0, t1 - per[0][0][-1])
    # the gap from one light step's last call to the next one's first holds the first one's
    # time after its calls, the recorder's time between the steps and the next one's time
    # before its first call: the structure step's time after its calls is kept (where the
    # gap allows it), the rest is the next step's lead-in. (Its own lead-in, the first step
    # after the profiler started, is inflated: measured 649 / 2,980 / 1,664 µs against
    # 196-219 / 242-339 / 193-245 µs in the later steps of mlp / ResNet-50 / GPT on an H100,
    # while the time after the calls held: 159 against 152-187 µs on mlp.)
    gaps = [per[k + 1][1][0] - per[k][1][-1] for k in range(len(per) - 1)]
    leads = [max(0.0, g - min(after, g)) for g in gaps]
    lead0 = statistics.median(leads) if leads else before
    maps = []
    dropped = 0
    for k, (xs, ys, d) in enumerate(per):
        dropped += d
        lead = leads[k - 1] if k >= 1 else lead0
        tail = min(after, gaps[k]) if k < len(gaps) else after
        maps.append(TimeMap([t0] + xs + [t1], [ys[0] - lead] + ys + [ys[-1] + tail]))
    return maps, dropped


def _by_stream(segs: list[Seg]) -> dict[str, list[Seg]]:
    out: dict[str, list[Seg]] = defaultdict(list)
    for s in sorted(segs, key=lambda s: (s.ts, s.end)):
        out[s.dev].append(s)
    return out


@dataclass
class LightMatch:
    """How a node's light steps match its structure step (:func:`match_light_steps`)."""

    structure_step: int
    numbers: list[int]
    file: str
    struct: dict[object, list[Call]]
    maps: list[TimeMap]
    #: per light step: id of a structure-step GPU event -> the light step's GPU op
    gpu_steps: list[dict[int, Seg]]
    what: str


def apply_light_steps(nt: NodeTrace, struct_rf: RankFile, light_rf: RankFile, structure_step: int,
                      light_numbers: list[int], notes: list[str]) -> bool:
    """Replace ``nt``'s structure step by its light steps (module doc); False, with one note
    saying why, where they do not match (``nt`` is then left as it was)."""
    m = match_light_steps(nt, struct_rf, light_rf, structure_step, light_numbers)
    if isinstance(m, str):
        notes.append(mismatch_note(nt.info.name, light_rf.path.name, structure_step, m))
        return False
    notes.append(apply_light_match(nt, m))
    return True


def mismatch_note(node: str, file: str, structure_step: int, why: str) -> str:
    """The note of a node whose light steps are not used."""
    return (f"{node}: CUDA-light recording: {file} does not match the structure step {structure_step} ({why}); "
            f"replaying step {structure_step} alone, with its CPU operators profiled")


def apply_light_match(nt: NodeTrace, m: LightMatch) -> str:
    """Rewrite ``nt``: its structure step's events and span replaced by one set per light
    step (CPU-side times through the step's :class:`TimeMap`, GPU ops their own). Returns
    the node's note."""
    st = m.structure_step
    retime_steps(nt, st, m.numbers, m.maps, m.gpu_steps)
    return (f"{nt.info.name}: CUDA-light recording: steps {m.numbers} timed from the CUDA-only session "
            f"({m.file}: {m.what}), on the ops and dependencies of step {st} (recorded with CPU operators; "
            f"its own timing is left out)")


def retime_steps(nt: NodeTrace, st: int, numbers: list[int], maps: list[TimeMap],
                 gpu_steps: list[dict[int, Seg]] | None = None) -> None:
    """Replace ``nt``'s step ``st`` by one step per number: the same events, each placed
    through that step's map (or, for a GPU op in ``gpu_steps``, given the light step's own)."""
    t0, dur = nt.steps[st]
    t1 = t0 + dur
    own = [e for e in nt.events if e.step == st]
    rest = [e for e in nt.events if e.step != st]
    new: list[Event] = []
    for k, (num, f) in enumerate(zip(numbers, maps)):
        gpu = gpu_steps[k] if gpu_steps is not None else {}
        for e in own:
            s = gpu.get(id(e))
            if s is not None:
                new.append(Event(e.op, num, s.ts, s.end - s.ts))
            else:
                a, b = f(e.ts), f(e.ts + e.dur)
                new.append(Event(e.op, num, a, max(0.0, b - a)))
        a, b = f(t0), f(t1)
        nt.steps[num] = (a, b - a)
    del nt.steps[st]
    nt.events = rest + new


def match_light_steps(nt: NodeTrace, struct_rf: RankFile, light_rf: RankFile, st: int,
                      numbers: list[int]) -> LightMatch | str:
    """How the light steps of ``light_rf`` match the structure step ``st`` of ``nt``
    (imported from ``struct_rf``), or why they do not; ``nt`` is not changed."""
    why = _match(nt, struct_rf, light_rf, st, numbers)
    if isinstance(why, str):
        return why
    struct, steps, maps, dropped, gpu_steps, ref, unlaunched, only = why
    calls = sum(len(c) for c in struct.values())
    what = f"{calls} runtime calls and {sum(len(v) for v in ref.values())} GPU ops per step matched"
    if dropped:
        what += f"; {dropped} call times out of order across threads not used as anchors"
    if unlaunched:
        what += f"; {unlaunched} GPU ops launched outside the light steps left out"
    return LightMatch(st, list(numbers), light_rf.path.name, struct, maps, gpu_steps, what + only)


def _match(nt: NodeTrace, struct_rf: RankFile, light_rf: RankFile, st: int, numbers: list[int]) -> tuple | str:
    """What :func:`match_light_steps` needs, or why the light steps do not match the structure step."""
    if st not in nt.steps:
        return f"the structure step {st} is not among the imported steps {sorted(nt.steps)}"
    t0, dur = nt.steps[st]
    t1 = t0 + dur
    struct = runtime_calls(struct_rf.events, t0, t1)
    if not struct and any(e.cat in RUNTIME_CATS for e in struct_rf.events) and all(
            e.ts == 0 and e.dur == 0 for e in struct_rf.events if e.cat in RUNTIME_CATS):
        return (f"{struct_rf.path.name}: its runtime calls and GPU ops have no times (ts 0, dur 0: exported after "
                f"the CUDA-only session had started, by a recorder before that was fixed)")
    light = runtime_calls(light_rf.events)
    try:
        lgpu = gpu_segments(light_rf)
    except DproInputError as e:  # a bad correlation id: said as a mismatch
        return e.problem
    lset = {s.corr for s in lgpu if s.corr is not None}
    steps = split_steps(struct, light, lset)
    only = ""
    if isinstance(steps, str):  # again on the calls that launched GPU work or waited for it
        sset = {s.corr for s in gpu_segments(struct_rf) if s.corr is not None}
        s2, l2 = _essential(struct, sset), _essential(light, lset)
        alt = split_steps(s2, l2, lset) if s2 else steps
        if isinstance(alt, str):
            return steps
        only = f"; on the calls that launched GPU work or waited for it alone (with every call: {steps})"
        steps, struct = alt, s2
    if len(steps) != len(numbers):
        return f"{len(steps)} light steps found, the recorder says {len(numbers)} ({numbers})"
    # GPU ops of each light step: launched by its calls (correlation ids)
    step_of = {c.corr: k for k, s in enumerate(steps) for calls in s.values() for c in calls if c.corr is not None}
    per_step: list[list[Seg]] = [[] for _ in steps]
    unlaunched = 0
    for s in lgpu:
        k = step_of.get(s.corr) if s.corr is not None else None
        if k is None:
            unlaunched += 1
        else:
            per_step[k].append(s)
    ref = defaultdict(list)  # the structure step's GPU events per stream, in start order
    for ev in nt.events:
        if ev.step == st and nt.ops[ev.op].device.startswith("gpu"):
            ref[nt.ops[ev.op].device].append(ev)
    for evs in ref.values():
        evs.sort(key=lambda e: (e.ts, e.ts + e.dur))
    gpu_steps = []
    for k, segs in enumerate(per_step):
        by = _by_stream(segs)
        if set(by) != set(ref):
            return f"light step {k + 1} ran GPU ops on streams {sorted(by)}, the structure step on {sorted(ref)}"
        for dev, evs in ref.items():
            got = by[dev]
            if len(got) != len(evs):
                return f"light step {k + 1}, {dev}: {len(got)} GPU ops, the structure step {len(evs)}"
            for j, (e, s) in enumerate(zip(evs, got)):
                if nt.ops[e.op].name != s.name:
                    return f"light step {k + 1}, {dev}: GPU op {j} is {s.name[:60]}, the structure step's is {nt.ops[e.op].name[:60]}"
        gpu_steps.append({id(e): s for dev, evs in ref.items() for e, s in zip(evs, by[dev])})
    try:
        maps, dropped = step_maps(struct, steps, (t0, t1))
    except ValueError:
        return "no runtime call to anchor the steps on"
    return struct, steps, maps, dropped, gpu_steps, ref, unlaunched, only


def _essential(calls: dict[object, list[Call]], launched: set[int]) -> dict[object, list[Call]]:
    """Each thread's calls that launched GPU work (``launched``: correlation ids) or waited
    for it (``SYNC_CALLS``); threads left without any are dropped."""
    out = {tid: [c for c in cs if (c.corr is not None and c.corr in launched) or c.name in SYNC_CALLS]
           for tid, cs in calls.items()}
    return {tid: cs for tid, cs in out.items() if cs}
