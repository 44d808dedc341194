"""Finding Horovod's timeline writer thread by the bytes each thread wrote
(dpro/profiler/horovod_writer.py); the real job is in tests/test_tf_horovod.py."""

from __future__ import annotations

import os
import threading

from dpro.profiler.horovod_writer import SLACK_BYTES, thread_wchar, writer_thread


def test_writer_is_the_thread_that_wrote_the_file():
    before = {1: 100, 2: 5000, 3: 0}
    after = {1: 100 + 2048, 2: 5000 + 2048 + 10, 3: 40, 4: 9000}
    # 1 grew by exactly the file's size, 2 by a little more: the closest wins
    assert writer_thread(before, after, 2048) == 1
    # a thread that wrote far more than the file (a logger) is not the writer
    assert writer_thread({1: 0}, {1: 2048 + SLACK_BYTES + 1}, 2048) is None
    assert writer_thread(before, after, 0) is None


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
