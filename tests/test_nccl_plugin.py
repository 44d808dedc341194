"""dpro's NCCL profiler plugin (native/nccl_patch) and its converter, driven by a mock NCCL.

There is no GPU and no NCCL here: these tests build the plugin with gcc, load it with
ctypes and call its callbacks the way NCCL's host thread and proxy thread do (the order
and arguments of NCCL's own instrumentation in src/plugin/profiler.cc and
src/transport/net.cc), for 4 "ranks" that are 4 communicator contexts in this process.
The plugin's clock is pinned by its test hook (dpro_nccl_trace_test_set_clock) so every
timestamp is known. What a real NCCL would do differently (which events it emits for a
given topology, how its proxy interleaves them) is NOT validated here.
"""

from __future__ import annotations

import ctypes as C
import os
import shutil
import subprocess
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.graph.global_dfg import build_global_dfg
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.gtrace.validate import validate
from dpro.importers import nccl as NP

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "native" / "nccl_patch"

# NCCL event types / states (the plugin interface's values)
COLL, P2P, PROXY_OP, PROXY_STEP, KERNEL_CH = 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 6
ST_OP_PROGRESS = 19
ST_SEND_GPU, ST_SEND_PEER, ST_SEND_NET = 8, 20, 9
ST_RECV_POSTED, ST_RECV_FLUSH, ST_RECV_GPU = 10, 11, 12


# --------------------------------------------------------------------------- ctypes ABI


class _ProxyOp(C.Structure):
    _fields_ = [("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int), ("nSteps", C.c_int),
                ("chunkSize", C.c_int), ("isSend", C.c_int)]


class _Step(C.Structure):
    _fields_ = [("step", C.c_int)]


class _KernelCh(C.Structure):
    _fields_ = [("channelId", C.c_uint8), ("pTimer", C.c_uint64)]


class _CollV5(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p), ("recvBuff", C.c_void_p),
                ("count", C.c_size_t), ("root", C.c_int), ("datatype", C.c_char_p), ("nChannels", C.c_uint8),
                ("nWarps", C.c_uint8), ("algo", C.c_char_p), ("proto", C.c_char_p), ("parentGroup", C.c_void_p)]


class _UnionV5(C.Union):
    _fields_ = [("coll", _CollV5), ("proxyOp", _ProxyOp), ("proxyStep", _Step), ("kernelCh", _KernelCh),
                ("_ce", C.c_uint8 * 96)]


class DescrV5(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", _UnionV5)]


class _CollV4(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p), ("recvBuff", C.c_void_p),
                ("count", C.c_size_t), ("root", C.c_int), ("datatype", C.c_char_p), ("nChannels", C.c_uint8),
                ("nWarps", C.c_uint8), ("algo", C.c_char_p), ("proto", C.c_char_p)]


class _UnionV4(C.Union):
    _fields_ = [("coll", _CollV4), ("proxyOp", _ProxyOp), ("proxyStep", _Step), ("kernelCh", _KernelCh)]


class DescrV4(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint8), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", _UnionV4)]


class _CollV3(C.Structure):
    _fields_ = [("name", C.c_char_p), ("commHash", C.c_uint64), ("seqNumber", C.c_uint64), ("func", C.c_char_p),
                ("sendBuff", C.c_void_p), ("recvBuff", C.c_void_p), ("count", C.c_size_t), ("root", C.c_int),
                ("datatype", C.c_char_p), ("nMaxChannels", C.c_uint8), ("nWarps", C.c_uint8), ("algo", C.c_char_p),
                ("proto", C.c_char_p)]


class _UnionV3(C.Union):
    _fields_ = [("coll", _CollV3), ("proxyOp", _ProxyOp), ("proxyStep", _Step)]


class DescrV3(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint8), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", _UnionV3)]


class StateArgs(C.Union):
    _fields_ = [("transSize", C.c_size_t), ("pTimer", C.c_uint64)]


_STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)
_RECORD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgs))
_FINAL = C.CFUNCTYPE(C.c_int, C.c_void_p)


def _profiler_struct(init, descr):
    class P(C.Structure):
        _fields_ = [("name", C.c_char_p), ("init", init),
                    ("startEvent", C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(descr))),
                    ("stopEvent", _STOP), ("recordEventState", _RECORD), ("finalize", _FINAL)]
    return P


ProfV5 = _profiler_struct(C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint64, C.POINTER(C.c_int), C.c_char_p,
                                      C.c_int, C.c_int, C.c_int, C.c_void_p), DescrV5)
ProfV4 = _profiler_struct(C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_int), C.c_char_p, C.c_uint64,
                                      C.c_int, C.c_int, C.c_int, C.c_void_p), DescrV4)
ProfV3 = _profiler_struct(C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_int)), DescrV3)


@pytest.fixture(scope="session")
def plugin_lib(tmp_path_factory) -> Path:
    """The plugin, built from native/nccl_patch with its Makefile (into a private dir)."""
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("gcc and make are needed to build native/nccl_patch")
    build = tmp_path_factory.mktemp("nccl_plugin_build")
    r = subprocess.run(["make", "-s", "-C", str(SRC), f"BUILD={build}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lib = build / "libnccl-profiler-dpro.so"
    assert lib.is_file() and (build / "bench").is_file()
    return lib


class Plugin:
    """The loaded plugin through its exported structs (what NCCL sees) and control API."""

    def __init__(self, path: Path) -> None:
        self.lib = C.CDLL(str(path))
        self.v5 = ProfV5.in_dll(self.lib, "ncclProfiler_v5")
        self.v6 = ProfV5.in_dll(self.lib, "ncclProfiler_v6")
        self.v4 = ProfV4.in_dll(self.lib, "ncclProfiler_v4")
        self.v3 = ProfV3.in_dll(self.lib, "ncclProfiler_v3")
        self.lib.dpro_nccl_trace_dropped.restype = C.c_ulonglong
        self.lib.dpro_nccl_trace_dropped_global.restype = C.c_ulonglong
        self.lib.dpro_nccl_trace_dropped_global.argtypes = [C.c_int]
        self.lib.dpro_nccl_trace_test_set_clock.argtypes = [C.c_ulonglong]
        self.lib.dpro_nccl_trace_mark_step.argtypes = [C.c_longlong]

    def clock(self, ns: int) -> None:
        self.lib.dpro_nccl_trace_test_set_clock(int(ns))

    def init(self, rank: int, nranks: int, comm_id: int = 0xC0FFEE, name: bytes = b"mock") -> tuple[int | None, int]:
        ctx, mask = C.c_void_p(), C.c_int(0)
        assert self.v5.init(C.byref(ctx), comm_id, C.byref(mask), name, nranks, nranks, rank, None) == 0
        return ctx.value, mask.value

    def start(self, ctx, d: DescrV5) -> int | None:
        h = C.c_void_p()
        assert self.v5.startEvent(ctx, C.byref(h), C.byref(d)) == 0
        return h.value

    def stop(self, h) -> None:
        assert self.v5.stopEvent(h) == 0

    def record(self, h, state: int, size: int = 0) -> None:
        a = StateArgs(transSize=size)
        assert self.v5.recordEventState(h, state, C.byref(a)) == 0

    def finalize(self, ctx) -> None:
        assert self.v5.finalize(ctx) == 0


@pytest.fixture
def plugin(plugin_lib, tmp_path, monkeypatch) -> Plugin:
    """The plugin writing into tmp_path/trace, state reset, real clock restored after."""
    for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "DPRO_NCCL_TRACE_EVENTS",
              "DPRO_NCCL_TRACE_PAUSED", "DPRO_NCCL_TRACE_KERNEL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("DPRO_NCCL_TRACE_DIR", str(tmp_path / "trace"))
    p = Plugin(plugin_lib)
    p.lib.dpro_nccl_trace_test_reset()
    yield p
    p.clock(0)
    p.lib.dpro_nccl_trace_test_reset()


def coll_descr(rank: int, seq: int, nbytes: int, nch: int, algo: bytes, func: bytes = b"AllReduce",
               proto: bytes = b"SIMPLE") -> DescrV5:
    d = DescrV5(type=COLL, rank=rank)
    d.coll.seqNumber, d.coll.func, d.coll.count, d.coll.datatype = seq, func, nbytes // 4, b"ncclFloat32"
    d.coll.nChannels, d.coll.nWarps, d.coll.algo, d.coll.proto = nch, 16, algo, proto
    return d


def op_descr(rank: int, parent, ch: int, peer: int, nsteps: int, chunk: int, send: bool) -> DescrV5:
    d = DescrV5(type=PROXY_OP, parentObj=parent, rank=rank)
    d.proxyOp.pid, d.proxyOp.channelId, d.proxyOp.peer = os.getpid(), ch, peer
    d.proxyOp.nSteps, d.proxyOp.chunkSize, d.proxyOp.isSend = nsteps, chunk, int(send)
    return d


def step_descr(rank: int, parent, i: int) -> DescrV5:
    d = DescrV5(type=PROXY_STEP, parentObj=parent, rank=rank)
    d.proxyStep.step = i
    return d


# --------------------------------------------------------------------------- a mock NCCL job

US = 1000  # ns
T0 = 1_790_000_000_000_000_000  # ns since the epoch (CLOCK_REALTIME-like)
STEP_NS = 10_000 * US
T_NET, T_RED, T_FLUSH, T_PROXY = 20 * US, 3 * US, 1 * US, 2 * US
CHUNK = 1 << 16


class MockJob:
    """Timeline of one collective per training step on N ranks, then replayed through the
    plugin's callbacks in global time order (what NCCL's threads would do)."""

    def __init__(self, plugin: Plugin, n: int = 4) -> None:
        self.p, self.n = plugin, n
        self.ctx = {}
        for r in range(n):
            self.ctx[r], mask = plugin.init(r, n)
            assert self.ctx[r] and mask == COLL | P2P | PROXY_OP | PROXY_STEP
        self.actions: list[tuple[int, int, object]] = []
        self.expected: dict[tuple[int, int, str], tuple[int, int]] = {}  # (step, rank, txn) -> (start, end) ns
        self.kernel: dict[tuple[int, int], tuple[int, int]] = {}  # (step, rank) -> kernel (start, end) ns
        self.seq = 0

    def at(self, t: int, fn) -> None:
        self.seq += 1
        self.actions.append((t, self.seq, fn))

    def run(self) -> None:
        """Play every callback at its time."""
        self.actions.sort(key=lambda a: (a[0], a[1]))
        for t, _, fn in self.actions:
            self.p.clock(t)
            fn()
        self.actions = []

    def mark(self, t: int, step: int) -> None:
        self.at(t, lambda: self.p.lib.dpro_nccl_trace_mark_step(step))

    # -- one collective: the host enqueues it, the proxy runs its ops ----------------------

    def collective(self, step: int, seq: int, t_enq: dict[int, int], algo: bytes, nch: int,
                   ops: dict[int, list[tuple[int, int, bool]]], times: dict, nbytes: int, txn: str) -> None:
        """ops: rank -> [(channel, peer, is_send)]; times[(rank, ch, peer, is_send, i)] =
        (start, s1, s2, s3, stop) ns of each network step."""
        handles: dict = {}
        nsteps = {k[:4]: 0 for k in times}
        for k in times:
            nsteps[k[:4]] = max(nsteps[k[:4]], k[4] + 1)
        for r in range(self.n):
            d = coll_descr(r, seq, nbytes, nch, algo)
            t = t_enq[r]

            def start_coll(r=r, d=d):
                handles[("coll", r)] = self.p.start(self.ctx[r], d)

            self.at(t, start_coll)
            self.at(t + US // 2, lambda r=r: self.p.stop(handles[("coll", r)]))
            for ch, peer, send in ops[r]:
                key = (r, ch, peer, send)
                last = max(v[4] for k, v in times.items() if k[:4] == key)

                def start_op(r=r, key=key, ch=ch, peer=peer, send=send):
                    handles[key] = self.p.start(self.ctx[r], op_descr(r, handles[("coll", r)], ch, peer, nsteps[key], CHUNK, send))
                    self.p.record(handles[key], ST_OP_PROGRESS)

                self.at(t + US, start_op)
                self.at(last + US // 2, lambda key=key: self.p.stop(handles[key]))
        for (r, ch, peer, send, i), (t0, s1, s2, s3, t1) in times.items():
            key = (r, ch, peer, send)
            sk = key + (i,)

            def start_step(r=r, key=key, sk=sk, i=i):
                handles[sk] = self.p.start(self.ctx[r], step_descr(r, handles[key], i))

            self.at(t0, start_step)
            states = (ST_SEND_GPU, ST_SEND_PEER, ST_SEND_NET) if send else (ST_RECV_POSTED, ST_RECV_FLUSH, ST_RECV_GPU)
            for st, ts in zip(states, (s1, s2, s3)):
                size = CHUNK if st in (ST_SEND_NET, ST_RECV_FLUSH) else 0
                self.at(ts, lambda sk=sk, st=st, size=size: self.p.record(handles[sk], st, size))
            self.at(t1, lambda sk=sk: self.p.stop(handles[sk]))
            src, dst = (r, peer) if send else (peer, r)
            ctxn = NP.chunk_txn(txn, ch, src, dst, i)
            self.expected[(step, r, ("S" if send else "R") + ctxn)] = (s3, t1) if send else (s2, s3)

    def finalize(self) -> None:
        for r in range(self.n):
            self.p.finalize(self.ctx[r])


def ring_times(n: int, nch: int, loops: int, t_in: dict[int, int], s: int = 2) -> tuple[dict, dict[int, int]]:
    """Network-step times of a SIMPLE ring AllReduce: send i of rank r forwards recv i-S of r
    (package doc of dpro.importers.nccl); one step on a link at a time.
    Returns (times, kernel end per rank)."""
    L = 2 * (n - 1)
    nsteps = L * s * loops
    times = {}
    end = {r: 0 for r in range(n)}
    for ch in range(nch):
        sent_done = {r: 0 for r in range(n)}
        arrive = {}  # (receiver, i) -> arrival ns
        for i in range(nsteps):
            for r in range(n):
                first = (i // s) % L == 0
                ready = t_in[r] + ch * US if first else arrive[(r, i - s)] + T_RED
                start = ready - US // 2
                post = max(ready + US // 4, sent_done[r])
                done = post + T_NET
                sent_done[r] = done
                nxt = (r + 1) % n
                times[(r, ch, nxt, True, i)] = (start, start, ready, post, done)
                arrive[(nxt, i)] = done - US // 4
            for r in range(n):
                prv = (r - 1) % n
                a = arrive[(r, i)]
                t0 = max(a - T_NET - US, t_in[r] - 3 * US)  # posted after the proxy op started
                times[(r, ch, prv, False, i)] = (t0, t0 + US // 2, a, a + T_FLUSH, a + T_FLUSH + T_RED)
                end[r] = max(end[r], a + T_FLUSH + T_RED)
    return times, end


def tree_times(parent: dict[int, int | None], nsteps: int, t_in: dict[int, int]) -> tuple[dict, dict[int, int]]:
    """Network-step times of a TREE AllReduce (one channel): reduce up, broadcast down."""
    children = defaultdict(list)
    for r, p in parent.items():
        if p is not None:
            children[p].append(r)
    times = {}
    end = {r: 0 for r in parent}
    up_arrive, down_arrive, link_free = {}, {}, defaultdict(int)
    order = sorted(parent, key=lambda r: -_depth(parent, r))  # leaves first
    for i in range(nsteps):
        for r in order:  # up
            if parent[r] is None:
                continue
            ready = max([t_in[r] + i * T_RED] + [up_arrive[(r, c, i)] + T_RED for c in children[r]])
            post = max(ready + US // 4, link_free[(r, parent[r])])
            done = post + T_NET
            link_free[(r, parent[r])] = done
            times[(r, 0, parent[r], True, i)] = (ready - US // 2, ready - US // 2, ready, post, done)
            up_arrive[(parent[r], r, i)] = done - US // 4
        for r in reversed(order):  # down
            if parent[r] is None:
                ready = max(up_arrive[(r, c, i)] for c in children[r]) + T_RED
            else:
                ready = down_arrive[(r, i)] + T_RED
            for c in children[r]:
                post = max(ready + US // 4, link_free[(r, c)])
                done = post + T_NET
                link_free[(r, c)] = done
                times[(r, 0, c, True, i)] = (ready - US // 2, ready - US // 2, ready, post, done)
                down_arrive[(c, i)] = done - US // 4
    for (r, _, peer, send, i) in list(times):
        if not send:
            continue
        a = up_arrive[(peer, r, i)] if parent.get(r) == peer else down_arrive[(peer, i)]
        t0 = max(a - T_NET - US, t_in[peer] - 3 * US)
        times[(peer, 0, r, False, i)] = (t0, t0 + US // 2, a, a + T_FLUSH, a + T_FLUSH + T_RED)
        end[peer] = max(end[peer], a + T_FLUSH + T_RED)
    return times, end


def _depth(parent, r):
    d = 0
    while parent[r] is not None:
        r, d = parent[r], d + 1
    return d


def run_job(plugin: Plugin, algo: str, steps=(1, 2, 3), n: int = 4, marks: bool = True):
    """Run the mock job; returns (job, per-step kernel spans, txn)."""
    job = MockJob(plugin, n)
    txn = "allreduce.0"
    for k, s in enumerate(steps):
        base = T0 + k * STEP_NS
        if marks:
            job.mark(base, s)
        t_enq = {r: base + 1000 * US + 7 * US * r for r in range(n)}  # ranks enqueue at different times
        t_in = {r: t_enq[r] + 5 * US for r in range(n)}               # the kernel starts on each rank
        if algo == "ring":
            times, end = ring_times(n, nch=2, loops=2, t_in=t_in)
            ops = {r: [(ch, (r + 1) % n, True) for ch in range(2)] + [(ch, (r - 1) % n, False) for ch in range(2)]
                   for r in range(n)}
            job.collective(s, k, t_enq, b"RING", 2, ops, times, 8 * CHUNK * 6 * n, txn)
        else:
            parent = {0: None, 1: 0, 2: 1, 3: 1}
            times, end = tree_times(parent, nsteps=3, t_in=t_in)
            ops = defaultdict(list)
            for (r, ch, peer, send, i) in times:
                if i == 0:
                    ops[r].append((ch, peer, send))
            job.collective(s, k, t_enq, b"TREE", 1, ops, times, 3 * CHUNK, txn)
        for r in range(n):
            job.kernel[(s, r)] = (t_in[r], end[r] + 2 * US)
    job.run()
    job.finalize()
    return job, txn


def gtrace_for(job: MockJob, steps, n: int, offsets: dict[int, float], nbytes: int) -> GTrace:
    """A Kineto-like gTrace of the same job: per rank FW -> BW -> NCCL kernel -> UPDATE on one
    GPU stream, the NCCL kernel spanning the collective; node clock = epoch µs + offset."""
    infos = [NodeInfo(f"worker{r}", "worker", r, "host0") for r in range(n)]
    nodes = {}
    for r, info in enumerate(infos):
        ops = {
            "fw": Op("fw", "fw", "FW", "gpu0:s7"),
            "bw": Op("bw", "bw", "BW", "gpu0:s7"),
            "ar": Op("ar", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "COMM", "gpu0:s13", sub_op="ALLREDUCE",
                     tensor="allreduce.0", bytes=nbytes, txn="allreduce.0", group=tuple(range(n))),
            "upd": Op("upd", "sgd", "UPDATE", "gpu0:s7"),
        }
        nt = NodeTrace(info, ops, [("fw", "bw"), ("bw", "ar"), ("ar", "upd")])
        for k, s in enumerate(steps):
            t0 = (T0 + k * STEP_NS) / 1000 + offsets[r]
            ks, ke = (x / 1000 + offsets[r] for x in job.kernel[(s, r)])
            nt.events += [Event("fw", s, t0 + 100, 300), Event("bw", s, t0 + 400, ks - (t0 + 400)),
                          Event("ar", s, ks, ke - ks), Event("upd", s, ke, 50)]
            nt.steps[s] = (t0, ke + 50 - t0 + 10)
        nodes[info.name] = nt
    return GTrace(Manifest("pytorch", "allreduce", "nccl", n, infos, list(steps)), nodes)


def only(d: dict):
    (v,) = d.values()
    return v


# --------------------------------------------------------------------------- tests: the plugin


def test_exports_all_interface_versions(plugin):
    assert plugin.v6.name == plugin.v5.name == plugin.v4.name == plugin.v3.name == b"dpro"


def test_ring_allreduce_events(plugin, tmp_path):
    """Every callback of a 4-rank, 2-channel SIMPLE ring AllReduce lands in the file of its
    rank with the right fields and times; the converter pairs each send with its receive."""
    job, txn = run_job(plugin, "ring", steps=(1,))
    files = NP.read_plugin_dir(tmp_path / "trace")
    assert sorted(f.path.name.split("_pid")[0] for f in files) == [f"nccl_rank{r}" for r in range(4)]
    views = NP.select_comm(files, nranks=4)
    assert sorted(views) == [0, 1, 2, 3]
    nsteps = 2 * 3 * 2 * 2  # 2(N-1) ring steps x S=2 slices x 2 loops
    for r, v in views.items():
        assert v.comm.interface == "v5" and v.comm.nranks == 4 and v.comm.hash == "0x0000000000c0ffee"
        assert v.comm.summary["dropped"] == {"full": 0, "bad_handle": 0, "bad_sequence": 0, "no_context": 0, "paused": 0}
        (c,) = v.comm.collectives()
        assert (c.func, c.algo, c.proto, c.nch, c.seq, c.dtype) == ("AllReduce", "RING", "SIMPLE", 2, 0, "ncclFloat32")
        assert len(c.ops) == 4 and all(o.nsteps == nsteps and len(o.steps) == nsteps for o in c.ops)
        assert {(o.channel, o.peer, o.is_send) for o in c.ops} == {
            (ch, (r + 1) % 4, True) for ch in range(2)} | {(ch, (r - 1) % 4, False) for ch in range(2)}
        assert all(s.bytes == CHUNK for o in c.ops for s in o.steps.values())
    pc = NP.collective_chunks({r: v.comm.collectives()[0] for r, v in views.items()}, txn)
    assert pc.problems == []
    sends = {c.txn: c for v in pc.chunks.values() for c in v if c.sub_op == "SEND"}
    recvs = {c.txn: c for v in pc.chunks.values() for c in v if c.sub_op == "RECV"}
    assert len(sends) == len(recvs) == 4 * 2 * nsteps and set(sends) == set(recvs)
    for t, s in sends.items():
        rv = recvs[t]
        assert rv.rank == (s.rank + 1) % 4 and rv.peer == s.rank and s.peer == rv.rank and rv.step == s.step
        assert (s.start, s.end) == job.expected[(1, s.rank, "S" + t)]
        assert (rv.start, rv.end) == job.expected[(1, rv.rank, "R" + t)]
        assert s.start < s.end and rv.start >= s.start  # data arrives after it was sent


def test_tree_allreduce_pairs_and_orientation(plugin, tmp_path):
    job, txn = run_job(plugin, "tree", steps=(1,))
    views = NP.select_comm(NP.read_plugin_dir(tmp_path / "trace"), nranks=4)
    pc = NP.collective_chunks({r: v.comm.collectives()[0] for r, v in views.items()}, txn)
    assert pc.problems == [] and pc.algo == "TREE"
    links = {(c.rank, c.peer) for v in pc.chunks.values() for c in v if c.sub_op == "SEND"}
    assert links == {(1, 0), (0, 1), (2, 1), (1, 2), (3, 1), (1, 3)}
    for v in pc.chunks.values():
        for c in v:
            assert (c.start, c.end) == job.expected[(1, c.rank, c.sub_op[0] + c.txn)]
    deps = {r: {(a.txn, b.txn) for a, b in NP.data_dependencies(pc, r)[0]} for r in range(4)}
    t = lambda s, d, i: NP.chunk_txn(txn, 0, s, d, i)  # noqa: E731
    for i in range(3):
        assert (t(2, 1, i), t(1, 0, i)) in deps[1] and (t(3, 1, i), t(1, 0, i)) in deps[1]  # up: children -> parent
        assert (t(0, 1, i), t(1, 2, i)) in deps[1] and (t(0, 1, i), t(1, 3, i)) in deps[1]  # down: parent -> children
        assert (t(1, 0, i), t(0, 1, i)) in deps[0]  # root: up -> down
    assert deps[2] == deps[3] == set()  # leaves forward nothing
    assert len(deps[1]) == 3 * 4 and len(deps[0]) == 3


def test_ring_dependencies_follow_the_slices(plugin, tmp_path):
    _, txn = run_job(plugin, "ring", steps=(1,))
    views = NP.select_comm(NP.read_plugin_dir(tmp_path / "trace"), nranks=4)
    pc = NP.collective_chunks({r: v.comm.collectives()[0] for r, v in views.items()}, txn)
    deps, note = NP.data_dependencies(pc, 2)
    assert note is None
    got = {(a.channel, a.step, b.step) for a, b in deps}
    # S = 2 slices per ring step, 6 ring steps per loop: the first 2 sends of each loop of 12 are own data
    want = {(ch, i - 2, i) for ch in range(2) for i in range(24) if (i // 2) % 6 != 0}
    assert got == want
    assert all(a.sub_op == "RECV" and a.peer == 1 and b.sub_op == "SEND" and b.peer == 3 for a, b in deps)


def test_replace_collectives_ring(plugin, tmp_path):
    """The Kineto-side coarse AllReduce becomes IN -> chunks -> OUT on every rank, with the
    measured chunk times, and the builder joins SEND -> RECV instead of expanding a ring."""
    steps = (1, 2, 3)
    job, txn = run_job(plugin, "ring", steps=steps)
    offsets = {r: -T0 / 1000 + 500.0 * r for r in range(4)}  # each node's own clock origin
    gt = gtrace_for(job, steps, 4, offsets, 8 * CHUNK * 6 * 4)
    res = NP.replace_collectives(gt, tmp_path / "trace", time_offset_us=offsets)
    assert res.replaced == ["allreduce.0"] and res.kept == {}
    new = res.gtrace
    validate(new)
    assert "ar" in gt.nodes["worker0"].ops  # the input is left alone
    for r in range(4):
        nt = new.nodes[f"worker{r}"]
        assert "ar" not in nt.ops and {"ar/IN", "ar/OUT"} <= set(nt.ops)
        chunks = [o for o in nt.ops.values() if o.sub_op in ("SEND", "RECV")]
        assert len(chunks) == 2 * 2 * 24
        assert ("bw", "ar/IN") in nt.edges and ("ar/OUT", "upd") in nt.edges
        ev = {(e.op, e.step): e for e in nt.events}
        for o in chunks:
            for s in steps:
                e = ev[(o.id, s)]
                start, end = job.expected[(s, r, o.sub_op[0] + o.txn)]
                assert e.ts == pytest.approx(start / 1000 + offsets[r], abs=1e-6)
                assert e.dur == pytest.approx((end - start) / 1000, abs=1e-6)
    g, info = build_global_dfg(new)
    assert info.expanded == 0 and info.kept_coarse == 0
    names = set(g.names)
    assert not any("/ring" in x for x in names)
    # every SEND feeds the RECV of its transaction on the next rank
    idx = {x: i for i, x in enumerate(g.names)}
    src, dst = g.edges()
    pairs = set(zip(src.tolist(), dst.tolist()))
    for o in new.nodes["worker1"].ops.values():
        if o.sub_op == "SEND":
            recv = next(x for x in new.nodes[f"worker{o.peer}"].ops.values() if x.sub_op == "RECV" and x.txn == o.txn)
            assert (idx[f"worker1/{o.id}"], idx[f"worker{o.peer}/{recv.id}"]) in pairs


@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_replay_uses_measured_chunks(plugin, tmp_path, algo):
    """Replaying the replaced trace reproduces the mock job's iteration (within 1 %): the
    builder charges a RECV no host gap (the time before it is the wait for its SEND, which
    the SEND -> RECV edge already models)."""
    from dpro.graph.global_dfg import BuildOptions
    from dpro.replayer.engine import simulate

    steps = (1, 2, 3)
    job, _ = run_job(plugin, algo, steps=steps)
    offsets = {r: -T0 / 1000 for r in range(4)}
    gt = gtrace_for(job, steps, 4, offsets, 8 * CHUNK * 6 * 4 if algo == "ring" else 3 * CHUNK)
    res = NP.replace_collectives(gt, tmp_path / "trace", time_offset_us=offsets)
    g, info = build_global_dfg(res.gtrace, BuildOptions(steps=list(steps)))
    assert info.expanded == 0
    recv = [i for i, x in enumerate(g.names) if "/recv<" in x]
    assert len(recv) == (4 * 2 * 24 if algo == "ring" else 6 * 3)
    assert (g.gap[recv] == 0.0).all()
    measured = max(nt.steps[1][1] for nt in gt.nodes.values())  # every mock step is the same
    assert simulate(g).makespan == pytest.approx(measured, rel=0.01)


def test_replace_links_by_step_marks_and_estimates_offset(plugin, tmp_path):
    steps = (4, 5)
    job, _ = run_job(plugin, "ring", steps=steps)
    offsets = {r: -T0 / 1000 + 123.0 for r in range(4)}
    gt = gtrace_for(job, steps, 4, offsets, 8 * CHUNK * 6 * 4)
    res = NP.replace_collectives(gt, tmp_path / "trace")  # marks link; offset estimated
    assert res.replaced == ["allreduce.0"]
    for r in range(4):
        off, how = res.offsets[r]
        assert "estimated" in how
        # the mock's kernel ends T_RED + 2 us after its last chunk (a RECV) became visible
        assert off == pytest.approx(offsets[r] + (T_RED + 2 * US) / 1000, abs=1e-6)


def test_replace_by_seq_base_and_refusals(plugin, tmp_path):
    steps = (1, 2)
    job, _ = run_job(plugin, "ring", steps=steps, marks=False)
    offsets = {r: -T0 / 1000 for r in range(4)}
    gt = gtrace_for(job, steps, 4, offsets, 8 * CHUNK * 6 * 4)
    with pytest.raises(DproInputError, match="cannot link NCCL collectives"):
        NP.replace_collectives(gt, tmp_path / "trace")
    res = NP.replace_collectives(gt, tmp_path / "trace", seq_base=0)
    assert res.replaced == ["allreduce.0"]
    res = NP.replace_collectives(gt, tmp_path / "trace", time_offset_us=offsets)  # linked by step windows
    assert res.replaced == ["allreduce.0"]
    res = NP.replace_collectives(gt, tmp_path / "trace", seq_base=1)  # off by one step: step 2 unmatched
    assert res.replaced == [] and "allreduce.0" in res.kept
    assert res.gtrace is gt
    gt_bad = gtrace_for(job, steps, 4, offsets, 12345)  # sizes disagree
    res = NP.replace_collectives(gt_bad, tmp_path / "trace", seq_base=0)
    assert res.replaced == [] and "bytes" in res.kept["allreduce.0"]


def test_missing_rank_keeps_coarse(plugin, tmp_path):
    steps = (1,)
    job, _ = run_job(plugin, "ring", steps=steps)
    offsets = {r: -T0 / 1000 for r in range(4)}
    gt = gtrace_for(job, steps, 4, offsets, 8 * CHUNK * 6 * 4)
    next((tmp_path / "trace").glob("nccl_rank3_*")).unlink()
    res = NP.replace_collectives(gt, tmp_path / "trace", time_offset_us=offsets)
    assert res.replaced == [] and "rank 3" in res.kept["allreduce.0"]
    assert res.gtrace is gt


def test_kineto_time_offsets(tmp_path):
    (tmp_path / "rank1.json").write_text(
        '{"schemaVersion":1,"distributedInfo":{"backend":"nccl","rank":1,"world_size":2},'
        '"traceEvents":[],"baseTimeNanoseconds":1790000000123456000}')
    (tmp_path / "rank0.json").write_text('{"traceEvents":[],"baseTimeNanoseconds":1790000000000000000}')
    assert NP.kineto_time_offsets(tmp_path) == {0: -1790000000000000.0, 1: -1790000000123456.0}


def test_replace_tree(plugin, tmp_path):
    steps = (1, 2)
    job, _ = run_job(plugin, "tree", steps=steps)
    offsets = {r: -T0 / 1000 for r in range(4)}
    gt = gtrace_for(job, steps, 4, offsets, 3 * CHUNK)
    res = NP.replace_collectives(gt, tmp_path / "trace", time_offset_us=offsets)
    assert res.replaced == ["allreduce.0"]
    nt1 = res.gtrace.nodes["worker1"]
    assert ("ar/c0/recv<2/s1", "ar/c0/send>0/s1") in nt1.edges
    assert ("ar/c0/recv<0/s1", "ar/c0/send>3/s1") in nt1.edges
    g, info = build_global_dfg(res.gtrace)
    assert info.expanded == 0


def test_v4_and_v3_interfaces(plugin, tmp_path):
    """The same collective through the older descriptor layouts NCCL 2.26 / 2.27 use."""
    for ver, prof, Descr in (("v4", plugin.v4, DescrV4), ("v3", plugin.v3, DescrV3)):
        plugin.clock(T0)
        ctx, mask = C.c_void_p(), C.c_int(0)
        if ver == "v4":
            assert prof.init(C.byref(ctx), C.byref(mask), b"old", 0xAB, 1, 2, 1, None) == 0
        else:
            assert prof.init(C.byref(ctx), C.byref(mask)) == 0
        assert ctx.value and mask.value == COLL | P2P | PROXY_OP | PROXY_STEP
        d = Descr(type=COLL, rank=1)
        d.coll.seqNumber, d.coll.func, d.coll.count, d.coll.datatype = 7, b"AllReduce", 256, b"ncclFloat32"
        d.coll.algo, d.coll.proto = b"RING", b"LL"
        if ver == "v4":
            d.coll.nChannels = 3
        else:
            d.coll.nMaxChannels = 3
        hc = C.c_void_p()
        prof.startEvent(ctx, C.byref(hc), C.byref(d))
        prof.stopEvent(hc)
        od = Descr(type=PROXY_OP, parentObj=hc, rank=1)
        od.proxyOp.pid, od.proxyOp.channelId, od.proxyOp.peer, od.proxyOp.nSteps = os.getpid(), 2, 0, 1
        od.proxyOp.chunkSize, od.proxyOp.isSend = 4096, 1
        ho = C.c_void_p()
        prof.startEvent(ctx, C.byref(ho), C.byref(od))
        sd = Descr(type=PROXY_STEP, parentObj=ho, rank=1)
        sd.proxyStep.step = 0
        hs = C.c_void_p()
        plugin.clock(T0 + 10 * US)
        prof.startEvent(ctx, C.byref(hs), C.byref(sd))
        plugin.clock(T0 + 12 * US)
        prof.recordEventState(hs, ST_SEND_NET, C.byref(StateArgs(transSize=1000)))
        plugin.clock(T0 + 20 * US)
        prof.stopEvent(hs)
        prof.stopEvent(ho)
        prof.finalize(ctx)
    files = NP.read_plugin_dir(tmp_path / "trace")
    comms = [c for f in files for c in f.comms.values()]
    assert sorted(c.interface for c in comms) == ["v3", "v4"]
    for c in comms:
        (coll,) = c.collectives()
        assert (coll.seq, coll.func, coll.nch, coll.proto, coll.bytes) == (7, "AllReduce", 3, "LL", 1024)
        (op,) = coll.ops
        assert (op.channel, op.peer, op.is_send, op.chunk) == (2, 0, True, 4096)
        st = op.steps[0]
        assert (st.t0, st.s3, st.t1, st.bytes) == (T0 + 10 * US, T0 + 12 * US, T0 + 20 * US, 1000)
        assert c.rank == 1  # v3: taken from the events' descriptors


# --------------------------------------------------------------------------- bad sequences


def test_bad_sequences_are_counted_not_fatal(plugin, tmp_path):
    ctx, _ = plugin.init(0, 2)
    g = plugin.lib.dpro_nccl_trace_dropped_global
    plugin.stop(None)                       # stop without start (NULL handle)
    plugin.stop(0x1234)                     # unknown handle
    plugin.stop((0xD9 << 56) | (63 << 42) | 5)  # our magic, but a slot that is not live
    plugin.record(0xDEADBEEF, ST_SEND_NET, 10)
    assert g(1) == 4                        # bad_handle
    hc = plugin.start(ctx, coll_descr(0, 0, 1024, 1, b"RING"))
    plugin.stop(hc)
    plugin.stop(hc)                         # stopped twice
    plugin.record(hc, ST_SEND_NET)          # state after stop
    h = C.c_void_p()
    assert plugin.v5.startEvent(None, C.byref(h), C.byref(coll_descr(0, 1, 8, 1, b"RING"))) == 0 and h.value is None
    assert plugin.v5.startEvent(0x42, C.byref(h), C.byref(coll_descr(0, 1, 8, 1, b"RING"))) == 0 and h.value is None
    assert plugin.v5.startEvent(ctx, C.byref(h), None) == 0 and h.value is None  # no descriptor
    hop = plugin.start(ctx, op_descr(0, 0x777, 0, 1, 2, 64, True))  # unknown parent: kept, parent -1
    plugin.stop(hop)
    unknown = DescrV5(type=1 << 5)          # a ProxyCtrl event: not recorded, NULL handle
    assert plugin.start(ctx, unknown) is None
    assert plugin.lib.dpro_nccl_trace_dropped() >= 7
    plugin.finalize(ctx)
    plugin.finalize(ctx)                    # finalize twice: counted, ignored
    plugin.stop(hc)                         # a handle of a finalized communicator
    (f,) = NP.read_plugin_dir(tmp_path / "trace")
    (comm,) = f.comms.values()
    assert comm.summary["dropped"]["bad_sequence"] == 2
    assert comm.summary["process_dropped"]["bad_handle"] == 4 and comm.summary["process_dropped"]["no_context"] == 1
    assert [o.coll for c in comm.colls.values() for o in c.ops] == []
    assert len(comm.colls) == 1


def test_buffer_full_drops_are_counted(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("DPRO_NCCL_TRACE_EVENTS", "16")
    plugin.clock(T0)
    ctx, _ = plugin.init(0, 2)
    hc = plugin.start(ctx, coll_descr(0, 0, 1 << 20, 1, b"RING"))
    plugin.stop(hc)
    ho = plugin.start(ctx, op_descr(0, hc, 0, 1, 40, CHUNK, True))
    got = 0
    for i in range(40):
        h = plugin.start(ctx, step_descr(0, ho, i))
        got += h is not None
        plugin.record(h, ST_SEND_NET, CHUNK) if h else None
        plugin.stop(h) if h else None
    plugin.stop(ho)
    assert got == 16
    plugin.finalize(ctx)
    (f,) = NP.read_plugin_dir(tmp_path / "trace")
    assert f.dropped()["full"] == 24
    (coll,) = only(f.comms).collectives()
    pc = NP.collective_chunks({0: coll}, "allreduce.0", nranks=2)
    assert any("not recorded completely" in p for p in pc.problems)


def test_pause_flush_resume_and_open_records(plugin, tmp_path):
    plugin.clock(T0)
    ctx, _ = plugin.init(0, 2)
    hc = plugin.start(ctx, coll_descr(0, 0, 64, 1, b"RING"))
    plugin.stop(hc)
    ho = plugin.start(ctx, op_descr(0, hc, 0, 1, 2, 64, True))
    h0 = plugin.start(ctx, step_descr(0, ho, 0))
    assert plugin.lib.dpro_nccl_trace_pause() == 0          # end of a window: complete records written
    text = next((tmp_path / "trace").iterdir()).read_text()
    assert '"type":"coll"' in text and '"type":"step"' not in text  # the step is still open
    assert plugin.start(ctx, step_descr(0, ho, 1)) is None  # paused: not recorded
    plugin.lib.dpro_nccl_trace_resume()
    plugin.stop(h0)
    plugin.finalize(ctx)                                    # op never stopped: written as open
    (f,) = NP.read_plugin_dir(tmp_path / "trace")
    (coll,) = only(f.comms).collectives()
    (op,) = coll.ops
    assert op.open and list(op.steps) == [0] and not op.steps[0].open
    assert only(f.comms).summary["dropped"]["paused"] == 1 and only(f.comms).summary["open"] == 1


def test_unwritable_dir_disables_once(plugin, tmp_path, monkeypatch, capfd):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("DPRO_NCCL_TRACE_DIR", str(blocker / "sub"))
    ctx, _ = plugin.init(0, 2)
    hc = plugin.start(ctx, coll_descr(0, 0, 64, 1, b"RING"))
    plugin.stop(hc)
    assert plugin.lib.dpro_nccl_trace_flush() == -1
    assert plugin.lib.dpro_nccl_trace_disabled() == 1
    assert plugin.start(ctx, coll_descr(0, 1, 64, 1, b"RING")) is None  # disabled: nothing recorded
    plugin.lib.dpro_nccl_trace_flush()
    plugin.finalize(ctx)
    err = capfd.readouterr().err
    assert err.count("dpro-nccl:") == 1 and "NCCL tracing disabled" in err


def test_not_asked_to_trace_is_inert(plugin, monkeypatch):
    monkeypatch.delenv("DPRO_NCCL_TRACE_DIR")
    ctx, mask = plugin.init(0, 2)
    assert ctx is None and mask == 0
    h = C.c_void_p()
    assert plugin.v5.startEvent(None, C.byref(h), C.byref(coll_descr(0, 0, 8, 1, b"RING"))) == 0 and h.value is None
    assert plugin.v5.finalize(None) == 0


def test_concurrent_threads_claim_distinct_records(plugin, tmp_path):
    """Host and proxy threads call in at once: records are claimed lock-free, none lost."""
    ctx, _ = plugin.init(0, 2)
    hc = plugin.start(ctx, coll_descr(0, 0, 64, 4, b"RING"))
    plugin.stop(hc)
    n = 1500

    def worker(ch):
        ho = plugin.start(ctx, op_descr(0, hc, ch, 1, n, 64, True))
        for i in range(n):
            h = plugin.start(ctx, step_descr(0, ho, i))
            plugin.record(h, ST_SEND_NET, 64)
            plugin.stop(h)
        plugin.stop(ho)

    ts = [threading.Thread(target=worker, args=(ch,)) for ch in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    plugin.finalize(ctx)
    (f,) = NP.read_plugin_dir(tmp_path / "trace")
    (coll,) = only(f.comms).collectives()
    assert sorted(o.channel for o in coll.ops) == [0, 1, 2, 3]
    assert all(sorted(o.steps) == list(range(n)) for o in coll.ops)
    assert f.dropped()["full"] == 0


def test_reader_rejects_other_files(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"type":"something"}\n')
    with pytest.raises(DproInputError, match="not a dpro NCCL plugin trace"):
        NP.read_plugin_file(p)
    p.write_text('{"type":"header","format":"dpro-nccl-trace","version":1}\n{"type":"coll","comm":0,"id":0}\n')
    with pytest.raises(DproInputError, match="before its 'comm' line"):
        NP.read_plugin_file(p)
    p.write_text('{"type":"header","format":"dpro-nccl-trace","version":1}\n{"type":"comm","comm":0,"t":5}\n{"typ')
    assert "truncated" in NP.read_plugin_file(p).notes[0]


def test_kernel_channel_events(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("DPRO_NCCL_TRACE_KERNEL", "1")
    plugin.clock(T0)
    ctx, mask = plugin.init(0, 2)
    assert mask & KERNEL_CH
    hc = plugin.start(ctx, coll_descr(0, 3, 64, 1, b"RING"))
    plugin.stop(hc)
    d = DescrV5(type=KERNEL_CH, parentObj=hc, rank=0)
    d.kernelCh.channelId, d.kernelCh.pTimer = 1, 555
    plugin.clock(T0 + 9 * US)
    hk = plugin.start(ctx, d)
    a = StateArgs(pTimer=999)
    assert plugin.v5.recordEventState(hk, 22, C.byref(a)) == 0
    plugin.stop(hk)
    plugin.finalize(ctx)
    (f,) = NP.read_plugin_dir(tmp_path / "trace")
    (coll,) = only(f.comms).collectives()
    assert coll.kernel_channels == [{"channel": 1, "gpu0": 555, "gpu1": 999, "t0": T0 + 9 * US, "t1": T0 + 9 * US}]


def test_bench_runs(plugin_lib, tmp_path):
    r = subprocess.run([str(plugin_lib.parent / "bench"), str(plugin_lib), "20000", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '"ns_per_step"' in r.stdout.splitlines()[-1]
