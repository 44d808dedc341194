"""How real libraries group gradients, so strategies can be realised and baselines replayed.

* PyTorch DDP: after the first iteration the reducer re-buckets the parameters in the
  order their gradients became ready; a bucket closes when it holds at least its limit:
  the first bucket ``first_cap``, the others ``bucket_cap_mb``. With no ``bucket_cap_mb``
  argument that is 1 MiB then 25 MiB; with an explicit ``bucket_cap_mb`` both limits are
  that value (torch 2.13, ``_BucketCapacityConfig``). Ours matches
  ``torch.distributed._compute_bucket_assignment_by_size`` (tests/test_optimizer.py).
* Horovod: a background cycle (``HOROVOD_CYCLE_TIME``) fuses the tensors that became ready
  since the last cycle, up to ``HOROVOD_FUSION_THRESHOLD`` bytes per fused buffer.
* MXNet kvstore (``dist_*``): an array of at least ``MXNET_KVSTORE_BIGARRAY_BOUND``
  elements is split evenly across all servers (:mod:`dpro.optimizer.ps.layout`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

MiB = 1 << 20
DDP_FIRST_BUCKET_BYTES = MiB
DDP_DEFAULT_CAP_BYTES = 25 * MiB
HOROVOD_DEFAULT_THRESHOLD = 64 * MiB
HOROVOD_DEFAULT_CYCLE_US = 1000.0
MXNET_DEFAULT_BOUND = 1_000_000


def ddp_buckets(sizes_ready_order: list[int], cap: int, first_cap: int | None = None) -> list[list[int]]:
    """Bucket indices (into the given list, gradient-ready order) for DDP's ``bucket_cap``.

    ``first_cap`` defaults to ``cap`` (what an explicit ``bucket_cap_mb`` gives).
    """
    first_cap = cap if first_cap is None else first_cap
    out: list[list[int]] = []
    cur: list[int] = []
    size, limit = 0, first_cap
    for i, b in enumerate(sizes_ready_order):
        cur.append(i)
        size += b
        if size >= limit:
            out.append(cur)
            cur, size, limit = [], 0, cap
    if cur:
        out.append(cur)
    return out


def horovod_cycle_groups(ready_us: list[float], sizes: list[int], threshold: int = HOROVOD_DEFAULT_THRESHOLD,
                   cycle_us: float = HOROVOD_DEFAULT_CYCLE_US,
                   busy_us: Callable[[int], float] | None = None) -> list[list[int]]:
    """Fused groups Horovod forms, in order.

    Its background loop wakes every ``cycle_us``; a wake-up fuses the tensors that became
    ready before it into buffers of at most ``threshold`` bytes and runs them before the
    loop sleeps again. ``busy_us`` (a buffer's bytes -> its run time): tensors ready while
    it runs wait for the next wake-up, which comes at once when the run took longer than
    a cycle (on a capped TF convnet job Horovod fused 10 gradients into 2 buffers where
    1 ms cycles alone would give 4). Without it, runs take no time.
    """
    order = sorted(range(len(ready_us)), key=lambda i: (ready_us[i], i))
    if cycle_us <= 0:
        return [[i] for i in order]
    out: list[list[int]] = []
    phase, wake, k = 0.0, None, 0
    while k < len(order):
        nxt = ready_us[order[k]]
        if wake is None or wake <= nxt:  # idle until then: the first wake-up after it
            wake = phase + (math.floor((nxt - phase) / cycle_us) + 1) * cycle_us
        first = len(out)
        size = 0
        while k < len(order) and ready_us[order[k]] < wake:
            i = order[k]
            if len(out) > first and size + sizes[i] <= threshold:
                out[-1].append(i)
                size += sizes[i]
            else:
                out.append([i])
                size = sizes[i]
            k += 1
        end = wake + (sum(busy_us(sum(sizes[i] for i in g)) for g in out[first:]) if busy_us else 0.0)
        if end > wake + cycle_us:
            phase = wake = end
        else:
            wake += cycle_us
    return out
