"""GPU streams that rotate from step to step, named by their place in the step.

torch hands some work a stream from its pool, a different one at each call: ProcessGroupGloo
copies CUDA tensors to and from the host on a pool stream per collective (s92 and s96 in one
step, s100 and s104 in the next, ...). Named by stream id, each step's copies are other ops
than the step before's, and no two steps share a structure. A stream used in at most half of
the steps that have GPU work is taken as such a rotating stream and renamed, in each step,
``gpu<d>:r<i>``: the i-th rotating stream of GPU d to start work in that step. Streams used in
most steps (the compute stream, NCCL's) keep their ids; a single-step trace is left alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpro.importers.kineto.segments import Seg


def name_rotating_streams(gpu: list[Seg]) -> int:
    """Rename the rotating streams of the GPU ops with a step (module doc), in place; returns
    how many stream ids were renamed (0: none, or only one step uses any)."""
    steps_of: dict[str, set[int]] = defaultdict(set)
    for k in gpu:
        if k.step >= 0:
            steps_of[k.dev].add(k.step)
    n = len(set().union(*steps_of.values())) if steps_of else 0
    rotating = {d for d, sts in steps_of.items() if 2 * len(sts) <= n}
    if n < 2 or len(set().union(*(steps_of[d] for d in rotating))) < 2:
        return 0
    first: dict[tuple[int, str], float] = {}
    for k in gpu:
        if k.step >= 0 and k.dev in rotating:
            key = (k.step, k.dev)
            first[key] = min(first.get(key, k.ts), k.ts)
    by_step: dict[tuple[int, str], list[tuple[float, str]]] = defaultdict(list)
    for (st, dev), t in first.items():
        by_step[(st, dev.split(":")[0])].append((t, dev))
    new = {(st, dev): f"{gpu_name}:r{i}"
           for (st, gpu_name), devs in by_step.items() for i, (_, dev) in enumerate(sorted(devs))}
    for k in gpu:
        k.dev = new.get((k.step, k.dev), k.dev)
    return len(rotating)
