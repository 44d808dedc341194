"""The measured step of a directory of torch.profiler traces, read from the raw JSON
(a reader that does not trust dpro's importer): shared by the fidelity harnesses
(kineto_corpus.py, kineto_multirank.py) and tests/test_corpus.py."""

from __future__ import annotations

import gzip
import re
import statistics
from collections import defaultdict
from pathlib import Path

import orjson

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: categories of a CPU-side ProfilerStep span (``Operator``: PyTorch 1.8's name for cpu_op)
CPU_STEP_CATS = {"user_annotation", "cpu_op", "Operator"}


def cpu_steps(folder: Path) -> dict[int, float]:
    """Step number -> mean over the folder's trace files of its CPU ProfilerStep#N span (µs)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for f in sorted(folder.iterdir()):
        if not f.name.endswith((".json", ".json.gz")):
            continue
        raw = f.read_bytes()
        d = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        for e in d if isinstance(d, list) else d["traceEvents"]:
            m = STEP_RE.match(str(e.get("name", ""))) if isinstance(e, dict) and e.get("ph") == "X" else None
            if m and e.get("cat") in CPU_STEP_CATS:
                per_step[int(m.group(1))].append(float(e["dur"]))
    return {s: statistics.mean(v) for s, v in per_step.items()}


def cpu_step_median(folder: Path) -> float | None:
    """Median over step numbers of :func:`cpu_steps` (None without CPU ProfilerStep spans)."""
    steps = cpu_steps(folder)
    return statistics.median(steps.values()) if steps else None
