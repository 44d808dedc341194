"""Run by tests/test_horovod_writer.py under ``horovodrun -np 1`` with HOROVOD_TIMELINE=DYNAMIC:
find Horovod's timeline writer, park it, and report what the thread did (JSON on stdout)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch

from dpro.profiler.horovod.writer import idle_timeline_writer, thread_state


def cpu_s(tid: int) -> float:
    """utime + stime of thread ``tid`` in seconds."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cpu_over(tid: int, seconds: float) -> float:
    c0 = cpu_s(tid)
    time.sleep(seconds)
    return cpu_s(tid) - c0


hvd.init()
w = idle_timeline_writer("horovod.torch")  # parks it
out = {"found": w is not None, "parkable": bool(w and w.parkable)}
if w is not None:
    time.sleep(0.2)
    out["parked_state"] = thread_state(w.tid)
    out["parked_cpu_s"] = busy_cpu_over(w.tid, 1.0)
    w.wake()
    time.sleep(0.2)
    out["awake_state"] = thread_state(w.tid)
    out["awake_cpu_s"] = busy_cpu_over(w.tid, 1.0)
    # the timeline still works after a park/wake cycle
    path = Path(sys.argv[1])
    hvd.start_timeline(str(path), mark_cycles=False)
    hvd.allreduce(torch.ones(1000), name="x")
    hvd.stop_timeline()
    out["timeline_bytes"] = path.stat().st_size
    # a wake-up right behind the park (a Recorder made before hvd.init finds, parks and
    # wakes the writer at once) must not leave it asleep
    w.park()
    w.wake()
    states = ""
    for _ in range(20):
        time.sleep(0.01)
        states += thread_state(w.tid) or "?"
    out["quick_wake_states"] = states
    w.park()
    time.sleep(0.2)
    out["reparked_state"] = thread_state(w.tid)
t0 = time.monotonic()
hvd.shutdown()  # joins the writer: dpro wakes it first
out["shutdown_s"] = time.monotonic() - t0
print("PARK " + json.dumps(out), flush=True)
