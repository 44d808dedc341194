"""A PyTorch rank's recorded allocations attributed to its DFG ops, for memory estimation
(dpro/replayer/memory.py).

torch.profiler records every CPU allocation and free of the window (``profile_memory=True``,
:mod:`dpro.profiler.pytorch.backend`); :func:`attach_allocations` reads them from the rank's
trace and attributes each block to the DFG op that allocated it and the op that freed it
(``nt.meta["memory"]``, beside the static facts the recorder wrote,
:mod:`dpro.profiler.pytorch.memory`).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dpro.contracts.recording import MEMORY_VERSION, TORCH_STEP_PREFIX, MetaKey
from dpro.errors import DproInputError, brief
from dpro.jsonio import read_bytes

if TYPE_CHECKING:
    from dpro.gtrace.schema import NodeTrace

#: one allocation above 256 TiB is a corrupt event (and sums of many stay within int64)
MAX_ALLOCATION_BYTES = 2**48


@dataclass
class _Block:
    bytes: int
    op: str
    step: int
    freed_by: str | None = None
    freed_step: int | None = None


def _memory_events(raw: dict, path: Path) -> tuple[object, list[tuple[float, object, int, int]]]:
    """(main thread id, [(ts, tid, bytes ±, addr)]) of a Kineto trace, in time order."""
    evs = raw.get("traceEvents") if isinstance(raw, dict) else None
    if not isinstance(evs, list):
        raise DproInputError(path, "not a Chrome trace (no traceEvents list)")
    main = None
    out = []
    for e in evs:
        if not isinstance(e, dict):
            continue
        if main is None and e.get("ph") == "X" and str(e.get("name", "")).startswith(TORCH_STEP_PREFIX):
            main = e.get("tid")
        if e.get("name") == "[memory]":
            a = e.get("args") or {}
            try:
                if int(a.get("Device Type", 0)) != 0:  # CPU only here; CUDA memory is another device
                    continue
                ev = (float(e["ts"]), e.get("tid"), int(a["Bytes"]), int(a["Addr"]))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                raise DproInputError(path, f"a [memory] event (ts {brief(e.get('ts'))}) lacks a numeric ts, Bytes or Addr") from None
            if not (math.isfinite(ev[0]) and abs(ev[2]) < MAX_ALLOCATION_BYTES):  # sums must stay within int64
                raise DproInputError(path, f"a [memory] event (ts {brief(e.get('ts'))}): ts or Bytes out of range "
                                           f"(|Bytes| below 2^48)")
            out.append(ev)
    out.sort(key=lambda x: x[0])
    return main, out


def attach_allocations(nt: "NodeTrace", rank_file: Path, facts: dict | None = None) -> dict | None:
    """Attribute the rank's recorded allocations to its DFG ops; store in ``nt.meta["memory"]``.

    Each allocation belongs to the op on the main thread that runs when it happens, or to
    the next op when it happens in the host gap before that op (the replayer charges the
    gap to the op). Per op, over the analysed steps (every step of the window but the
    first, whose frees of blocks allocated before the window are invisible):

    * ``peak``: the highest the live bytes rise above their level at the op's start while
      it runs (its own temporaries included), mean over steps;
    * ``alloc`` / ``free``: bytes it allocates that outlive it / it frees, mean over steps;
    * ``lifetimes``: ``[producer op, releaser op or null, bytes]`` for blocks that outlive
      their op (``null``: not freed before the window ended);
    * ``carry_in``: bytes allocated in an earlier step still live when a step starts.

    Returns the memory dict, or None when the trace holds no allocation events.
    """
    data = read_bytes(Path(rank_file))  # regular files only, bounded (dpro.jsonio)
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise DproInputError(rank_file, f"not valid JSON ({e})") from None
    main, mem = _memory_events(raw, Path(rank_file))
    del raw, data
    out = dict(facts or nt.meta.get(MetaKey.MEMORY) or {})
    if not mem:
        return None
    main_dev = "cpu:main"
    ops = sorted((e for e in nt.events if nt.ops.get(e.op) is not None and nt.ops[e.op].device == main_dev),
                 key=lambda e: e.ts)
    ends = [e.ts + e.dur for e in ops]
    steps = sorted(nt.steps)
    analysed = steps[1:] if len(steps) > 1 else steps
    live: dict[int, _Block] = {}
    per_op_events: dict[tuple[str, int], list[int]] = defaultdict(list)  # (op, step) -> [± bytes]
    lifetimes: dict[tuple[str, str | None], int] = defaultdict(int)
    alloc: dict[str, int] = defaultdict(int)
    free: dict[str, int] = defaultdict(int)
    unattributed = 0
    blocks: list[_Block] = []
    for ts, tid, nbytes, addr in mem:
        i = bisect.bisect_left(ends, ts)
        if tid != main or i >= len(ops):
            unattributed += abs(nbytes) if nbytes > 0 else 0
            if nbytes < 0:
                live.pop(addr, None)
            continue
        ev = ops[i]
        if nbytes > 0:
            b = _Block(nbytes, ev.op, ev.step)
            live[addr] = b
            blocks.append(b)
            per_op_events[(ev.op, ev.step)].append(nbytes)
        else:
            b = live.pop(addr, None)
            if b is None:
                continue
            b.freed_by, b.freed_step = ev.op, ev.step
            per_op_events[(ev.op, ev.step)].append(-b.bytes)
    sel = set(analysed)
    n = max(1, len(sel))
    for b in blocks:
        if b.step in sel and not (b.freed_by == b.op and b.freed_step == b.step):
            alloc[b.op] += b.bytes
            lifetimes[(b.op, b.freed_by)] += b.bytes
        if b.freed_step in sel and not (b.freed_by == b.op and b.freed_step == b.step):
            free[b.freed_by] += b.bytes  # type: ignore[index]
    carry = 0
    for s in analysed:
        carry += sum(b.bytes for b in blocks if b.step < s and (b.freed_step is None or b.freed_step >= s))
    peak: dict[str, float] = defaultdict(float)
    for (op, s), deltas in per_op_events.items():
        if s in sel:
            run = top = 0
            for d in deltas:
                run += d
                top = max(top, run)
            peak[op] += top
    names = set(alloc) | set(free) | set(peak)
    out.update({
        "version": MEMORY_VERSION,
        "steps": analysed,
        "carry_in": int(round(carry / n)),
        "ops": {op: {"peak": int(round(peak[op] / n)), "alloc": int(round(alloc[op] / n)),
                     "free": int(round(free[op] / n))} for op in sorted(names)},
        "lifetimes": [[a, b, int(round(v / n))] for (a, b), v in sorted(lifetimes.items(), key=lambda x: (x[0][0], x[0][1] or ""))],
        "unattributed_bytes": int(round(unattributed / n)),
    })
    nt.meta[MetaKey.MEMORY] = out
    return out
