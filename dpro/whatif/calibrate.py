"""``dpro calibrate``: measure a platform's all-reduce cost (alpha, beta) with local processes.

N processes (default 2) on this machine join a ``torch.distributed`` group (gloo by
default), all-reduce float32 tensors of sizes from 4 KiB to 64 MiB (a few warm-up calls,
then ``repeats`` timed ones each, every rank entering together after a barrier) and rank 0
keeps the median time per size; all of it ``tries`` times in fresh processes, the median
over the tries kept. ``t = 2(N-1) * (alpha + beta * B/N)`` is fitted by least
absolute deviations with alpha, beta >= 0 (:func:`dpro.graph.comm_model.lad_link_cost`).

The same calls' CPU time (the rank's process, all threads, user + system: the library's
reductions and copies and the kernel's socket work) is fitted the same way
(``cpu_alpha_us``, ``cpu_beta_us_per_byte``): the CPU a collective takes from the cores
the workers share (``dpro whatif --host-cores``).

Then each size again while every rank computes (a gradient-like matmul, ``[H, b] @ [b, H]``,
in a loop on the main thread, as a DDP backward goes on while gloo's thread all-reduces a
bucket): the call's time, fitted the same way (``overlap_alpha_us``,
``overlap_beta_us_per_byte``), and the computation's speed meanwhile over its speed alone
(``overlap_compute_rate``: the work done while the calls ran over the work done alone in the
same time, all sizes together): how the two slow each other on shared cores
(:mod:`dpro.whatif.overlap`).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.comm_model import lad_link_cost, ring_steps
from dpro.ports import free_port
from dpro.whatif.platform import FORMAT

DEFAULT_SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
#: tries whose times of one size differ by more than this factor: the machine's speed moved
UNSTEADY_RATIO = 1.25
#: sizes below this are not judged: a call of a few hundred µs is mostly scheduling noise
UNSTEADY_MIN_BYTES = 1 << 20


def _rank_main(rank: int, world: int, port: int, backend: str, sizes: list[int], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    unit, unit_us = compute_unit(torch)
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(x)
        ts, cpu = [], []
        for _ in range(repeats):
            dist.barrier()
            c0, t0 = process_cpu_us(), time.perf_counter()
            dist.all_reduce(x)
            ts.append((time.perf_counter() - t0) * 1e6)
            cpu.append(process_cpu_us() - c0)
        over, work = [], []
        for _ in range(repeats):
            dist.barrier()
            us, units = _overlapped(dist, x, unit)
            over.append(us)
            work.append(units * unit_us)
        rows.append(size_row(int(x.numel() * 4), ts, cpu, over, work))
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def size_row(nbytes: int, alone_us: list[float], cpu_us: list[float], overlapped_us: list[float],
             work_us: list[float]) -> dict:
    """One size's row of the samples: the medians of its calls alone (time, CPU) and
    overlapped, and the totals the computation's rate is taken from (time overlapped, work
    done meanwhile in µs of it alone)."""
    return {"bytes": nbytes, "us": statistics.median(alone_us), "cpu_us": statistics.median(cpu_us),
            "overlapped_us": statistics.median(overlapped_us), "overlapped_total_us": sum(overlapped_us),
            "compute_done_us": sum(work_us)}


def compute_unit(torch) -> tuple[Callable[[], None], float]:
    """A unit of computation like a backward's (an MLP layer's weight gradient at batch 32,
    about 1 ms on one core) and its time alone (µs)."""
    a, b, w = torch.randn(1024, 32), torch.randn(32, 1024), torch.empty(1024, 1024)

    def unit() -> None:
        torch.mm(a, b, out=w)

    for _ in range(20):
        unit()
    t0 = time.perf_counter()
    for _ in range(100):
        unit()
    return unit, (time.perf_counter() - t0) * 1e6 / 100


def _overlapped(dist, x, unit: Callable[[], None]) -> tuple[float, float]:
    """One all-reduce of ``x`` started asynchronously while this thread runs ``unit`` until
    it has ended (stamped by its future's callback): its time (µs) and the units done
    meanwhile (the one running at its end pro rata)."""
    done = threading.Event()
    stamp: list[float] = []

    def ended(_f) -> None:
        stamp.append(time.perf_counter())
        done.set()

    t0 = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    work.get_future().add_done_callback(ended)
    ticks = [t0]
    while not done.is_set():
        unit()
        ticks.append(time.perf_counter())
    work.wait()
    t_end = stamp[0]
    k = sum(1 for t in ticks[1:] if t <= t_end)
    part = (t_end - ticks[k]) / (ticks[k + 1] - ticks[k]) if k + 1 < len(ticks) else 0.0
    return (t_end - t0) * 1e6, k + part


def process_cpu_us() -> float:
    """CPU time of this process so far (all threads, user + system), µs."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e6



def calibrate(processes: int = 2, backend: str = "gloo", sizes: list[int] | None = None, repeats: int = 10,
              tries: int = 3, tick: Callable[[str], None] | None = None) -> dict:
    """Measure and fit; returns the platform file's content (:mod:`dpro.whatif.platform`).

    ``tries`` times in fresh processes (``tick`` after each): a try catches one of the
    machine's regimes (on the 2-core VM a 64 MiB all-reduce took 42 ms in some and 67 ms in
    others), so every size keeps the median over the tries of each time."""
    import torch.multiprocessing as mp

    if processes < 2:
        raise ValueError("calibrate needs at least 2 processes")
    if tries < 1:
        raise ValueError("calibrate needs at least 1 try")
    sizes = sizes or DEFAULT_SIZES

    def measure(out: Path) -> None:
        try:
            mp.spawn(_rank_main, args=(processes, free_port(), backend, sizes, repeats, str(out)), nprocs=processes,
                     join=True)
        except Exception as e:  # a rank's failure (the backend missing here, ...): one line, not its traceback
            last = str(e).strip().splitlines()[-1:] or [type(e).__name__]
            raise DproInputError(None, f"--backend {backend}: a calibration rank failed: {last[0][:200]}") from None

    return fit_platform(measure_tries(tries, "dpro-calibrate-", measure, tick), processes, backend)


def measure_tries(tries: int, prefix: str, measure: Callable[[Path], None],
                  tick: Callable[[str], None] | None = None) -> list[list[dict]]:
    """``tries`` tries of ``measure(out)``, each in fresh processes writing its rows (by size)
    to ``out`` in a temporary directory of its own; ``tick`` after each."""
    runs = []
    for i in range(tries):
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            out = Path(tmp) / "rows.json"
            measure(out)
            runs.append(json.loads(out.read_text()))
        if tick is not None:
            tick(f"try {i + 1} of {tries}")
    return runs


def fit_platform(runs: list[list[dict]], processes: int, backend: str, cpu_cost: bool = True) -> dict:
    """The platform file of ``runs`` (a calibration's tries, each its rows by size): every
    size's median over the tries, then the fits (alone, CPU, overlapped, the computation's
    rate); ``cpu_cost=False``: no CPU fit (the samples keep the CPU measured)."""
    rows = [{"bytes": same[0]["bytes"], **{k: statistics.median(r[k] for r in same)
                                           for k in ("us", "cpu_us", "overlapped_us")},
             **{k: sum(r[k] for r in same) for k in ("overlapped_total_us", "compute_done_us")}}
            for same in zip(*runs)]
    k = ring_steps(processes)
    A = np.array([[k, k * r["bytes"] / processes] for r in rows], dtype=float)
    lc = lad_link_cost(A, np.array([r["us"] for r in rows], dtype=float))
    cpu = lad_link_cost(A, np.array([r["cpu_us"] for r in rows], dtype=float))
    over = lad_link_cost(A, np.array([r["overlapped_us"] for r in rows], dtype=float))
    rate = sum(r["compute_done_us"] for r in rows) / max(sum(r["overlapped_total_us"] for r in rows), 1e-9)
    ar = {"alpha_us": lc.alpha, "beta_us_per_byte": lc.beta, "fit_error": lc.fit_error,
          "cpu_alpha_us": cpu.alpha, "cpu_beta_us_per_byte": cpu.beta,
          "overlap_alpha_us": over.alpha, "overlap_beta_us_per_byte": over.beta,
          "overlap_compute_rate": min(1.5, max(rate, 1e-3)),
          "model": "per ring step: t = 2(N-1) * (alpha + beta * bytes/N), CPU per rank alike"}
    if not cpu_cost:
        del ar["cpu_alpha_us"], ar["cpu_beta_us_per_byte"]
    return {"format": FORMAT, "version": 1, "backend": backend, "processes": processes, "host": socket.gethostname(),
            "allreduce": ar, "samples": rows, "tries": runs, "unsteady": unsteady(runs)}


def unsteady(runs: list[list[dict]]) -> list[dict]:
    """The sizes (from :data:`UNSTEADY_MIN_BYTES`) whose time alone differs between the tries
    by more than :data:`UNSTEADY_RATIO`: ``{"bytes", "min_us", "max_us"}`` each. On a shared
    machine memory bandwidth moves in phases (docs/fidelity.md "The machine's own drift"), and
    a try catches one of them: the median over the tries then stands on few of each."""
    out = []
    for same in zip(*runs):
        ts = [r["us"] for r in same]
        if same[0]["bytes"] >= UNSTEADY_MIN_BYTES and len(ts) > 1 and max(ts) > UNSTEADY_RATIO * min(ts):
            out.append({"bytes": same[0]["bytes"], "min_us": min(ts), "max_us": max(ts)})
    return out


def describe_unsteady(sizes: Iterable[tuple[int, float, float]]) -> str:
    """``64 MiB 40.0-74.0 ms, ...`` for (bytes, min µs, max µs) items."""
    return ", ".join(f"{b / (1 << 20):g} MiB {lo / 1e3:.1f}-{hi / 1e3:.1f} ms" for b, lo, hi in sizes)


def unsteady_note(platform: dict) -> str | None:
    """One line for the user where the tries disagree (:func:`unsteady`), else None."""
    bad = platform.get("unsteady") or []
    if not bad:
        return None
    sizes = describe_unsteady((b["bytes"], b["min_us"], b["max_us"]) for b in bad)
    return (f"note: the {len(platform.get('tries') or [])} tries disagree ({sizes}): this machine's speed moved while "
            "calibrating, and each size keeps the median; calibrate again with more --tries, or when the machine is quiet")
