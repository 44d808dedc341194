"""The compiled thread visit (dpro/importers/kineto/_segments.c) cuts the same CPU segments
as its Python reference (``segments.cpu_segments`` without it): on random event trees
(launches, blocking syncs, collective issues, annotations, layers, python frames, odd
values) and on a rank of every corpus set."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.importers.kineto import convert, segments
from dpro.importers.kineto.read import KEvent, RankFile, load_rank_file, trace_files

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "corpus"
needs_c = pytest.mark.skipif(isinstance(segments._compiled(), str), reason=f"compiled visit {segments._compiled()}")


def _both(monkeypatch, rf: RankFile, tid: object) -> tuple:
    fast = segments._compiled()
    out = []
    for engine in (fast, "off (the Python reference)"):
        monkeypatch.setattr(segments, "_compiled", lambda e=engine: e)
        try:
            out.append(segments.cpu_segments(rf, tid))
        except Exception as e:  # noqa: BLE001 - the error itself is compared
            out.append((type(e).__name__, str(e)))
    assert out[0] == out[1]
    return out[0]


NAMES = ["aten::mm", "aten::add_", "MulBackward0", "autograd::engine::evaluate_function: X", "c10d::allreduce_",
         "c10d::wait", "c10d::send", "c10d::recv_", "record_param_comms", "nccl:all_reduce", "gloo:all_reduce",
         "gloo:send", "dpro.layer::fc1", "dpro.bucket::0", "dpro.bucket::x", "Optimizer.step#SGD.step",
         "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "ProfilerStep#4", "ProfilerStep#x",
         "DistributedDataParallel.forward", "reducer::foo"]
RUNTIME = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize", "cudaStreamSynchronize",
           "cudaEventSynchronize", "cudaMemcpy", "cuLaunchKernel"]


def _random_rank(rng: random.Random) -> RankFile:
    evs: list[KEvent] = []
    corr = 100

    def span(t0: float, t1: float, depth: int, tid: object) -> None:
        nonlocal corr
        t = t0
        while t < t1 and len(evs) < 400:
            d = rng.choice([0.0, 1.0, 2.5, (t1 - t) / 2, t1 - t, 7.0])
            d = max(0.0, min(d, t1 - t))
            if rng.random() < 0.35 or depth > 4:
                name = rng.choice(RUNTIME)
                args = {"correlation": rng.choice([corr, corr, corr, float(corr), str(corr)])} if rng.random() < 0.9 else None
                corr += 1
                evs.append(KEvent(name, rng.choice(["cuda_runtime", "cuda_runtime", "cuda_driver"]), t, d, tid, args))
            else:
                name = rng.choice(NAMES)
                cat = rng.choice(["cpu_op", "cpu_op", "user_annotation", "python_function"])
                args = rng.choice([None, {"Sequence number": rng.randint(0, 9)}, {"Sequence number": True},
                                   {"Input Dims": [[4, 8]], "Input type": ["float"]},
                                   {"Concrete Inputs": ["", "", "1", "0"]}, {"In msg nelems": 8, "dtype": "Float"}])
                evs.append(KEvent(name, cat, t, d, tid, args))
                span(t, t + d, depth + 1, tid)
            t += d + rng.choice([0.0, 0.5, 1.0])

    for tid in (1, 2):
        span(0.0, 500.0, 0, tid)
    return RankFile(path=Path("r0.json"), rank=0, world_size=2, backend="gloo", events=evs)


@needs_c
@pytest.mark.parametrize("seed", range(60))
def test_random_trees_give_the_same_segments(monkeypatch, seed):
    rf = _random_rank(random.Random(seed))
    _both(monkeypatch, rf, 1)


@needs_c
@pytest.mark.skipif(not CORPUS.is_dir(), reason="the trace corpus (../shared/traces/corpus) is not here")
def test_every_corpus_set_gives_the_same_segments(monkeypatch):
    n = 0
    for d in sorted(CORPUS.iterdir()):
        if not d.is_dir():
            continue
        try:
            rf = load_rank_file(trace_files(d)[0], r"rank[-_]?(\d+)", 0)
        except DproInputError:
            continue
        segs, comm = _both(monkeypatch, rf, convert._main_tid(rf))
        n += bool(segs)
    assert n > 15


@pytest.mark.parametrize("cat", ["cpu_op", "user_annotation", "python_function"])
def test_events_nested_thousands_deep_give_a_one_line_error(monkeypatch, cat):
    """Each event inside the previous, 3000 levels (valid JSON): both visits recurse once
    per level, so a RecursionError came out as a traceback; now the same DproInputError."""
    evs = [KEvent(f"op{i}", cat, float(i), 6000.0 - 2 * i, 1, None) for i in range(3000)]
    evs.append(KEvent("aten::mm", "cpu_op", 2999.5, 0.1, 1, None))
    rf = RankFile(path=Path("r0.json"), rank=0, world_size=1, backend=None, events=evs)
    out = _both(monkeypatch, rf, 1) if not isinstance(segments._compiled(), str) else None
    with pytest.raises(DproInputError, match=r"r0\.json: thread 1: complete events nested too deep"):
        segments.cpu_segments(rf, 1)
    if out is not None:
        assert out[0] == "DproInputError"


@pytest.mark.parametrize("corr", ["", None, [1], "x1"])
def test_a_launch_or_kernel_without_an_integer_correlation_is_named(monkeypatch, corr):
    """Not the catch-all "cannot interpret": one line naming the event (both visits)."""
    evs = [KEvent("aten::mm", "cpu_op", 0.0, 10.0, 1, None),
           KEvent("cudaLaunchKernel", "cuda_runtime", 2.0, 1.0, 1, {"correlation": corr})]
    rf = RankFile(path=Path("r0.json"), rank=0, world_size=1, backend=None, events=evs)
    want = r"r0\.json: '{}' at ts {}: args\.correlation .+ is not an integer id"
    if not isinstance(segments._compiled(), str):
        assert _both(monkeypatch, rf, 1)[0] == "DproInputError"
    with pytest.raises(DproInputError, match=want.format("cudaLaunchKernel", r"2\.0")):
        segments.cpu_segments(rf, 1)
    kernel = RankFile(path=Path("r0.json"), rank=0, world_size=1, backend=None,
                      events=[KEvent("sgemm", "kernel", 5.0, 1.0, 7, {"correlation": corr, "stream": 7})])
    with pytest.raises(DproInputError, match=want.format("sgemm", r"5\.0")):
        segments.gpu_segments(kernel)
