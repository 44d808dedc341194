"""Shallow ranks (``DPRO_SHALLOW_RANKS``): their window steps after the first, from rank 0's.

With ``DPRO_SHALLOW_RANKS=1`` (by default where a host runs more ranks of a DDP model than it
has cores: dpro.profiler.pytorch.backend) a PyTorch rank other than 0 stops torch.profiler after the
window's first call (``MetaKey.SHALLOW``: ``{"deep_steps": [that call]}``); rank 0 records
the whole window. On ranks that share cores every rank's per-op recording adds to the cores'
demand, and the synchronous step waits for the slowest (docs/fidelity.md "DDP transformer at 4
workers: where the window's time goes").

Here each shallow rank gets rank 0's other window steps: rank 0's events of those steps,
shifted by the difference of the two ranks' starts of the step both recorded, and rank 0's
step spans, shifted alike. This assumes data parallelism: every rank runs the same ops on
equally sized inputs, so that a rank's op times are rank 0's up to noise. It is checked as
far as the trace allows: the shallow rank must have rank 0's ops (the same DFG nodes) and, in
the step both recorded, the same number of events of each op; where it does not (or rank 0
is absent or is shallow itself), nothing is filled in, with a note, and the replay keeps the
steps all ranks recorded (the first call alone). Not checked: unequal inputs per rank
(variable sequence lengths), which the one shared step may not show.

Where rank 0 left that step out (on a GPU the profiler's first step runs CUDA event calls the
later steps do not, and is dropped as a step of another structure), the shallow rank takes
rank 0's whole DFG and kept steps instead, shifted by the difference of the two ranks' ends
of their first profiled step (its collectives end it together; a rank can start it late), if
that first step ran the same set of operators (``layer/op`` names on the CPU threads:
:attr:`NodeTrace.first_step`) on both ranks; its own first step is then not replayed. GPU kernels are not compared: with ``cudnn.benchmark`` each process picks
its own convolution kernels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from dpro.contracts.recording import MetaKey
from dpro.gtrace.schema import Event, GTrace, NodeTrace

#: how the notes name a shallow rank
_WHO = "shallow rank (its first window call only: DPRO_SHALLOW_RANKS, docs/profiling.md)"


def _mismatch(ref: NodeTrace, nt: NodeTrace, anchor: int) -> str | None:
    """Why ``nt``'s steps cannot be taken from ``ref``'s (None: they can)."""
    if set(nt.ops) != set(ref.ops):
        extra, lack = len(set(nt.ops) - set(ref.ops)), len(set(ref.ops) - set(nt.ops))
        return f"its ops differ from {ref.info.name}'s ({extra} more, {lack} fewer)"
    mine = Counter(e.op for e in nt.events if e.step == anchor)
    theirs = Counter(e.op for e in ref.events if e.step == anchor)
    if mine != theirs:
        n = sum(1 for op in set(mine) | set(theirs) if mine[op] != theirs[op])
        return f"in step {anchor}, {n} ops ran a different number of times than on {ref.info.name}"
    return None


def fill_shallow_steps(gt: GTrace, metas: dict[int, dict]) -> list[str]:
    """Give each shallow node rank 0's window steps that it did not record (module doc);
    notes say what was filled in or why not; ``gt.manifest.steps`` becomes the steps all
    nodes now have. Returns the notes of the shallow nodes left as they were."""
    shallow = [nt for nt in gt.nodes.values() if MetaKey.SHALLOW in metas.get(nt.info.rank, {})]
    failed: list[str] = []
    if not shallow:
        return failed
    ref = next((nt for nt in gt.nodes.values() if nt.info.rank == 0 and nt not in shallow), None)
    for nt in shallow:
        common = sorted(set(nt.steps) & set(ref.steps)) if ref is not None else []
        if ref is not None and not common and (note := _take_whole(nt, ref)) is not None:
            gt.notes.append(note)
            continue
        why = ("no rank 0 that recorded the whole window" if ref is None
               else (f"no step recorded by both (it has step(s) {sorted(nt.steps)}, {ref.info.name} replays "
                     f"{sorted(ref.steps)}; their first profiled steps ran different operators)")
               if not common else _mismatch(ref, nt, common[0]))
        if why is not None:
            failed.append(f"{nt.info.name}: {_WHO}: its later steps not taken from "
                          f"rank 0's: {why}")
            gt.notes.append(f"{failed[-1]}; the replay keeps the steps every rank recorded")
            continue
        anchor = common[0]
        off = nt.steps[anchor][0] - ref.steps[anchor][0]
        missing = sorted(set(ref.steps) - set(nt.steps))
        todo = set(missing)
        nt.events = nt.events + [Event(e.op, e.step, e.ts + off, e.dur) for e in ref.events if e.step in todo]
        for s in missing:
            nt.steps[s] = (ref.steps[s][0] + off, ref.steps[s][1])
        gt.notes.append(f"{nt.info.name}: {_WHO}: steps {missing} are "
                        f"{ref.info.name}'s (same ops; step {anchor} recorded by both)")
    gt.manifest.steps = sorted(set.intersection(*(set(nt.steps) for nt in gt.nodes.values())))
    return failed


def _take_whole(nt: NodeTrace, ref: NodeTrace) -> str | None:
    """Give ``nt`` ``ref``'s DFG and kept steps, shifted to ``nt``'s clock, if both ranks' first
    profiled step ran the same operators (module doc); the note, or None where they did not."""
    a, b = nt.first_step, ref.first_step
    if a is None or b is None or a["step"] != b["step"] or a["cpu_ops"] != b["cpu_ops"]:
        return None
    off = a["end"] - b["end"]  # the step's last collective ends it on every rank; its start can wait
    own = sorted(nt.steps)
    nt.ops = {k: replace(o) for k, o in ref.ops.items()}
    nt.edges = list(ref.edges)
    nt.events = [Event(e.op, e.step, e.ts + off, e.dur) for e in ref.events]
    nt.steps = {s: (t0 + off, d) for s, (t0, d) in ref.steps.items()}
    return (f"{nt.info.name}: {_WHO}: {ref.info.name} left out the step it recorded "
            f"({own}, the profiler's first, of another structure); both ran the same operators in it, so it "
            f"replays {ref.info.name}'s DFG and steps {sorted(ref.steps)}, shifted by {off:.0f} µs")
