"""The measured step of a directory of torch.profiler traces, read from the raw JSON
(a reader that does not trust dpro's importer): shared by the fidelity harnesses
(kineto_corpus.py, kineto_multirank.py) and tests/test_corpus.py.

Two rules besides the CPU-side ProfilerStep#N spans themselves (docs/kineto.md, "Steps"):

* the last span of the marker thread that holds no other CPU-side event of that thread is
  not a step (the span the last ``prof.step()`` opens and the profiler's exit closes), where
  another step precedes it;
* a GPU-bound file (over three consecutive steps or more, the GPU's lag behind the CPU, the
  start of the first GPU op launched in the step minus the step's start, grows at every
  step) measures each step as the median step-to-step period of those first GPU starts,
  where that exceeds the CPU span.
"""

from __future__ import annotations

import bisect
import gzip
import re
import statistics
from collections import defaultdict
from pathlib import Path

import orjson

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: categories of a CPU-side ProfilerStep span (``Operator``: PyTorch 1.8's name for cpu_op)
CPU_STEP_CATS = {"user_annotation", "cpu_op", "Operator"}
#: CPU-side events that make a span a step (an operator or runtime call of the training thread)
CPU_CATS = {"user_annotation", "cpu_op", "Operator", "cuda_runtime", "cuda_driver", "Runtime"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def _files(folder: Path):
    for f in sorted(folder.iterdir()):
        if not f.name.endswith((".json", ".json.gz")):
            continue
        raw = f.read_bytes()
        d = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        yield [e for e in (d if isinstance(d, list) else d["traceEvents"]) if isinstance(e, dict) and e.get("ph") == "X"]


def _file_steps(evs: list[dict]) -> dict[int, tuple[float, float]]:
    """Step number -> (start, end) of one file's CPU ProfilerStep spans, the stub left out."""
    marks = []
    for e in evs:
        m = STEP_RE.match(str(e.get("name", "")))
        if m and e.get("cat") in CPU_STEP_CATS:
            marks.append((int(m.group(1)), float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("pid"), e.get("tid")))
    steps = {n: (t0, t1) for n, t0, t1, _, _ in marks}
    if len(marks) > 1:
        n, t0, t1, pid, tid = max(marks, key=lambda m: m[1])
        if not any(e.get("pid") == pid and e.get("tid") == tid and e.get("cat") in CPU_CATS
                   and not STEP_RE.match(str(e.get("name", ""))) and t0 <= float(e["ts"]) < t1 for e in evs):
            del steps[n]
    return steps


def _gpu_period(evs: list[dict], steps: dict[int, tuple[float, float]]) -> float | None:
    """The file's GPU period where the GPU falls further behind the CPU at every step."""
    order = sorted(steps)
    starts = [steps[s][0] for s in order]
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in evs
              if e.get("cat") in RUNTIME_CATS and "correlation" in (e.get("args") or {})}
    first: dict[int, float] = {}
    for e in evs:
        c = (e.get("args") or {}).get("correlation") if e.get("cat") in GPU_CATS else None
        t = launch.get(c)
        i = bisect.bisect_right(starts, t) - 1 if t is not None else -1
        if i >= 0 and t < steps[order[i]][1]:
            first[order[i]] = min(first.get(order[i], float(e["ts"])), float(e["ts"]))
    have = sorted(first)
    runs = [(a, b) for a, b in zip(have, have[1:]) if b == a + 1]
    if len(runs) < 2 or not all(first[b] - steps[b][0] > first[a] - steps[a][0] for a, b in runs):
        return None
    return statistics.median(first[b] - first[a] for a, b in runs)


def cpu_steps(folder: Path) -> dict[int, float]:
    """Step number -> mean over the folder's trace files of its CPU ProfilerStep#N span (µs)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for evs in _files(folder):
        for n, (t0, t1) in _file_steps(evs).items():
            per_step[n].append(t1 - t0)
    return {s: statistics.mean(v) for s, v in per_step.items()}


def measured_steps(folder: Path) -> dict[int, float]:
    """Like :func:`cpu_steps`, but a GPU-bound file's steps count its GPU period where larger."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for evs in _files(folder):
        steps = _file_steps(evs)
        period = _gpu_period(evs, steps) or 0.0
        for n, (t0, t1) in steps.items():
            per_step[n].append(max(t1 - t0, period))
    return {s: statistics.mean(v) for s, v in per_step.items()}


def cpu_step_median(folder: Path) -> float | None:
    """Median over step numbers of :func:`cpu_steps` (None without CPU ProfilerStep spans)."""
    steps = cpu_steps(folder)
    return statistics.median(steps.values()) if steps else None


def measured_median(folder: Path) -> float | None:
    """Median over step numbers of :func:`measured_steps` (None without CPU ProfilerStep spans)."""
    steps = measured_steps(folder)
    return statistics.median(steps.values()) if steps else None
