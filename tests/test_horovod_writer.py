"""Finding Horovod's timeline writer thread by the bytes each thread wrote
(dpro/profiler/horovod/writer.py); the real job is in tests/test_tf_horovod.py."""

from __future__ import annotations

import os
import threading

from dpro.profiler.horovod.writer import SLACK_BYTES, thread_wchar, writer_candidates, writer_thread


def test_writer_is_the_thread_that_wrote_the_file():
    before = {1: 100, 2: 5000, 3: 0}
    after = {1: 100 + 2048 + 30, 2: 5000 + 2048 + 10, 3: 40, 4: 9000}
    # 1 and 2 both grew by about the file's size (2: Horovod's background thread, whose
    # socket writes matched by chance); 3 wrote less, 4 far more
    assert writer_candidates(before, after, 2048) == {1, 2}
    assert writer_candidates({1: 0}, {1: 2048 + SLACK_BYTES + 1}, 2048) == set()
    assert writer_candidates({1: 0}, {1: 2047}, 2048) == set()
    assert writer_candidates(before, after, 0) == set()


def test_writer_matches_in_most_probes():
    """The background thread can match one probe by chance (parking it stalls the job past
    gloo's timeout): the writer is the one thread that matched in most probes, and an ambiguity finds none."""
    assert writer_thread([{1, 2}, {1}, {1, 5}]) == 1
    assert writer_thread([{1}, set(), {1}]) == 1  # the writer itself may miss one
    assert writer_thread([{1, 2}, {1, 2}, {1, 2}]) is None  # not told apart: touch nothing
    assert writer_thread([{1}, {2}, set()]) is None
    assert writer_thread([]) is None


def test_thread_wchar_sees_a_threads_writes(tmp_path):
    """Per-thread written bytes, from /proc/self/task/<tid>/io (Linux)."""
    done: dict[str, int] = {}

    def write() -> None:
        done["tid"] = threading.get_native_id()
        before = thread_wchar()[done["tid"]]
        with open(tmp_path / "f", "wb") as f:
            f.write(b"x" * 12345)
        done["grown"] = thread_wchar()[done["tid"]] - before

    t = threading.Thread(target=write)
    t.start()
    t.join()
    assert done["grown"] >= 12345
    assert os.getpid() in thread_wchar()  # the main thread is listed too


def test_parked_writer_sleeps_and_wakes(tmp_path):
    """A real 1-rank Horovod job (tests/hvd_park_job.py): the writer found, parked (asleep,
    no CPU), woken (spinning again), the timeline still written, re-parked, and
    ``hvd.shutdown()`` (which joins the writer) returns at once."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from hvd_util import horovod_skip_reason, horovodrun

    if (why := horovod_skip_reason()) is not None:
        pytest.skip(why)
    job = Path(__file__).with_name("hvd_park_job.py")
    r = subprocess.run([horovodrun(), "-np", "1", "--gloo", "-H", "localhost:1", sys.executable, str(job),
                        str(tmp_path / "timeline.json")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOROVOD_TIMELINE": "DYNAMIC"})
    line = next((ln for ln in r.stdout.splitlines() if "PARK " in ln), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(line.split("PARK ", 1)[1])
    assert out["found"] and out["parkable"]
    assert out["parked_state"] == "S" and out["parked_cpu_s"] < 0.05
    assert out["awake_state"] in ("R", "S")  # spinning (R), or between two yields
    assert out["timeline_bytes"] > 100
    assert "R" in out["quick_wake_states"], out  # runnable again (parked: always S)
    assert out["reparked_state"] == "S"
    assert out["shutdown_s"] < 5


def test_writer_parked_inside_the_window_where_it_holds_no_lock(tmp_path):
    """A real 1-rank Horovod job (tests/hvd_park_window_job.py), five windows: the writer is
    parked while the timeline is on (asleep in sched_yield, no CPU), the window's collectives
    do not wait for it (its queue keeps their records), and every one of them is in the
    timeline once the window is stopped."""
    import json
    import platform
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from hvd_util import horovod_skip_reason, horovodrun

    if (why := horovod_skip_reason()) is not None:
        pytest.skip(why)
    if platform.machine() != "x86_64":
        pytest.skip("in-window parking reads the x86-64 signal frame")
    job = Path(__file__).with_name("hvd_park_window_job.py")
    r = subprocess.run([horovodrun(), "-np", "1", "--gloo", "-H", "localhost:1", sys.executable, str(job),
                        str(tmp_path), "5"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOROVOD_TIMELINE": "DYNAMIC"})
    line = next((ln for ln in r.stdout.splitlines() if "PARK " in ln), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(line.split("PARK ", 1)[1])
    assert out["found"]
    assert all(out["parked_in_window"]), out
    assert set(out["state"]) == {"S"}, out
    assert max(out["writer_cpu_s"]) < 0.05, out
    assert max(out["allreduce_s"]) < 10, out  # a stalled queue would wait for the 36 s sleep
    assert out["names_in_timeline"] == [20] * 5, out
    assert out["shutdown_s"] < 5


def test_parked_pc_is_none_for_a_thread_not_asleep_in_the_handler():
    """Only a thread asleep in the park handler has a frame to read: this one is running."""
    import threading as th

    from dpro.profiler.horovod.writer import parked_pc

    assert parked_pc(th.get_native_id(), 1) is None
