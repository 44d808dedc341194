"""Kineto rank files -> gTrace (manifest, per-node DFG and events)."""

from __future__ import annotations

import bisect
import gc
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import starmap
from operator import attrgetter
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from dpro.errors import DproInputError
from dpro.jsonio import ReadOptions, current_read_options, read_options
from dpro.gtrace.schema import GPU_PERIOD_META, Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.importers.kineto import deps
from dpro.executor import Mapper
from dpro.importers.kineto.pool import default_mapper
from dpro.importers.kineto.groups import _rank_groups, assign_gloo_groups
from dpro.importers.kineto.p2p import OPEN_META, OpenP2P, p2p_key, peer_candidates, resolve_open
from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, RankFile, check_rank_pattern, load_rank_file, trace_files
from dpro.importers.kineto.shapes import LAYER_SHAPES, layer_shapes
from dpro.importers.kineto.streams import name_rotating_streams
from dpro.progress import progress_bar
from dpro.importers.kineto.segments import (
    CommInfo, Seg, cpu_segments, cpu_threads, find_steps, gpu_segments, is_comm_kernel, step_markers,
)

log = logging.getLogger(__name__)

STEP_END = "STEP_END"
#: the step of a GPU op launched before the capture began (its launch is not in the trace)
PRE_CAPTURE = -2


#: a segment name's ``[k]`` suffix (the k-th piece of its op)
_BRACKET = re.compile(r"\[\d+\]$")


def is_kineto_path(path: Path) -> bool:
    """A Kineto trace file, or a directory of them (cheap check on names only)."""
    if path.is_file():
        return path.name.endswith((".json", ".json.gz"))
    return path.is_dir() and any(p.name.endswith((".json", ".json.gz")) for p in path.iterdir())


def _main_tid(rf: RankFile) -> object:
    """The training thread: the one of the CPU-side ProfilerStep spans, else the thread
    with most CPU operators, else (a GPU-only trace) most runtime calls; None without any."""
    marks, on_cpu = step_markers(rf)
    if on_cpu:
        return marks[0].tid
    counts = Counter(e.tid for e in rf.events if e.cat == "cpu_op")
    if not counts:  # every CPU-side event, python frames included, threads in file order
        counts = Counter({t: len(evs) + len(rf.python.get(t, ())) for t, evs in cpu_threads(rf).items()})
    return counts.most_common(1)[0][0] if counts else None


def _assign_steps(segs: list[Seg], steps: dict[int, tuple[float, float]]) -> None:
    order = sorted(steps)
    starts = [steps[s][0] for s in order]
    for s in segs:
        i = bisect.bisect_right(starts, s.ts) - 1
        if i >= 0 and s.ts < steps[order[i]][1]:
            s.step = order[i]


def _classify(segs: list[Seg]) -> None:
    """Unlabelled CPU work: FW before the step's first BW op, OTHER after it."""
    first_bw: dict[int, float] = {}
    for s in segs:
        if s.cat == "BW":
            first_bw[s.step] = min(first_bw.get(s.step, s.ts), s.ts)
    for s in segs:
        if not s.cat:
            s.cat = "FW" if s.ts < first_bw.get(s.step, float("inf")) else "OTHER"


def _backward_layers(segs: list[Seg]) -> None:
    """A backward op belongs to the layer of the forward op with its autograd sequence number."""
    layer_of = {q: s.layer for s in segs if s.layer is not None for q in s.seqs}
    for s in segs:
        if s.layer is None and s.cat == "BW":
            s.layer = next((layer_of[q] for q in s.seqs if q in layer_of), None)


#: gloo's point-to-point executions (``gloo:send``, ``gloo:recv``), by their collective name
_P2P_EXECS = frozenset({"send", "recv"})


def _pair_gloo(issues: list[Seg], gloo: list[Seg], steps: dict[int, tuple[float, float]]) -> list[tuple[Seg, Seg]]:
    """Pair each collective issue of a step with a gloo execution of that step.

    An execution belongs to the step whose window (extended to the next step's start) holds
    its start; pairing never crosses a step boundary, so one missing execution costs one
    step (dropped later for its different structure), not every later step.  Within a step,
    an issue takes the first unpaired execution of its tensor's element count (the first
    unpaired one where either count is unknown): ProcessGroupGloo runs collectives on two
    threads, and on a loaded machine their recorded starts can swap order.
    """
    order = sorted(steps)
    starts = [steps[s][0] for s in order]
    by_step: dict[int, list[Seg]] = defaultdict(list)
    for c in sorted(gloo, key=lambda c: c.ts):
        i = bisect.bisect_right(starts, c.ts) - 1
        if i >= 0:
            by_step[order[i]].append(c)
    issued: dict[int, list[Seg]] = defaultdict(list)
    for s in issues:
        issued[s.step].append(s)
    pairs = []
    for st, iss in issued.items():
        free = list(by_step.get(st, []))
        for issue in iss:
            # a send or receive takes an execution of its own kind, a collective never takes one
            kind = issue.p2p[0] if issue.p2p else None
            c = next((c for c in free if (c.coll == kind if kind else c.coll not in _P2P_EXECS)
                      and (not (issue.numel and c.numel) or c.numel == issue.numel)), None)
            if c is None:
                continue
            free.remove(c)
            c.step = st
            if issue.p2p:
                c.p2p = issue.p2p
            pairs.append((issue, c))
    return pairs


def _describe_collective(k: Seg, info: CommInfo) -> None:
    """Complete an NCCL kernel's collective from its CPU-side issue: the kind (the kernel of
    an all-to-all or a send/recv is ``SendRecv``), and size and group where the kernel's own
    arguments do not say them."""
    if not k.coll_from_args:
        k.coll = info.kind
    if not k.nbytes and info.nbytes:
        k.nbytes, k.numel = info.nbytes, info.numel
    k.group = k.group or info.group
    k.pg = k.pg or info.pg
    k.p2p = k.p2p or info.p2p  # an NCCL send/recv (ncclKernel_SendRecv): joined with its peer's


def _rank_segments(rf: RankFile, notes: list[str]) -> tuple[dict[int, tuple[float, float]], list[Seg], list[Seg], list[tuple[Seg, Seg]]]:
    """All segments of a rank with steps and categories; plus (issue, collective) pairs."""
    if rf.legacy:
        notes.append(f"{rf.path.name}: legacy event categories (Operator, Runtime, Kernel, Memcpy, Memset) "
                     f"read as cpu_op, cuda_runtime, kernel, gpu_memcpy, gpu_memset")
    steps = find_steps(rf, notes)
    if steps and not step_markers(rf)[1]:
        notes.append(f"{rf.path.name}: no CPU-side ProfilerStep spans; steps taken from the GPU timeline's "
                     f"ProfilerStep annotations (gpu_user_annotation)")
    if not steps:
        t0, t1 = rf.time_span()
        steps = {0: (t0, t1)}
        notes.append(f"{rf.path.name}: no ProfilerStep markers; the whole trace is one step")
    main_tid = _main_tid(rf)
    segs, gloo = cpu_segments(rf, main_tid)
    assign_gloo_groups(gloo, main_tid, rf.meta.get("distributedInfo"), rf.path.name, notes)
    gpu = gpu_segments(rf)
    _assign_steps(segs, steps)
    _classify(segs)
    launcher = {c: s for s in segs for c in s.launches}
    # correlation ids grow with every launch: a GPU op whose id is below every launch in the
    # trace was launched before the capture began (the steps before the profiled ones)
    first_corr = min(launcher, default=None)
    early = 0
    for k in gpu:
        src = launcher.get(k.corr) if k.corr is not None else None
        if src is None and k.corr is not None and first_corr is not None and k.corr < first_corr:
            early += 1
            k.step = PRE_CAPTURE  # not part of any profiled step
            continue
        if src is not None and k.cat == "COMM" and k.corr in src.comm_info:
            _describe_collective(k, src.comm_info[k.corr])
        if src is not None:
            k.step = src.step
            if not k.cat:
                k.cat = src.cat
        else:
            _assign_steps([k], steps)
            k.cat = k.cat or "OTHER"
    rotating = name_rotating_streams(gpu)
    if rotating:
        notes.append(f"{rf.path.name}: {rotating} GPU streams each run work in few steps (torch's stream pool, e.g. "
                     f"gloo's copies of CUDA tensors): named in each step by their order of first use (gpu0:r0, ...)")
    if early:
        notes.append(f"{rf.path.name}: {early} GPU ops launched before the capture began (correlation ids below "
                     f"every launch in the trace) are left out of the steps")
    pairs: list[tuple[Seg, Seg]] = []
    issues = sorted((s for s in segs if s.issue and s.step >= 0), key=lambda s: s.end)
    nccl_issuers = {id(launcher[k.corr]) for k in gpu if k.cat == "COMM" and k.corr in launcher}
    gloo_issues = [s for s in issues if id(s) not in nccl_issuers]
    pairs += _pair_gloo(gloo_issues, gloo, steps)
    for k in gpu:
        if k.cat == "COMM" and k.corr in launcher:
            pairs.append((launcher[k.corr], k))
    pairs.sort(key=lambda p: p[0].end)
    _backward_layers(segs)
    comm = [c for _, c in pairs if c.dev == "comm"]
    return steps, [s for s in segs if s.step >= 0] + [k for k in gpu if k.step >= 0] + comm, gpu, pairs


def _step_edges(
    segs: list[Seg], pairs: list[tuple[Seg, Seg]]
) -> tuple[dict[str, list[Seg]], list[deps.Edge], list[deps.Edge]]:
    by_dev = deps.group_by_device(segs)
    if "comm" in by_dev:  # gloo's collectives in issue order (two threads: recorded starts can swap)
        issued = {id(c): i for i, (_, c) in enumerate(pairs)}
        by_dev["comm"].sort(key=lambda c: (issued.get(id(c), len(issued)), c.ts))
    gpu = [s for s in segs if s.dev.startswith("gpu")]
    launches = deps.launch_edges(segs, gpu)
    edges = deps.chain_edges(by_dev) + launches
    launch_end = {id(k): src.end for src, k in launches}
    for issue, c in pairs:
        if c.dev == "comm":
            edges.append((issue, c))
    by_thread: dict[str, list[tuple[Seg, Seg]]] = defaultdict(list)
    for issue, c in pairs:
        if c.dev == "comm":
            by_thread[issue.dev].append((issue, c))
    consumers = [e for dev, colls in by_thread.items() for e in deps.consumer_edges(by_dev.get(dev, []), colls)]
    edges += deps.stream_wait_edges(by_dev, launch_end)
    edges += deps.sync_edges(segs, gpu)
    edges += deps.handoff_edges(by_dev)
    edges += deps.join_edges(by_dev)
    return by_dev, edges, consumers


def _reconcile_consumers(built: dict, kept: list[int]) -> None:
    """Give each collective the same consumer in every step: the one found most often.

    A gap that merely coincides with a collective's end in one step must not become a
    dependency; ties go to the later op (the less constraining one).  Adds the edges and
    clips each collective's end to its consumer's start (a record on gloo's thread can
    close late), except in a step where that op was found waiting for another collective
    and this one's own waiter came later: DDP's last two buckets can run at once on gloo's
    two threads, and which one ends first varies, so the common consumer of the one that
    usually ends first then started long before it ended (clipped there, one rank's bucket
    "ended" 17 ms before another rank had started it, a contradiction clock alignment had
    to relax).  Such a step keeps the end at its own waiter's start.
    """
    votes: dict[tuple[str, int], Counter] = defaultdict(Counter)
    # per step: collective -> (the op found waiting for it, its recorded end)
    own: dict[int, dict[tuple[str, int], tuple[Seg, float]]] = defaultdict(dict)
    for st in kept:
        by_dev, _, consumers = built[st]
        index = {id(s): (d, k) for d, ss in by_dev.items() for k, s in enumerate(ss)}
        for c, o in consumers:
            votes[index[id(c)]][index[id(o)]] += 1
            own[st][index[id(c)]] = (o, c.end)
    pos = {key: max(v.items(), key=lambda kv: (kv[1], kv[0][1]))[0] for key, v in votes.items()}

    def waited_for_another(st: int, key: tuple[str, int], o: Seg, blocked_from: float) -> bool:
        """o is, in step st, the waiter of another collective that ended while the thread
        was blocked before o (or later): that collective explains the wait."""
        return any(w is o and end >= blocked_from for k, (w, end) in own[st].items() if k != key)

    for st in kept:
        by_dev, edges, _ = built[st]
        for key, (odev, ok) in pos.items():
            c, o = by_dev[key[0]][key[1]], by_dev[odev][ok]
            mine = own[st].get(key, (o, c.end))[0]
            blocked_from = by_dev[odev][ok - 1].end if ok > 0 else o.ts
            until = mine.ts if mine.ts > o.ts and waited_for_another(st, key, o, blocked_from) else o.ts
            c.end = max(c.ts, min(c.end, until))
            edges.append((c, o))


def _empty_reason(rf: RankFile, steps: dict[int, tuple[float, float]]) -> str:
    """Why no operator of ``rf`` falls inside ``steps``: where its operators are instead, and
    what the steps hold."""
    segs, gloo = cpu_segments(rf, _main_tid(rf))
    ops = segs + gpu_segments(rf)
    order = sorted(steps)
    what = f"ProfilerStep#{order[0]}" if len(order) == 1 else f"ProfilerStep#{order[0]}..#{order[-1]}"
    msg = f"empty trace: no CPU or GPU operator inside the profiled steps ({what})"
    if ops:
        msg += f"; its {len(ops)} operator segments all lie outside them"
    _assign_steps(gloo, steps)
    inside = [c for c in gloo if c.step >= 0]
    if inside:
        msg += f"; the steps hold only {len(inside)} gloo collectives, whose issuing ops are not in the trace"
    return msg


#: a step whose structure differs is aligned with the reference step when at least this
#: share of the reference's ops is matched (else it is left out, e.g. a step cut by the
#: capture's end)
ALIGN_MIN = 0.7


def align_step(by_dev: dict[str, list[Seg]], ref: dict[str, list[Seg]], t0: float, st: int,
               ref_t0: float | None = None) -> list[Seg] | None:
    """A step's segments aligned with the reference step's structure, or None.

    Per device queue the op names are matched in order (difflib's longest matching
    blocks); an op the reference lacks is left out (its time becomes host gap before the
    next op), and a reference op this step lacks gets a zero-length stand-in: at the
    reference op's offset from its step start (``ref_t0``; without it, at the end of the
    op before it), kept between the end of the op before it and the start of the next
    matched op (a kernel the reference ran after its step's CPU end stays there, in the
    GPU tail the steady state carries; docs/kineto.md). None when fewer than
    ``ALIGN_MIN`` of the reference's ops match.
    """
    import difflib  # here, as statistics below: not on every import's path (~1 and ~5 ms at start-up)

    out: list[Seg] = []
    matched = total = 0
    for dev, rss in ref.items():
        ss = by_dev.get(dev, [])
        sm = difflib.SequenceMatcher(None, [x.name for x in rss], [x.name for x in ss], autojunk=False)
        mapping = {i + k: ss[j + k] for i, j, n in sm.get_matching_blocks() for k in range(n)}
        next_ts = [float("inf")] * (len(rss) + 1)  # the start of the next matched op
        for i in range(len(rss) - 1, -1, -1):
            next_ts[i] = mapping[i].ts if i in mapping else next_ts[i + 1]
        prev_end = t0
        for i, r in enumerate(rss):
            x = mapping.get(i)
            if x is None:
                at = prev_end if ref_t0 is None else max(prev_end, min(t0 + r.ts - ref_t0, next_ts[i + 1]))
                x = Seg(dev, r.name, at, at, r.cat, step=st, coll=r.coll, nbytes=r.nbytes, group=r.group,
                        layer=r.layer, pg=r.pg)
            else:
                matched += 1
            out.append(x)
            prev_end = max(prev_end, x.end)
        total += len(rss)
    log.debug("step %s: %d of %d ops of the reference matched", st, matched, total)
    return out if total and matched >= ALIGN_MIN * total else None


def _tail_length(ss: list[Seg], t1: float) -> int:
    """How many of a GPU queue's last ops start at or after the CPU step end ``t1``."""
    n = 0
    while n < len(ss) and ss[-1 - n].ts >= t1:
        n += 1
    return n


def _queue_busy_until(gpu: list[Seg]) -> dict[str, tuple[list[float], list[float]]]:
    """Per GPU queue of the whole trace: its ops' starts (sorted) and the running maximum
    of their ends, for :func:`carry_gpu_tails` (until when the queue was busy before an op)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for dev, ss in deps.group_by_device(gpu).items():
        ss = sorted(ss, key=lambda x: x.ts)
        ends, m = [], float("-inf")
        for x in ss:
            m = max(m, x.end)
            ends.append(m)
        out[dev] = ([x.ts for x in ss], ends)
    return out


def _backlog(busy: dict[str, tuple[list[float], list[float]]], dev: str, head: Seg, shift: float, t0: float) -> float:
    """How long after the step start ``t0`` the carried ``head`` (recorded ``shift`` later)
    waited for its queue's earlier work: min(end of the queue's earlier ops, its start) - t0."""
    starts, ends = busy.get(dev, ([], []))
    k = bisect.bisect_left(starts, head.ts + shift) - 1
    if k < 0:
        return 0.0
    return max(0.0, min(ends[k] - shift, head.ts) - t0)


def carry_gpu_tails(built: dict, kept: list[int], steps: dict[int, tuple[float, float]], fname: str,
                    notes: list[str], gpu: list[Seg] | None = None) -> dict[int, Seg]:
    """Steady state: a GPU queue's work that runs after its step's CPU end is carried into the next step.

    Where the GPU runs behind the CPU, the kernels launched at the end of step k run while
    the CPU is already in step k+1. Replaying step k's ops alone then counts that lag as
    step time (the prediction becomes one step's makespan, not the step period), and the
    first kernel of step k+1, which waited for them, shows the wait as host gap. So the
    ops at the end of each GPU queue that start after the CPU step end (the median number
    of them over the kept steps, so the same ops in every step) move to the head of that
    queue, and step k+1 is replayed with step k's instances of them: the backlog the GPU
    really ran in step k+1's window. They keep no edge from the step's CPU ops (their
    launch was in the previous step); the queue's order joins them to the step's own GPU
    ops. Where step k is not in the trace (or ends its queues with other ops), step k+1's
    own instances stand in for them, moved back by its CPU step time (the steady-state
    assumption), with a note. The carried ops have no predecessor in the step, so their
    queue's head would be charged, as host gap, the time it waited at the step's start for
    the queue's earlier work (the previous step's ops, still running: the GPU's backlog,
    which the previous step's own replay already holds). With ``gpu`` (every GPU segment of
    the trace) that wait is taken out: the carried ops move earlier by it (the smallest over
    the queues, so their cross-queue edges keep their order), with a note. ``built`` is
    rewritten in place; returns each stand-in (by id) with the op it stands for.
    """
    lengths: dict[str, list[int]] = defaultdict(list)
    for st in kept:
        t1 = steps[st][1]
        for dev, ss in built[st][0].items():
            if dev.startswith("gpu"):
                lengths[dev].append(_tail_length(ss, t1))
    # the median_low of each queue's tail lengths (statistics' own import costs ~5 ms of every import)
    tail = {dev: n for dev, v in lengths.items() if (n := int(sorted(v)[(len(v) - 1) // 2])) > 0}
    originals: dict[int, Seg] = {}
    if not tail:
        return originals

    def has_prev(st: int) -> bool:
        """Step st-1 is in the trace and ends its GPU queues with the same ops (it may
        differ elsewhere, e.g. the first profiled step)."""
        if st - 1 not in built:
            return False
        prev, own = built[st - 1][0], built[st][0]
        return all(len(prev.get(d, [])) >= n and [s.name for s in prev[d][-n:]] == [s.name for s in own[d][-n:]]
                   for d, n in tail.items())

    new: dict[int, tuple] = {}
    shifted = []
    busy = _queue_busy_until(gpu) if gpu else {}
    backlogs: dict[int, float] = {}
    for st in kept:
        by_dev, edges, consumers = built[st]
        shift = 0.0
        if has_prev(st):
            pby_dev, pedges = built[st - 1][0], built[st - 1][1]
        else:  # this step's own tail, one CPU step earlier
            shift = steps[st][1] - steps[st][0]
            copy = {id(x): replace(x, ts=x.ts - shift, end=x.end - shift)
                    for dev, n in tail.items() for x in by_dev[dev][-n:]}
            originals.update({id(c): x for dev, n in tail.items() for x in by_dev[dev][-n:] for c in [copy[id(x)]]})
            pby_dev = {dev: [copy[id(x)] for x in by_dev[dev][-n:]] for dev, n in tail.items()}
            pedges = [(copy[id(x)], copy[id(y)]) for x, y in edges if id(x) in copy and id(y) in copy]
            shifted.append(st)
        if busy:
            b = min(_backlog(busy, dev, pby_dev[dev][-n], shift, steps[st][0]) for dev, n in tail.items())
            if b > 0:  # the GPU's wait for its backlog at the step's start is not this step's time
                back = {id(x): replace(x, ts=x.ts - b, end=x.end - b)
                        for dev, n in tail.items() for x in pby_dev[dev][-n:]}
                originals.update({id(c): originals.get(i, x) for dev, n in tail.items() for x in pby_dev[dev][-n:]
                                  for i, c in [(id(x), back[id(x)])]})
                pedges = [(back.get(id(x), x), back.get(id(y), y)) for x, y in pedges]
                pby_dev = {dev: [back[id(x)] for x in pby_dev[dev][-n:]] for dev, n in tail.items()}
                backlogs[st] = b
        moved = {id(x) for dev, n in tail.items() for x in by_dev[dev][-n:]}
        carried = {id(x) for dev, n in tail.items() for x in pby_dev[dev][-n:]}
        nb = dict(by_dev)
        chain = []
        for dev, n in tail.items():
            own = by_dev[dev][:-n]
            nb[dev] = pby_dev[dev][-n:] + own
            if own:
                chain.append((nb[dev][n - 1], own[0]))
        ne = [(x, y) for x, y in edges if id(x) not in moved and id(y) not in moved]
        ne += [(x, y) for x, y in pedges if id(x) in carried and id(y) in carried]
        new[st] = (nb, ne + chain, consumers)
    built.update(new)
    notes.append(f"{fname}: the GPU runs behind the CPU: the last {sum(tail.values())} GPU ops of each step start after "
                 f"the step's CPU end and are carried into the next step (steady state)"
                 + (f"; for steps {shifted}, whose previous step is not in the trace (or ends differently), their "
                    f"own, one CPU step earlier" if shifted else "")
                 + (f"; they start earlier by the time their queue was still busy with earlier work at the step's "
                    f"start (GPU backlog, µs: {', '.join(f'step {k} {v:.0f}' for k, v in backlogs.items())})"
                    if backlogs else ""))
    return originals


def gpu_bound_period(steps: dict[int, tuple[float, float]], gpu: list[Seg]) -> float | None:
    """The GPU's step period where the GPU, not the CPU, sets it, else None.

    Per step, the start of its first GPU op (the ops it launched; those whose launch is not
    in the trace, by their start); the GPU's lag behind the CPU is that start minus the CPU
    step's start. Where over three consecutive steps or more the lag grows at every step
    (each step-to-step GPU period exceeds the CPU step: the GPU falls further behind), the
    CPU only queues work ahead until the launch queue fills, and the job's period is the
    GPU's: the median step-to-step difference of those first starts
    (tl_mi300_resnet_act_ckpt: 18.98 ms against CPU steps of 15.9-16.8 ms)."""
    first: dict[int, float] = {}
    for k in gpu:
        if k.step in steps:
            first[k.step] = min(first.get(k.step, k.ts), k.ts)
    order = sorted(first)
    runs = [order[i:i + 2] for i in range(len(order) - 1) if order[i + 1] == order[i] + 1]
    if len(runs) < 2:
        return None
    lag = {s: first[s] - steps[s][0] for s in order}
    if not all(lag[b] > lag[a] for a, b in runs):
        return None
    import statistics

    return float(statistics.median(first[b] - first[a] for a, b in runs))


def _warm_up_step(built: dict, steps: dict[int, tuple[float, float]], pre: list[Seg]) -> int | None:
    """The first profiled step where its window holds GPU ops launched before the capture
    began (``pre``) and at least two more steps follow, else None. Its GPU was still
    running the unprofiled steps' backlog, whose launches the trace does not hold, and
    torch.profiler's first active step carries the profiler's start-up (e.g. the Kineto
    ResNet-50 samples: 151.7 ms against 108-124 ms for the next four)."""
    if len(built) < 3 or not pre:
        return None
    first = min(built)
    t0, t1 = steps[first]
    return first if any(t0 <= k.ts < t1 for k in pre) else None


def _signature(by_dev: dict[str, list[Seg]]) -> tuple:
    return tuple(sorted((d, tuple(s.name for s in ss)) for d, ss in by_dev.items()))


def _pg_key(c: Seg) -> str:
    """The process group of a collective, as one name on every member rank: its ranks where
    the trace gives them (a group name such as "tp" is reused by every TP group), else its
    name, else the default group."""
    if c.group:
        return "g" + "-".join(map(str, c.group))
    return f"pg{c.pg}" if c.pg is not None else "world"


def convert_rank(rf: RankFile, notes: list[str]) -> NodeTrace:
    """One rank's Kineto trace -> NodeTrace with a local DFG shared by all kept steps."""
    steps, segs, gpu, pairs = _rank_segments(rf, notes)
    txn_of: dict[int, str] = {}
    per_step_pairs: dict[int, list[tuple[Seg, Seg]]] = defaultdict(list)
    for p in pairs:
        per_step_pairs[p[1].step].append(p)
    bucket_of: dict[int, int] = {}
    pg_keys = {_pg_key(c) for _, c in pairs if c.p2p is None}
    # a rank in one subgroup only (pairs {0,1} and {2,3}): numbered per group as well, or
    # the two groups' collectives would share transaction ids across the job
    subgroup = any(c.group and rf.world_size and len(c.group) < rf.world_size for _, c in pairs if c.p2p is None)
    several = len(pg_keys) > 1 or subgroup
    groups = [ranks for _, ranks, _ in _rank_groups(rf.meta.get("distributedInfo"))]
    open_p2p: dict[str, OpenP2P] = {}
    for st, ps in per_step_pairs.items():
        seq: Counter = Counter()
        p2p = [p for p in ps if p[1].p2p is not None]
        ps = [p for p in ps if p[1].p2p is None]
        for issue, c in p2p:  # the k-th transfer from src to dst (with its tag) in the step, on both ranks
            kind, raw, tag = c.p2p  # type: ignore[misc]
            # the recorded peer is a rank in the call's group (dpro/importers/kineto/p2p.py)
            cands = peer_candidates(raw, rf.rank, c.group, groups)
            if len(cands) == 1:
                key = p2p_key(kind, rf.rank, cands[0], tag)
                c.group = tuple(sorted((rf.rank, cands[0])))
            else:  # chosen across ranks by the join (p2p.resolve_open)
                o = OpenP2P(kind, raw, tag, cands)
                open_p2p[o.key] = o
                key, c.group = o.key, None
            txn_of[id(c)] = f"{key}.{seq[key]}"
            seq[key] += 1
        for j, (issue, c) in enumerate(ps):
            if several:  # each process group numbers its own collectives (its sequence number)
                key = _pg_key(c)
                txn_of[id(c)] = f"{key}/{c.coll}.{seq[key]}"
                seq[key] += 1
            else:
                txn_of[id(c)] = f"{c.coll}.{j}"
            if issue.bucket is not None:
                bucket_of[id(c)] = issue.bucket
    per_step: dict[int, list[Seg]] = defaultdict(list)
    for s in segs:
        per_step[s.step].append(s)
    built = {st: _step_edges(ss, per_step_pairs.get(st, [])) for st, ss in per_step.items()}
    if not built:
        raise DproInputError(rf.path, _empty_reason(rf, steps))
    warm = _warm_up_step(built, steps, [k for k in gpu if k.step == PRE_CAPTURE])
    cand = {st: b for st, b in built.items() if st != warm}
    sigs = Counter(_signature(b[0]) for b in cand.values())
    ref_sig = sigs.most_common(1)[0][0]
    same = sorted(st for st, b in cand.items() if _signature(b[0]) == ref_sig)
    aligned = []
    if 2 * len(same) <= len(cand):  # no structure holds most steps: align the later ones with it
        # (steps before its first one are the run's warm-up: first profiled steps, autotuning)
        for st in sorted(x for x in set(cand) - set(same) if x > same[0]):
            segs_st = align_step(built[st][0], built[same[0]][0], steps[st][0], st, steps[same[0]][0])
            if segs_st is not None:
                live = {id(x) for x in segs_st}
                built[st] = _step_edges(segs_st, [p for p in per_step_pairs.get(st, [])
                                                  if id(p[0]) in live and id(p[1]) in live])
                aligned.append(st)
    kept = sorted(same + aligned)
    _reconcile_consumers(built, kept)
    dropped = sorted(set(cand) - set(kept))
    if warm is not None:
        notes.append(f"{rf.path.name}: step {warm}, the first profiled step, is left out as the capture's warm-up: "
                     f"its GPU was still running work launched before the capture began")
    if aligned:
        notes.append(f"{rf.path.name}: steps {aligned} differ in structure from step(s) {same}; aligned with step "
                     f"{same[0]} (ops matched by name and order; extra ops count as host time, missing ones as "
                     f"zero-length)")
    if dropped:
        notes.append(f"{rf.path.name}: steps {dropped} differ in structure from steps {same}; replaying {kept}")
    for c, x in carry_gpu_tails(built, kept, steps, rf.path.name, notes, gpu).items():
        # a stand-in (a step's own tail, one step earlier) is the same collective
        if id(x) in txn_of:
            txn_of[c] = txn_of[id(x)]
        if id(x) in bucket_of:
            bucket_of[c] = bucket_of[id(x)]
    name = f"worker{rf.rank}"
    nt = NodeTrace(info=NodeInfo(name=name, role="worker", rank=rf.rank, host=str(rf.meta.get("host_name", "host0"))))
    first = min(per_step)
    nt.first_step = {"step": first, "start": steps[first][0], "end": steps[first][1],
                     "cpu_ops": sorted({f"{s.layer or ''}/{_BRACKET.sub('', s.name)}" for s in per_step[first]
                                        if s.dev.startswith("cpu")})}
    period = gpu_bound_period(steps, gpu)
    if period is not None:
        nt.meta[GPU_PERIOD_META] = period
        notes.append(f"{rf.path.name}: GPU-bound: the GPU falls further behind the CPU at every step; the measured step "
                     f"is the GPU's period, {period / 1e3:.2f} ms (step-to-step start of each step's first GPU op), "
                     f"where it exceeds the CPU step")
    shapes = layer_shapes(rf)
    if shapes:  # the layers' input shapes, for the oracle (dpro/importers/kineto/shapes.py)
        nt.meta[LAYER_SHAPES] = shapes
    if open_p2p:  # removed by join_ranks
        nt.meta[OPEN_META] = list(open_p2p.values())
    edge_set: set[tuple[str, str]] = set()
    # Edges from every kept step, but only those that go forward in the first kept step's
    # timeline: heuristic edges that disagree between steps can then never form a cycle. A
    # blocking sync takes its place in that timeline at its end, so that the GPU op it waited
    # for (started inside it) comes before it, and an edge from it to that op, which an
    # aligned step can give (an op cut into another number of pieces names its launching
    # piece as the reference's waiting one), goes backwards and is left out.
    order: dict[str, int] = {}
    for st in [same[0]] + [x for x in kept if x != same[0]]:  # ops and timeline order from the reference step
        by_dev, edges, _ = built[st]
        ids: dict[int, str] = {}
        for dev, ss in by_dev.items():
            for k, s in enumerate(ss):
                oid = f"{s.name}@{dev}#{k}"
                ids[id(s)] = oid
                if oid not in nt.ops:
                    op = Op(id=oid, name=s.name, cat=s.cat or "OTHER", device=dev, layer=s.layer)
                    if s.cat == "COMM" and s.coll is not None:
                        # a collective without its issue in the trace (an NCCL kernel whose
                        # launch predates the capture) is named by its place on its queue
                        txn = txn_of.get(id(s), f"{s.coll}.unissued{k}")
                        op.sub_op = _SUB_OP.get(s.coll, "ALLREDUCE")
                        if s.p2p is not None and id(s) in txn_of:  # joined with its peer's (global_dfg)
                            op.sub_op = "SEND" if s.p2p[0] == "send" else "RECV"
                        op.tensor = f"bucket{bucket_of[id(s)]}" if id(s) in bucket_of else f"{s.coll}.{txn.split('.')[-1]}"
                        op.bytes = s.nbytes
                        op.txn = txn
                        op.group = s.group
                    nt.ops[oid] = op
                nt.events.append(Event(oid, st, s.ts, s.end - s.ts))
        if not order:
            ranked = sorted((s for ss in by_dev.values() for s in ss),
                            key=lambda s: (s.end if s.sync is not None else s.ts, s.end))
            order = {ids[id(s)]: i for i, s in enumerate(ranked)}
        for a, b in edges:
            ia, ib = ids[id(a)], ids[id(b)]
            if order[ia] < order[ib] or (a.dev == b.dev and ia != ib):
                edge_set.add((ia, ib))
        t0, t1 = steps[st]
        nt.steps[st] = (t0, t1 - t0)
    end_id = f"{STEP_END}@cpu:main"
    nt.ops[end_id] = Op(id=end_id, name=STEP_END, cat="OTHER", device="cpu:main")
    last: dict[str, str] = {}
    for oid in list(nt.ops)[:-1]:
        last[nt.ops[oid].device] = oid  # ops are inserted in device order
    edge_set.update((oid, end_id) for oid in last.values())
    for st in kept:
        t0, dur = nt.steps[st]
        nt.events.append(Event(op=end_id, step=st, ts=t0 + dur, dur=0.0))
    nt.edges = sorted(edge_set)
    return nt


_SUB_OP = {
    "allreduce": "ALLREDUCE",
    "broadcast": "BROADCAST",
    "allgather": "ALLGATHER",
    "allgatherbase": "ALLGATHER",
    "allgatherintocoalesced": "ALLGATHER",
    "reducescatter": "REDUCESCATTER",
    "reducescatterbase": "REDUCESCATTER",
    "alltoall": "ALLTOALL",
    "alltoallbase": "ALLTOALL",
    "alltoallv": "ALLTOALL",
    "allgatherintotensor": "ALLGATHER",
    "allgatherintotensorcoalesced": "ALLGATHER",
    "reducescattertensor": "REDUCESCATTER",
    "reducescattertensorcoalesced": "REDUCESCATTER",
    "reduce": "ALLREDUCE",
    "send": "SENDRECV",
    "recv": "SENDRECV",
    "barrier": "BARRIER",
    "sendrecv": "SENDRECV",
}


@dataclass(frozen=True)
class RankTask:
    """One rank file to import: what :func:`import_rank` needs, picklable."""

    path: Path
    rank_pattern: str
    #: the file's place in the sorted file list (its rank when nothing else says one)
    index: int
    #: the read options of the caller (a worker process does not inherit them)
    options: ReadOptions = field(default_factory=ReadOptions)


@dataclass
class RankResult:
    """One rank, imported: all that the cross-rank join needs (the raw events are gone)."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    node: NodeTrace
    notes: list[str] = field(default_factory=list)

    def __getstate__(self) -> dict:
        """Pickled (back from a worker process) with the node's events as four columns and
        its ops as one tuple of field values each: a tenth of the time of pickling each
        :class:`Event` object, a quarter for the ops (a slotted dataclass is pickled and
        rebuilt field by field in Python)."""
        nt = self.node
        names = {k: k for k in nt.ops}  # one string per op name, in the pickle and here
        ev = nt.events
        cols = ([names.get(e.op, e.op) for e in ev], [e.step for e in ev], [e.ts for e in ev], [e.dur for e in ev])
        state = dict(self.__dict__)
        state["node"] = replace(nt, events=[], ops={})
        state["_events"] = cols
        state["_ops"] = (list(nt.ops), list(map(_OP_FIELDS, nt.ops.values())))
        return state

    def __setstate__(self, state: dict) -> None:
        cols = state.pop("_events", None)
        ops = state.pop("_ops", None)
        self.__dict__.update(state)
        if cols is not None:
            self.node.events = list(map(Event, *cols))
        if ops is not None:
            self.node.ops = dict(zip(ops[0], starmap(Op, ops[1])))


#: an :class:`Op`'s field values, in the order ``Op(*values)`` takes them
_OP_FIELDS = attrgetter(*(f.name for f in fields(Op)))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off: reading and converting a rank makes no reference
    cycles (tests/test_kineto_gc.py), so its collections, run every few hundred new objects
    and ever longer as the rank's objects pile up, would only traverse live objects (they
    took about half of the import's CPU time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def import_rank(task: RankTask) -> RankResult:
    """Read and convert one rank file (a top-level function: it may run in a worker process)."""
    with _gc_paused(), read_options(**{f.name: getattr(task.options, f.name) for f in fields(ReadOptions)}):
        rf = load_rank_file(task.path, task.rank_pattern, task.index)
        notes: list[str] = []
        try:
            nt = convert_rank(rf, notes)
        except DproInputError:
            raise
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as e:
            raise DproInputError(rf.path, f"cannot interpret this Kineto trace ({type(e).__name__}: {e})") from None
        if not any(ev.op != f"{STEP_END}@cpu:main" for ev in nt.events):
            raise DproInputError(rf.path, "empty trace: no operator events inside the profiled steps")
        return RankResult(path=rf.path, rank=rf.rank, world_size=rf.world_size, backend=rf.backend, node=nt, notes=notes)


def import_kineto(path: str | Path, rank_pattern: str = DEFAULT_RANK_PATTERN, *, progress: bool | None = None,
                  mapper: Mapper | None = None) -> GTrace:
    """Read a directory (or one file) of torch.profiler traces as a GTrace.

    Each rank file is read and converted on its own by :func:`import_rank` (its raw events
    are dropped before the next one); the ranks are then joined. ``mapper(fn, items)``
    runs ``fn`` on each item and returns the results in item order (default: serially for
    one rank or small inputs, else a local process pool, :mod:`dpro.importers.kineto.pool`).
    ``progress``: show a progress bar on stderr (default: when stderr is a terminal).
    """
    path = Path(path)
    files = trace_files(path)
    check_rank_pattern(rank_pattern)
    opts = current_read_options()
    tasks = [RankTask(p, rank_pattern, i, opts) for i, p in enumerate(files)]
    if mapper is None:
        mapper = default_mapper([_size(p) for p in files])
    results = []
    # the collector paused here too: the results that come back from worker processes are
    # unpickled here (each rank's events, no cycles), and every collection would traverse
    # the ranks already in
    with _gc_paused(), progress_bar(len(files), "importing traces", enabled=progress) as tick:
        try:
            for r in mapper(import_rank, tasks):
                results.append(r)
                tick(r.path.name)
        except BrokenProcessPool:
            raise DproInputError(path, "a worker process importing the rank files died (out of memory?)") from None
        return join_ranks(path, results)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def join_ranks(path: Path, results: list[RankResult]) -> GTrace:
    """The GTrace of the imported ranks: one job (distinct ranks, one world size)."""
    seen: dict[int, Path] = {}
    for r in results:
        if r.rank in seen:
            raise DproInputError(r.path, f"rank {r.rank} also in {seen[r.rank].name} (set --rank-pattern?)")
        seen[r.rank] = r.path
    sized = [r for r in results if r.world_size is not None]
    for r in sized[1:]:
        if r.world_size != sized[0].world_size:
            raise DproInputError(
                r.path, f"world_size {r.world_size}, but {sized[0].path.name} says {sized[0].world_size}: not one job"
            )
    results = sorted(results, key=lambda r: r.rank)
    notes = [n for r in results for n in r.notes]
    resolve_open({r.rank: r.node for r in results}, notes)
    nodes = {r.node.info.name: r.node for r in results}
    world = max([r.world_size or 0 for r in results] + [max(r.rank for r in results) + 1])
    backend = next((r.backend for r in results if r.backend), None) or ("nccl" if any(
        is_comm_kernel(op.name) for nt in nodes.values() for op in nt.ops.values()) else "gloo")
    common = sorted(set.intersection(*(set(nt.steps) for nt in nodes.values())))
    if len(results) < world:
        notes.append(
            f"{len(results)} of {world} ranks present: collectives keep their measured durations (peers absent)"
        )
    manifest = Manifest(
        framework="pytorch",
        scheme="allreduce",
        library=backend,
        world_size=world,
        nodes=[nt.info for nt in nodes.values()],
        steps=common,
        meta={"importer": "kineto", "source": str(path), "files": {r.node.info.name: str(r.path) for r in results}},
    )
    return GTrace(manifest=manifest, nodes=nodes, source=None, notes=notes)
