"""Shallow ranks (``DPRO_SHALLOW_RANKS``, EXPERIMENTAL): their window steps after the first, from rank 0's.

With ``DPRO_SHALLOW_RANKS=1`` a PyTorch rank other than 0 stops torch.profiler after the
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
"""

from __future__ import annotations

from collections import Counter

from dpro.contracts.recording import MetaKey
from dpro.gtrace.schema import Event, GTrace, NodeTrace


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
        why = ("no rank 0 that recorded the whole window" if ref is None
               else (f"no step recorded by both (it has step(s) {sorted(nt.steps)}, {ref.info.name} replays "
                     f"{sorted(ref.steps)}: a first call that differs from the later ones, as on a GPU, is left out)")
               if not common else _mismatch(ref, nt, common[0]))
        if why is not None:
            failed.append(f"{nt.info.name}: shallow rank (DPRO_SHALLOW_RANKS): its later steps not taken from "
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
        gt.notes.append(f"{nt.info.name}: shallow rank (DPRO_SHALLOW_RANKS): steps {missing} are "
                        f"{ref.info.name}'s (same ops; step {anchor} recorded by both)")
    gt.manifest.steps = sorted(set.intersection(*(set(nt.steps) for nt in gt.nodes.values())))
    return failed
