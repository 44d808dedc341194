"""Cut one rank's Kineto events into replayable segments (the future DFG ops).

An *op* is an outermost CPU operator on a thread (annotations such as
``DistributedDataParallel.forward`` are transparent context), a GPU kernel / memcpy /
memset on a stream, or a collective executed by a communication thread (gloo).
A CPU op is cut into segments at the points where it emits work for another device:
the end of a kernel launch, the end of a collective issue (``c10d::*``), and the start
and end of a blocking CUDA synchronisation.  Each segment knows what it emitted, so the
dependency pass can join it to what it launched or waited for.
"""

from __future__ import annotations

import functools
import heapq
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from dpro.compiled import load_compiled
from dpro.contracts.recording import BUCKET_PREFIX, LAYER_PREFIX
from dpro.errors import DproInputError, brief
from dpro.importers.kineto.read import KEvent, PyFrames, RankFile

if TYPE_CHECKING:  # numpy is imported where the frames are checked: not at the CLI's start-up
    import numpy as np

CPU_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function", "Runtime"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_CALLS = {
    "cudaDeviceSynchronize": "device",
    "cudaStreamSynchronize": "stream",
    "cudaEventSynchronize": "event",
    "cudaMemcpy": "device",
}
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_NCCL_KERNEL_RE = re.compile(r"^nccl(Dev)?Kernel_([A-Za-z]+)")
DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8, "long int": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2,
    "char": 1, "int8": 1, "uint8": 1, "byte": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
}


@dataclass(slots=True)
class Seg:
    """A piece of work on one device queue within one step."""

    dev: str
    name: str
    ts: float
    end: float
    cat: str = ""
    step: int = -1
    #: correlation ids of kernel launches that end this segment
    launches: list[int] = field(default_factory=list)
    #: this segment ends with a collective issue (c10d::*)
    issue: bool = False
    #: kind of blocking CUDA sync this segment is ('device' | 'stream' | 'event')
    sync: str | None = None
    #: for GPU segments: correlation id of the launch
    corr: int | None = None
    #: for COMM segments: collective name (allreduce, broadcast, ...) and payload bytes
    coll: str | None = None
    nbytes: int = 0
    group: tuple[int, ...] | None = None
    #: the kernel's own arguments name the collective (``Collective name``)
    coll_from_args: bool = False
    #: process group name, where the trace gives it
    pg: str | None = None
    #: elements of the collective's tensor (issue and gloo execution segments; 0 unknown):
    #: what pairs an issue with its execution (docs/kineto.md)
    numel: int = 0
    #: model layer (innermost ``dpro.layer::`` annotation), DDP bucket of the issued
    #: collective (``dpro.bucket::``), autograd sequence numbers of the op and its children
    layer: str | None = None
    bucket: int | None = None
    seqs: list[int] = field(default_factory=list)
    #: collectives this segment launched, as the CPU side describes them (``record_param_comms``,
    #: ``nccl:*``, ``c10d::*``): correlation id of the launch -> :class:`CommInfo`
    comm_info: dict[int, "CommInfo"] = field(default_factory=dict)
    #: point-to-point issue (``c10d::send`` / ``c10d::recv_``) or execution (``gloo:send`` /
    #: ``gloo:recv``): ('send' | 'recv', peer rank, tag); the peer is the issue's (None: unknown)
    p2p: tuple[str, int, int] | None = None
    #: the thread that recorded a gloo execution (its process group's worker pool, see
    #: dpro/importers/kineto/groups.py)
    thread: object = None


@dataclass(slots=True)
class CommInfo:
    """A collective as its CPU-side events describe it (0 / None: not said)."""

    kind: str
    numel: int = 0
    nbytes: int = 0
    group: tuple[int, ...] | None = None
    #: the kernel's own arguments name the collective (``Collective name``)
    coll_from_args: bool = False
    #: the process group's name (``Process Group Name``), where the trace gives it
    pg: str | None = None
    #: a point-to-point issue's ('send' | 'recv', peer, tag) (:func:`p2p_of`)
    p2p: tuple[str, int, int] | None = None


#: the ``args`` of an event that has none: one shared, read-only mapping, not a new dict
#: per event (a 1 GB trace has millions of events)
_NO_ARGS: Mapping = MappingProxyType({})


@dataclass(slots=True)
class _Ev:
    name: str
    cat: str
    ts: float
    end: float
    args: Mapping
    children: list["_Ev"] = field(default_factory=list)


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a Kineto dtype string (4 when unknown)."""
    return DTYPE_BYTES.get(str(dtype).lower().replace("c10::", ""), 4)


def _numel(dims: object) -> int:
    """Elements of the first tensor in a Kineto 'Input Dims' value (lists may nest)."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        if isinstance(dims[0][0] if dims[0] else None, list):
            dims = dims[0]
            continue
        dims = dims[0]
        break
    n = 1
    if not isinstance(dims, list):
        return 0
    for x in dims:
        if not isinstance(x, int):
            return 0
        n *= x
    return n


def _coll_name(name: str) -> str:
    """'gloo:all_reduce' / 'ncclKernel_AllReduce_RING...' / 'c10d::allreduce_' -> 'allreduce'."""
    m = _NCCL_KERNEL_RE.match(name)
    if m:
        return m.group(2).lower()
    base = name.split(":")[-1].strip("_")
    return base.replace("_", "").lower() or "collective"


def _comm_numel(args: dict) -> int:
    if "In msg nelems" in args:
        return int(args["In msg nelems"])
    return _numel(args.get("Input Dims"))


def _comm_bytes(args: dict) -> int:
    if "In msg nelems" in args:
        dtype = args.get("dtype", "float")
    else:
        dtype = (args.get("Input type") or ["float"])[0]
    return _comm_numel(args) * dtype_bytes(dtype)


def _group(args: dict) -> tuple[int, ...] | None:
    g = args.get("Process Group Ranks")
    if isinstance(g, str) and g.startswith("["):
        try:
            return tuple(int(x) for x in g.strip("[]").split(",") if x.strip())
        except ValueError:
            return None
    return None


def _update_comm_info(info: CommInfo, name: str, args: dict) -> None:
    """Fill ``info`` from one CPU-side event of the collective: kind, size, dtype, group.

    ``record_param_comms`` of PyTorch >= 2.1 says ``Collective name``, ``In msg nelems``,
    ``dtype``, ``Process Group Name`` / ``Ranks``; older ones and the ``nccl:*`` record
    functions give the tensor's ``Input Dims`` and ``Input type`` (needs record_shapes)."""
    cname = args.get("Collective name")
    if isinstance(cname, str) and cname:
        info.kind = cname.replace("_", "").lower()
    elif name.startswith("nccl:"):
        info.kind = _coll_name(name)
    dims = args.get("Input Dims")
    first = dims[0] if isinstance(dims, list) and dims else None
    # a later (more deeply nested, more specific) event overrides; an empty first dims
    # list is a TensorList or a scalar argument, not the collective's tensor
    if "In msg nelems" in args or (isinstance(first, list) and first):
        try:
            numel = _comm_numel(args)
        except (TypeError, ValueError):
            numel = 0
        if numel > 0:
            info.numel, info.nbytes = numel, _comm_bytes(args)
    info.group = info.group or _group(args)
    pg = args.get("Process Group Name")
    if isinstance(pg, (str, int)) and not info.pg:
        info.pg = str(pg)


def is_issue(name: str) -> bool:
    """A CPU op that issues a collective (its execution is elsewhere)."""
    return name.startswith("c10d::") and not name.startswith(("c10d::wait", "c10d::monitored_barrier"))


#: point-to-point issues and the index of the peer rank in their ``Concrete Inputs``
#: (``c10d::send(tensors, process_group, dstRank, tag)``, ``c10d::recv_(..., srcRank, tag)``)
P2P_ISSUES = {"c10d::send": "send", "c10d::recv_": "recv"}


def p2p_of(name: str, args: Mapping) -> tuple[str, int, int] | None:
    """('send' | 'recv', peer, tag) of a point-to-point issue; None for anything else or
    where the trace does not give the peer (a receive from any source)."""
    kind = P2P_ISSUES.get(name)
    ci = args.get("Concrete Inputs")
    if kind is None or not isinstance(ci, list) or len(ci) < 4:
        return None
    try:
        return kind, int(ci[2]), int(ci[3])
    except (TypeError, ValueError):
        return None


def is_comm_kernel(name: str) -> bool:
    return bool(_NCCL_KERNEL_RE.match(name))


#: categories of a CPU-side ProfilerStep#N span (legacy ``Operator`` is read as cpu_op);
#: ``gpu_user_annotation`` is the copy of the span that Kineto draws on the GPU timeline
CPU_STEP_CATS = frozenset({"user_annotation", "cpu_op"})


def step_markers(rf: RankFile) -> tuple[list[KEvent], bool]:
    """The ProfilerStep#N spans that define the steps, and whether they are CPU-side.

    The CPU-side spans (on the thread that holds most of them) when there are any; else
    every ProfilerStep#N span (the GPU annotation timeline's copies). Computed once per
    ``rf`` (read-only).
    """
    if rf.step_markers is None:
        rf.step_markers = _step_markers(rf)
    return rf.step_markers


def _step_markers(rf: RankFile) -> tuple[list[KEvent], bool]:
    marks = [e for e in rf.events if e.name.startswith("ProfilerStep#") and _STEP_RE.match(e.name)]
    cpu = [e for e in marks if e.cat in CPU_STEP_CATS]
    if not cpu:
        return marks, False
    per_tid: dict[object, int] = {}
    for e in cpu:
        per_tid[e.tid] = per_tid.get(e.tid, 0) + 1
    best = max(per_tid.values())
    tid = next(e.tid for e in cpu if per_tid[e.tid] == best)
    return [e for e in cpu if e.tid == tid], True


def find_steps(rf: RankFile, notes: list[str] | None = None) -> dict[int, tuple[float, float]]:
    """ProfilerStep#N windows: step -> (start, end), from :func:`step_markers` (the
    longest span where a step number repeats).

    The last CPU-side span is not a step where it holds no other CPU-side event of its
    thread and another step precedes it: the span that the last ``prof.step()`` opens and
    the profiler's exit closes, cut by the capture's end (hta_amd_mi250: a 49 µs
    ProfilerStep#2 after the 9.29 ms step 1); ``notes`` says so."""
    marks, on_cpu = step_markers(rf)
    steps: dict[int, tuple[float, float]] = {}
    for e in marks:
        n = int(_STEP_RE.match(e.name).group(1))  # type: ignore[union-attr]
        t0 = e.ts
        t1 = t0 + e.dur
        if n not in steps or t1 - t0 > steps[n][1] - steps[n][0]:
            steps[n] = (t0, t1)
    if on_cpu and len(steps) > 1:
        last = max(steps, key=lambda n: steps[n][0])
        t0, t1 = steps[last]
        tid = marks[0].tid
        if not any(t0 <= e.ts < t1 and e.tid == tid and e.cat in CPU_CATS and not _STEP_RE.match(e.name)
                   for e in rf.events):
            del steps[last]
            if notes is not None:
                notes.append(f"{rf.path.name}: ProfilerStep#{last} ({t1 - t0:.0f} us) holds no operator: the span "
                             f"the profiler's exit closed, cut by the capture's end; not a step")
    return steps


def _min_open_end(spans: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The step function ``f(t) = min{end : ts <= t < end}`` over ``spans`` (inf where none
    is open): breakpoints ``b`` (sorted) and values ``v``, ``f(t) = v[k]`` for ``b[k] <= t <
    b[k+1]``."""
    import numpy as np

    spans = sorted(spans)
    times = sorted({t for sp in spans for t in sp})
    heap: list[float] = []
    vals: list[float] = []
    j, n = 0, len(spans)
    for b in times:
        while j < n and spans[j][0] <= b:
            heapq.heappush(heap, spans[j][1])
            j += 1
        while heap and heap[0] <= b:
            heapq.heappop(heap)
        vals.append(heap[0] if heap else np.inf)
    return np.array(times, dtype=float), np.array(vals, dtype=float)


def _frames_needed(evs: list[_Ev], py: PyFrames) -> np.ndarray:
    """The python frames of ``py`` (indices) without which the tree of one thread's events
    ``evs`` would not be the same to the converter; usually none or a few.

    A frame is transparent context (``cpu_segments`` and ``_cut`` look through it), so the
    tree without a set D of frames is the tree with them with each frame of D replaced by
    its children, unless a frame of D outlives a kept event open where the frame starts
    (``x.ts <= frame.ts < x.end < frame.end``; e.g. a record_function's own Python exit
    frames, recorded past its ``user_annotation``): later events could then nest under the
    frame, inside ``x``'s subtree, where without it they are siblings of ``x``. (The
    builder's stack is a root-to-leaf path: an event's nearest kept ancestor is the same in
    both trees when no frame of D ends later than a kept event open at its start.) So the
    frames that do are kept, and the check is repeated with them until none is left.
    """
    import numpy as np

    ts = np.frombuffer(py.ts, dtype=float)
    end = ts + np.frombuffer(py.dur, dtype=float)
    keep = np.zeros(len(ts), dtype=bool)
    spans = [(x.ts, x.end) for x in evs]
    while spans:
        b, v = _min_open_end(spans)
        k = np.searchsorted(b, ts, side="right") - 1
        bad = (end > np.where(k >= 0, v[np.maximum(k, 0)], np.inf)) & ~keep
        if not bad.any():
            break
        keep |= bad
        spans += zip(ts[bad].tolist(), end[bad].tolist())
    return np.flatnonzero(keep)


def _build_trees(evs: list[KEvent], py: PyFrames | None = None) -> list[_Ev]:
    """Nest one thread's events by time; returns the roots. ``py``: the thread's python
    frames, of which only those are put in the tree that change it (:func:`_frames_needed`).
    The compiled loop (``_segments.c``) makes the items and nests them when it was built."""
    fast = _compiled()
    if isinstance(fast, str):
        items = [_Ev(e.name, e.cat or "", e.ts, e.ts + e.dur, e.args or _NO_ARGS) for e in evs]
    else:
        items = fast.make_evs(evs, _Ev, _spec(_Ev), _NO_ARGS)
    if py is not None and len(py):
        items += [_Ev("python_function", "python_function", py.ts[i], py.ts[i] + py.dur[i], _NO_ARGS)
                  for i in _frames_needed(items, py).tolist()]
    if not isinstance(fast, str):
        return fast.nest(items)
    items.sort(key=lambda x: (x.ts, -x.end))
    roots: list[_Ev] = []
    stack: list[_Ev] = []
    for x in items:
        while stack and x.ts >= stack[-1].end:
            stack.pop()
        (stack[-1].children if stack else roots).append(x)
        stack.append(x)
    return roots


def cpu_threads(rf: RankFile) -> dict[object, list[KEvent]]:
    """Each thread's CPU-side events (:data:`CPU_CATS`), the threads in the order of their
    first CPU-side event in the file, python frames (``rf.python``) included: a thread of
    python frames alone has an empty list."""
    by_tid: dict[object, list[KEvent]] = {}
    first: dict[object, float] = {}
    for k, e in enumerate(rf.events):
        if e.cat in CPU_CATS:
            evs = by_tid.get(e.tid)
            if evs is None:
                evs = by_tid[e.tid] = []
                first[e.tid] = k
            evs.append(e)
    for tid, f in rf.python.items():  # a frame counted f.first kept events before it: it came first
        if tid not in first or f.first <= first[tid]:
            first[tid] = f.first - 0.5
    return {t: by_tid.get(t, []) for t in sorted(first, key=first.__getitem__)}


def _context_cat(names: list[str]) -> str:
    for n in names:
        if n.startswith(("Optimizer.", "## optimizer")) or "optimizer" in n.lower() and "zero_grad" in n.lower():
            return "UPDATE"
        if n.startswith("enumerate(DataLoader)") or n.startswith("## data"):
            return "IO"
    return ""


def _op_cat(name: str, ctx: str) -> str:
    if ctx:
        return ctx
    if "Backward" in name or name.startswith("autograd::engine") or "reducer::" in name:
        return "BW"
    return ""


def _cut(op: _Ev, dev: str, cat: str, layer: str | None = None) -> list[Seg]:
    """Cut an outermost CPU op at its emission points."""
    if not op.children and op.cat != "cuda_runtime" and op.cat != "cuda_driver" and not is_issue(op.name):
        # nothing inside emits work (a third of the ops): one segment, what the general path gives
        seg = Seg(dev, op.name, op.ts, op.end, cat, layer=layer)
        own = op.args.get("Sequence number")
        if isinstance(own, int):
            seg.seqs.append(own)
        return [seg]
    points: list[tuple[float, str, object]] = []

    seqs: list[int] = []
    bucket: list[int] = []

    comm_info: dict[int, CommInfo] = {}
    nested: list[_Ev] = []  # gloo executions recorded inside the issue (gloo:send)

    def walk(x: _Ev, issue: CommInfo | None) -> None:
        for c in x.children:
            sq = c.args.get("Sequence number")
            if isinstance(sq, int):
                seqs.append(sq)
            if c.name.startswith(BUCKET_PREFIX) and c.name[len(BUCKET_PREFIX):].isdigit():
                bucket.append(int(c.name[len(BUCKET_PREFIX):]))
            if c.cat == "cuda_runtime" or c.cat == "cuda_driver":
                kind = SYNC_CALLS.get(c.name)
                if kind:
                    points.append((c.ts, "sync_start", kind))
                    points.append((c.end, "sync_end", kind))
                elif "correlation" in c.args:
                    corr = _correlation(c.name, c.ts, c.args)
                    points.append((c.end, "launch", corr))
                    if issue is not None:
                        comm_info[corr] = replace(issue)
            elif is_issue(c.name) and issue is None:
                info = CommInfo(_coll_name(c.name), p2p=p2p_of(c.name, c.args))
                _update_comm_info(info, c.name, c.args)
                walk(c, info)
                points.append((c.end, "issue", (bucket.pop() if bucket else None, _comm_numel(c.args))))
                continue
            else:
                if issue is not None and c.name.startswith("gloo:"):
                    nested.append(c)
                if issue is not None and (c.name.startswith("nccl:") or c.name == "record_param_comms"):
                    _update_comm_info(issue, c.name, c.args)
                walk(c, issue)

    if op.cat in ("cuda_runtime", "cuda_driver"):
        walk(_Ev("", "", op.ts, op.end, {}, [op]), None)
    else:
        root = None
        if is_issue(op.name):
            root = CommInfo(_coll_name(op.name), p2p=p2p_of(op.name, op.args))
            _update_comm_info(root, op.name, op.args)
        walk(op, root)
        if is_issue(op.name):
            points.append((op.end, "issue", (None, _comm_numel(op.args))))
    walk = None  # type: ignore[assignment]  # it refers to itself (a cycle): freed now, not by the collector
    segs: list[Seg] = []
    cur = Seg(dev, op.name, op.ts, op.ts, cat)
    for t, kind, payload in sorted(points, key=lambda p: p[0]):
        t = min(max(t, cur.ts), op.end)
        if kind == "sync_start":
            if t > cur.ts or cur.launches or cur.issue:
                cur.end = t
                segs.append(cur)
            cur = Seg(dev, f"{op.name}", t, t, cat, sync=str(payload))
            continue
        if kind == "launch":
            cur.launches.append(int(payload))  # type: ignore[arg-type]
            if payload in comm_info:
                cur.comm_info[int(payload)] = comm_info[payload]  # type: ignore[index]
        elif kind == "issue":
            cur.issue = True
            cur.bucket, cur.numel = payload  # type: ignore[misc]
        if kind == "sync_end" or kind == "issue" or (kind == "launch" and t > cur.ts):
            cur.end = t
            segs.append(cur)
            cur = Seg(dev, f"{op.name}", t, t, cat)
    cur.end = op.end
    if cur.end > cur.ts or not segs or cur.launches:
        segs.append(cur)
    for i, s in enumerate(segs):
        s.layer = layer
        if len(segs) > 1:
            s.name = f"{op.name}[{i}]"
    own = op.args.get("Sequence number")
    segs[0].seqs = ([own] if isinstance(own, int) else []) + seqs
    p2p = p2p_of(op.name, op.args)
    if p2p is not None:
        issue_seg = next((x for x in segs if x.issue), segs[-1])
        issue_seg.p2p = p2p
        if p2p[0] == "send" and len(nested) == 1 and not any(x.launches for x in segs):
            # gloo runs the send inside its issue and records gloo:send at the issue's end,
            # but the data can leave at once (the receiver had it up to 45 ms before that
            # record started): the send is the whole op, issued at its start, and the thread
            # is blocked until it ends, as it is in a receive (docs/kineto.md)
            c = nested[0]
            issue_seg.seqs, issue_seg.name = segs[0].seqs, op.name
            issue_seg.ts = issue_seg.end = op.ts
            exec_seg = Seg("comm", c.name, op.ts, max(c.end, op.end), "COMM", coll=_coll_name(c.name),
                           nbytes=_comm_bytes(c.args), numel=_comm_numel(c.args))
            exec_seg.p2p = p2p
            return [issue_seg, exec_seg]
    for c in nested:  # executed on the calling thread, inside the issue: a collective of its own
        exec_seg = Seg("comm", c.name, c.ts, c.end, "COMM", coll=_coll_name(c.name), nbytes=_comm_bytes(c.args),
                       numel=_comm_numel(c.args))
        exec_seg.p2p = p2p
        segs.append(exec_seg)  # cpu_segments moves it to the collectives
    return segs


def _gloo_seg(x: _Ev, tid: object) -> Seg:
    """A gloo execution recorded as an annotation on a communication thread."""
    return Seg("comm", x.name, x.ts, x.end, "COMM", coll=_coll_name(x.name), nbytes=_comm_bytes(x.args),
               numel=_comm_numel(x.args), thread=tid)


#: the fields the compiled loop sets by position (``_segments.c``: F_* for Seg, make_evs for _Ev)
_C_FIELDS = {
    "Seg": ("dev", "name", "ts", "end", "cat", "step", "launches", "issue", "sync", "corr", "coll", "nbytes", "group",
            "coll_from_args", "pg", "numel", "layer", "bucket", "seqs", "comm_info", "p2p", "thread"),
    "_Ev": ("name", "cat", "ts", "end", "args", "children"),
}


@functools.cache
def _spec(cls: type) -> tuple:
    """Per field of the slotted dataclass ``cls`` (:class:`Seg`, :class:`_Ev`), in order:
    (its slot descriptor, default, default factory or None): how the compiled loop makes
    one as ``cls(...)`` does, without running its __init__ (most of the cost of a Seg)."""
    import dataclasses

    fs = dataclasses.fields(cls)
    if tuple(f.name for f in fs) != _C_FIELDS[cls.__name__]:
        raise RuntimeError(f"segments.{cls.__name__} changed: update _segments.c and segments._C_FIELDS")
    return tuple((cls.__dict__[f.name], None if f.default is dataclasses.MISSING else f.default,
                  None if f.default_factory is dataclasses.MISSING else f.default_factory) for f in fs)


def _context_name(name: str) -> str:
    return _context_cat([name])


def _compiled():
    """The compiled thread visit (``dpro.importers.kineto._segments``), or why it cannot be
    loaded (a string): built by setup.py with the replay core; optional."""
    return load_compiled("dpro.importers.kineto._segments")


def cpu_segments(rf: RankFile, main_tid: object) -> tuple[list[Seg], list[Seg]]:
    """Segments of every CPU thread, and the collectives run by communication threads.

    Returns (cpu segments, gloo-style collective segments in start order). Each thread's
    tree is visited by the compiled loop (``_segments.c``: the ops that issue no
    collective cut there, the others by :func:`_cut`) when it was built, else in Python;
    the two give the same segments (tests/test_kineto_segments_c.py).
    """
    fast = _compiled()
    by_tid = cpu_threads(rf)

    def start(t: object) -> float:
        f = rf.python.get(t)
        return min([e.ts for e in by_tid[t]] + ([min(f.ts)] if f is not None else []))

    thread_names: dict[object, str] = {}
    order = ([main_tid] if main_tid in by_tid else []) + sorted((t for t in by_tid if t != main_tid), key=start)
    segs: list[Seg] = []
    comm: list[Seg] = []
    for tid in order:
        roots = _build_trees(by_tid[tid], rf.python.get(tid))

        def visit(x: _Ev, ctx: str, layer: str | None, dev: str) -> None:
            """``ctx``: the category of the annotations around ``x`` (:func:`_context_cat`:
            the outermost that gives one), ``layer``: the innermost layer annotation's."""
            if x.cat == "user_annotation" or _STEP_RE.match(x.name):
                if x.name.startswith("gloo:"):
                    comm.append(_gloo_seg(x, tid))
                    return
                inner = ctx or _context_cat([x.name])
                if x.name.startswith(LAYER_PREFIX):
                    layer = x.name[len(LAYER_PREFIX):]
                for c in x.children:
                    visit(c, inner, layer, dev)
                return
            if x.cat == "python_function":
                for c in x.children:
                    visit(c, ctx, layer, dev)
                return
            for sg in _cut(x, dev, _op_cat(x.name, ctx), layer):
                if sg.dev == "comm":
                    sg.thread = tid
                (comm if sg.dev == "comm" else segs).append(sg)

        dev = thread_names.setdefault(tid, "cpu:main" if tid == main_tid else f"cpu:t{len(thread_names)}")
        try:
            if not isinstance(fast, str):
                fast.visit_thread(roots, tid, dev, segs, comm, Seg, _spec(Seg), _cut, _gloo_seg, _context_name,
                                  _STEP_RE.match, LAYER_PREFIX, SYNC_CALLS)
            else:
                for r in roots:
                    visit(r, "", None, dev)
        except RecursionError:  # both visits recurse once per level of nesting
            raise DproInputError(rf.path, f"thread {brief(tid)}: complete events nested too deep "
                                          "(hundreds of levels, each inside the previous)") from None
        except BadCorrelation as e:
            raise DproInputError(rf.path, str(e)) from None
        finally:
            visit = None  # type: ignore[assignment]  # a reference cycle (see _cut)
    return segs, comm


class BadCorrelation(ValueError):
    """An event whose ``args.correlation`` is not an integer id (the message names it)."""


def _correlation(name: str, ts: float, args: dict) -> int:
    """An event's ``args["correlation"]`` as an int; :class:`BadCorrelation` if it is none."""
    v = args["correlation"]
    try:
        return int(v)
    except (TypeError, ValueError):
        raise BadCorrelation(f"{brief(name)} at ts {brief(ts)}: args.correlation {brief(v)} is not an integer id") from None


def gpu_segments(rf: RankFile) -> list[Seg]:
    """Kernels, memcpys and memsets, one device per (GPU, stream)."""
    out = []
    for e in rf.events:
        if e.cat not in GPU_CATS:
            continue
        a = e.args or {}
        dev = f"gpu{a.get('device', 0)}:s{a.get('stream', e.tid)}"
        name = e.name
        s = Seg(dev, name, e.ts, e.ts + e.dur)
        try:
            s.corr = _correlation(name, e.ts, a) if "correlation" in a else None
        except BadCorrelation as err:
            raise DproInputError(rf.path, str(err)) from None
        if is_comm_kernel(name):
            s.cat = "COMM"
            s.coll = str(a.get("Collective name") or _coll_name(name)).lower().replace("_", "")
            s.coll_from_args = bool(a.get("Collective name"))
            s.nbytes = _comm_bytes(a)
            s.group = _group(a)
            pg = a.get("Process Group Name")
            s.pg = str(pg) if isinstance(pg, (str, int)) else None
        out.append(s)
    return out
