"""Run by tests/test_horovod_writer.py under ``horovodrun -np 1`` with HOROVOD_TIMELINE=DYNAMIC:
park Horovod's timeline writer inside a window (timeline started, collectives running) where it
holds no lock, and report what happened (JSON on stdout)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch

from dpro.profiler.horovod.runtime import WindowTimeline
from dpro.profiler.horovod.writer import thread_state


def cpu_s(tid: int) -> float:
    """utime + stime of thread ``tid`` in seconds."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


hvd.init()
out_dir = Path(sys.argv[1])
tl = WindowTimeline("horovod.torch")
w = tl.writer
out: dict = {"found": w is not None}
if w is not None:
    parks = []
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):  # windows
        tl.start(out_dir, steps=5, tensors=20, world=1)
        parks.append(bool(w.in_window))
        c0, t0 = cpu_s(w.tid), time.monotonic()
        state = thread_state(w.tid)
        for k in range(20):  # collectives while the writer is parked: Horovod must not block
            hvd.allreduce(torch.ones(1000), name=f"w{i}.t{k}")
        out.setdefault("allreduce_s", []).append(time.monotonic() - t0)
        out.setdefault("writer_cpu_s", []).append(cpu_s(w.tid) - c0)
        out.setdefault("state", []).append(state)
        tl.stop()
        text = (out_dir / "horovod_timeline.json").read_text()
        out.setdefault("names_in_timeline", []).append(sum(f"w{i}.t{k}" in text for k in range(20)))
    out["parked_in_window"] = parks
t0 = time.monotonic()
hvd.shutdown()
out["shutdown_s"] = time.monotonic() - t0
print("PARK " + json.dumps(out), flush=True)
