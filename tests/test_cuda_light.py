"""The CUDA-light recording (``DPRO_CUDA_LIGHT``, ``dpro profile --cuda-light``, issue #31).

This machine has no GPU. The recorder's session switching runs the real torch.profiler on
CPU, with the CUDA parts mocked (the model "on CUDA", ``torch.cuda.synchronize``, and the
CUDA-only session recorded with the CPU activity instead). The import is checked on small
hand-made traces with hand-computed results, and on the golden H100 recording
``cuda_mlp_launch_bound`` made light by :mod:`light_synth` (what a CUDA-only session writes:
the runtime calls and GPU ops of the later steps, no CPU operators).
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

from dpro.contracts.recording import MetaKey
from dpro.graph.overhead import measured_overhead
from dpro.importers.kineto.light import Call, TimeMap, runtime_calls, split_steps, step_maps
from dpro.importers.kineto.read import compact_events
from dpro.importers.recording import collect, merge_dirs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from light_synth import make_light  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "recordings" / "cuda_mlp_launch_bound" / "raw"


# ----------------------------------------------------------------------------- recorder

def _cpu_profile(log: list):
    """torch.profiler.profile recording on CPU what would be CUDA here (no GPU): the
    activities asked for and the times each session started and stopped are logged."""
    real = torch.profiler.profile

    def make(*, activities, **kw):
        asked = sorted(str(a) for a in activities)
        prof = real(activities=[torch.profiler.ProfilerActivity.CPU], **kw)
        start, stop = prof.start, prof.stop

        def timed_start():
            log.append(("start", asked, time.perf_counter()))
            start()

        def timed_stop():
            log.append(("stop", asked, time.perf_counter()))
            stop()

        export = prof.export_chrome_trace

        def timed_export(path):
            log.append(("export", asked, time.perf_counter()))
            return export(path)

        prof.start, prof.stop, prof.export_chrome_trace = timed_start, timed_stop, timed_export
        return prof

    return make


def test_recorder_switches_to_a_cuda_only_session(tmp_path, monkeypatch):
    import dpro
    from dpro.profiler.pytorch.backend import TorchBackend

    log: list = []
    syncs: list[float] = []
    monkeypatch.setenv("DPRO_CUDA_LIGHT", "1")
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    monkeypatch.setattr(TorchBackend, "_on_cuda", lambda self: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(time.perf_counter()))
    monkeypatch.setattr(torch.profiler, "profile", _cpu_profile(log))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=1, steps=4)
    calls: list[tuple[float, float]] = []

    @dpro.profile(rec)
    def step() -> None:
        t = time.perf_counter()
        model(torch.randn(4, 8)).sum().backward()
        calls.append((t, time.perf_counter()))

    for _ in range(6):
        step()
    rec.close()
    cuda = sorted(["ProfilerActivity.CUDA"])
    both = sorted(["ProfilerActivity.CPU", "ProfilerActivity.CUDA"])
    # the structure step's session is exported before the CUDA-only one starts (a later
    # session wipes a stopped one's CUDA events: measured on an H100, torch 2.11)
    assert [(k, a) for k, a, _ in log] == [("start", both), ("stop", both), ("export", both), ("start", cuda),
                                           ("stop", cuda), ("export", cuda)]
    # no session starts, stops or is exported inside a call of the step function
    for _, _, t in log:
        assert not any(a < t < b for a, b in calls)
    assert len(syncs) == 3  # before the window, before the switch, before the end
    meta = json.loads((tmp_path / "rank0.meta.json").read_text())
    assert meta[MetaKey.CUDA_LIGHT] == {"structure_step": 1, "steps": [2, 3, 4], "trace": "rank0.light.gz"}
    assert len(meta[MetaKey.STEP_WALL_US]) == 5

    def names(f: str) -> list[str]:
        d = json.loads(gzip.decompress((tmp_path / f).read_bytes()))
        return [e["name"] for e in d["traceEvents"] if e.get("ph") == "X"]

    struct, light = names("rank0.json.gz"), names("rank0.light.gz")
    assert [n for n in struct if n.startswith("ProfilerStep#")] == ["ProfilerStep#1"]
    assert any(n.startswith("dpro.layer::") for n in struct)
    assert sorted(n for n in light if n.startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert not any(n.startswith("dpro.layer::") for n in light)  # the layer hooks went with the structure step


def test_light_mode_needs_cuda(tmp_path, monkeypatch, caplog):
    """A model on the CPU: every step recorded as usual, and a warning says why."""
    import dpro

    monkeypatch.setenv("DPRO_CUDA_LIGHT", "1")
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    model = torch.nn.Linear(4, 1)
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=0, steps=2)
    step = dpro.profile(rec)(lambda: model(torch.randn(2, 4)).sum().backward())
    with caplog.at_level("WARNING"):
        for _ in range(3):
            step()
        rec.close()
    assert "DPRO_CUDA_LIGHT needs a model on CUDA" in caplog.text
    assert not (tmp_path / "rank0.light.gz").exists()
    assert MetaKey.CUDA_LIGHT not in json.loads((tmp_path / "rank0.meta.json").read_text())


def test_cli_option():
    """The switch itself: tests/test_profile_options.py test_opt_in_switches."""
    from click.testing import CliRunner

    from dpro.cli import cli

    assert "--cuda-light" in CliRunner().invoke(cli, ["profile", "--help"]).output


# ----------------------------------------------------------------------------- step split

def _calls(*names: str) -> list[Call]:
    return [Call(n, 10.0 * i, 10.0 * i + 1, 100 + i) for i, n in enumerate(names)]


def test_split_by_runtime_calls_per_thread():
    struct = {"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync"), "bw": _calls("cudaLaunchKernel")}
    light = {"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaMemcpyAsync",
                            "cudaDeviceSynchronize"),  # the recorder's own sync before it stops: launched nothing
             "bw": _calls("cudaLaunchKernel", "cudaLaunchKernel")}
    steps = split_steps(struct, light, launched={100, 101, 102, 103})
    assert isinstance(steps, list) and len(steps) == 2
    assert [c.ts for c in steps[1]["main"]] == [20.0, 30.0] and [c.ts for c in steps[1]["bw"]] == [10.0]


def test_calls_between_steps_that_launched_nothing_are_dropped():
    """A ``torch.cuda.synchronize()`` of the training loop between two steps (and the
    session's own at its start and end) is not part of a step: seen on DDP GPU jobs
    (benchmarks/gpu/ddp_cost.py syncs around its timed calls)."""
    struct = {"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync")}
    light = {"main": _calls("cudaDeviceSynchronize", "cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize",
                            "cudaStreamSynchronize", "cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize")}
    steps = split_steps(struct, light, launched={101, 102, 105, 106})
    assert isinstance(steps, list) and [[c.ts for c in st["main"]] for st in steps] == [[10.0, 20.0], [50.0, 60.0]]


@pytest.mark.parametrize("light,why", [
    ({"main": _calls("cudaLaunchKernel", "cudaMemsetAsync"), "bw": _calls("cudaLaunchKernel")},
     "runtime call 1 is cudaMemsetAsync, the structure step's is cudaMemcpyAsync"),
    ({"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernel"), "bw": _calls("cudaLaunchKernel")},
     "1 calls left, fewer than the structure step's 2"),
    ({"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync"), "bw": _calls("cudaLaunchKernel", "cudaLaunchKernel")},
     "light steps per thread differ"),
    ({"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync"), "bw": _calls("cudaLaunchKernel"),
      "other": _calls("cudaLaunchKernel")}, "none in the structure step"),
])
def test_split_mismatch_says_why(light, why):
    struct = {"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync"), "bw": _calls("cudaLaunchKernel")}
    got = split_steps(struct, light, launched={100, 101, 102})
    assert isinstance(got, str) and why in got


# ----------------------------------------------------------------------------- interval scaling

def test_interval_scaling_hand_computed():
    """Structure step [0, 30] with calls [10, 12] and [20, 21]; two light steps with the same
    calls at [110, 111], [115, 116] and [130, 131], [140, 141].

    Between the calls the structure step's 8 µs become 4 µs (step 1) and 9 µs (step 2): an op
    at [14, 16] maps to [112, 113] and [133.25, 135.5]. The time after the last call (9 µs)
    is kept; the gap 116 -> 130 (14 µs) leaves 5 µs of lead-in before step 2's first call, and
    step 1 (no step before it) takes the same 5 µs."""
    struct = {"main": [Call("a", 10, 12), Call("b", 20, 21)]}
    light = [{"main": [Call("a", 110, 111), Call("b", 115, 116)]}, {"main": [Call("a", 130, 131), Call("b", 140, 141)]}]
    (f1, f2), dropped = step_maps(struct, light, (0.0, 30.0))
    assert dropped == 0
    assert [f1(t) for t in (0, 10, 12, 14, 16, 20, 21, 30)] == [105, 110, 111, 112, 113, 115, 116, 125]
    assert [f2(t) for t in (0, 14, 16, 30)] == [125, 133.25, 135.5, 150]


def test_time_map_is_monotone_across_threads():
    """Two threads whose calls interleave differently in a light step: the anchor that would
    go back is dropped, the map stays monotone."""
    struct = {"a": [Call("x", 10, 11)], "b": [Call("y", 12, 13)]}
    light = [{"a": [Call("x", 30, 31)], "b": [Call("y", 25, 26)]}]
    (f,), dropped = step_maps(struct, light, (0.0, 20.0))
    assert dropped == 2
    ts = [f(t) for t in range(0, 21)]
    assert ts == sorted(ts)
    assert isinstance(f, TimeMap)


def test_runtime_calls_from_events():
    ev = compact_events([
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 2, "tid": 1, "pid": 1,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 4, "dur": 4, "tid": 1, "pid": 1},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 9, "dur": 1, "tid": 2, "pid": 1,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 50, "dur": 1, "tid": 1, "pid": 1},
    ])
    assert runtime_calls(ev, 0, 20) == {1: [Call("cudaLaunchKernel", 5, 7, 7)], 2: [Call("cuLaunchKernel", 9, 10, 8)]}


# ----------------------------------------------------------------------------- collect (real H100 recording)

@pytest.fixture(scope="module")
def light_rec(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("light") / "raw"
    make_light(GOLDEN, d)
    return d


def test_collect_light_recording(light_rec):
    full = collect(GOLDEN).nodes["worker0"]
    gt = collect(light_rec)
    nt = gt.nodes["worker0"]
    assert gt.manifest.steps == [6, 7, 8, 9] == sorted(nt.steps)
    assert any("CUDA-light recording: steps [6, 7, 8, 9]" in n for n in gt.notes)
    assert set(nt.ops) == set(full.ops)
    # the light steps were the full recording's steps 6..9: their spans come back within 1 %,
    # every GPU op exactly, the CPU ops' starts from their step's start within 60 µs in the
    # median (measured 40; the recorder's time between two steps), 250 at most (121)
    F = {(e.op, e.step): e for e in full.events}
    for s in nt.steps:
        assert nt.steps[s][1] == pytest.approx(full.steps[s][1], rel=0.01)
    err = []
    for e in nt.events:
        f = F[(e.op, e.step)]
        if nt.ops[e.op].device.startswith("gpu"):
            assert (e.ts, e.dur) == (f.ts, f.dur)
        else:
            err.append(abs((e.ts - nt.steps[e.step][0]) - (f.ts - full.steps[e.step][0])))
    assert len(err) > 1000 and statistics.median(err) < 60 and max(err) < 250


def test_overhead_composes(light_rec):
    """The unprofiled correction compares the replayed pace with the after-window pace: with
    light steps replayed, the profiled pace is theirs (the window's calls after the first)."""
    nt = collect(light_rec).nodes["worker0"]
    walls = json.loads((light_rec / "rank0.meta.json").read_text())[MetaKey.STEP_WALL_US]
    ov = measured_overhead(nt)
    assert ov.profiled_us == pytest.approx(statistics.median(walls[6:10]))


def _break(light_rec: Path, tmp_path: Path, what: str) -> Path:
    d = tmp_path / "raw"
    shutil.copytree(light_rec, d)
    f = d / "rank0.light.gz"
    doc = json.loads(gzip.decompress(f.read_bytes()))
    ev = doc["traceEvents"]
    if what == "kernel":  # one kernel renamed in the third light step
        ks = [e for e in ev if e.get("cat") == "kernel"]
        ks[2 * len(ks) // 4 + 3]["name"] = "some_other_kernel"
    else:  # one launch fewer
        i = next(i for i, e in enumerate(ev) if e.get("name") == "cudaLaunchKernel")
        del ev[i]
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return d


@pytest.mark.parametrize("what,why", [("kernel", "GPU op 3 is some_other_kernel"), ("launch", "runtime call")])
def test_mismatch_falls_back_with_a_note(light_rec, tmp_path, what, why):
    d = _break(light_rec, tmp_path, what)
    gt = collect(d)
    nt = gt.nodes["worker0"]
    notes = [n for n in gt.notes if "CUDA-light" in n]
    assert len(notes) == 1 and "does not match the structure step 5" in notes[0] and why in notes[0]
    assert gt.manifest.steps == [5] == sorted(nt.steps)
    walls = json.loads((d / "rank0.meta.json").read_text())[MetaKey.STEP_WALL_US]
    assert measured_overhead(nt).profiled_us == walls[5]  # the structure step's own pace


def test_missing_light_file_and_merge(light_rec, tmp_path):
    merged = tmp_path / "merged"
    merged.mkdir()
    merge_dirs([light_rec], merged)
    assert (merged / "rank0.light.gz").is_file()
    (merged / "rank0.light.gz").unlink()
    gt = collect(merged)
    assert any("without rank0.light.gz" in n for n in gt.notes) and gt.manifest.steps == [5]


def test_leading_calls_that_launched_nothing_are_skipped():
    struct = {"main": _calls("cudaLaunchKernel", "cudaMemcpyAsync")}
    light = {"main": _calls("cudaGetDevice", "cudaLaunchKernel", "cudaMemcpyAsync")}
    steps = split_steps(struct, light, launched={101})
    assert isinstance(steps, list) and [c.name for c in steps[0]["main"]] == ["cudaLaunchKernel", "cudaMemcpyAsync"]
    assert isinstance(split_steps(struct, light, launched={100, 101}), str)  # it launched something: no skip


def test_retry_on_launches_alone(light_rec, tmp_path):
    """A runtime call that launched nothing, in one light step only: matched again on the
    calls that launched GPU work or waited for it, and the note says so."""
    d = tmp_path / "raw"
    shutil.copytree(light_rec, d)
    f = d / "rank0.light.gz"
    doc = json.loads(gzip.decompress(f.read_bytes()))
    ev = doc["traceEvents"]
    i = next(i for i, e in enumerate(ev) if e.get("name") == "cudaLaunchKernel")
    ev.append({**ev[i], "name": "cudaGetDevice", "dur": 0.5, "args": {}})
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    gt = collect(d)
    assert gt.manifest.steps == [6, 7, 8, 9]
    assert any("launched GPU work or waited for it alone" in n for n in gt.notes)


def test_structure_exported_too_late_says_so(light_rec, tmp_path):
    """What the first GPU run of the light mode wrote (the structure session exported after
    the CUDA-only one had run: its CUDA events at ts 0, dur 0): one note, the fallback."""
    d = tmp_path / "raw"
    shutil.copytree(light_rec, d)
    f = d / "rank0.json.gz"
    doc = json.loads(gzip.decompress(f.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset"):
            e["ts"], e["dur"] = 0.0, 0.0
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    gt = collect(d)
    assert gt.manifest.steps == [5]
    assert any("no times (ts 0, dur 0" in n for n in gt.notes)


def test_ranks_use_their_light_steps_all_or_none(light_rec, tmp_path):
    """Two ranks (the golden rank copied as rank 1, its light steps broken): both replay the
    structure step, so that the ranks share their steps, and the notes say why."""
    d = tmp_path / "raw"
    shutil.copytree(light_rec, d)
    broken = _break(light_rec, tmp_path / "b", "launch")
    shutil.copy(broken / "rank0.light.gz", d / "rank1.light.gz")
    shutil.copy(d / "rank0.json.gz", d / "rank1.json.gz")
    for r in (0, 1):
        meta = json.loads((light_rec / "rank0.meta.json").read_text())
        meta.update({"rank": r, "world_size": 2})
        (d / f"rank{r}.meta.json").write_text(json.dumps(meta))
    gt = collect(d)
    assert gt.manifest.steps == [5]
    assert sorted(gt.nodes["worker0"].steps) == sorted(gt.nodes["worker1"].steps) == [5]
    assert any(n.startswith("worker1: CUDA-light recording: rank1.light.gz does not match") for n in gt.notes)
    assert any(n.startswith("worker0: CUDA-light steps match, but replaying the structure step alone") for n in gt.notes)


def test_unreadable_light_file_is_a_note(light_rec, tmp_path):
    d = tmp_path / "raw"
    shutil.copytree(light_rec, d)
    (d / "rank0.light.gz").write_bytes(b"not a trace")
    gt = collect(d)
    assert gt.manifest.steps == [5]
    assert any(n.startswith("worker0: CUDA-light recording: ") and "rank0.light.gz" in n for n in gt.notes)
