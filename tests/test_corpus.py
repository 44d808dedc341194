"""Every trace set of the public torch.profiler corpus (issue #26, part 1), and small
hand-written traces for each way the Kineto importer used to fail on it.

* Per corpus set (``../shared/traces/corpus/<set>/``, skipped when absent): ``dpro replay``
  exits 0, or exits non-zero with one specific line (not the catch-all "cannot interpret"),
  never a traceback. Where the set has CPU-side ProfilerStep spans, the measured iteration
  is the median CPU step within 2 %, computed here from the raw JSON (per step number, the
  mean over the set's ranks; then the median over steps; a GPU-bound rank's step is its
  GPU period: benchmarks/fidelity/kineto_steps.py).
* Regression traces, built as dicts: class A (an NCCL kernel whose launch predates the
  capture), class B (two GPU ops sharing a queue and an end), class C (legacy categories,
  GPU-only traces) and the step window (the GPU timeline's ProfilerStep copies).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("DPRO_SHARED", REPO.parent / "shared")) / "traces" / "corpus"
sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))
from kineto_steps import measured_median  # noqa: E402  (one reader, shared with the harnesses)

SETS = sorted(d.name for d in CORPUS.iterdir() if d.is_dir()) if CORPUS.is_dir() else []
#: sets whose measured step is not yet the median CPU step (none left: a step whose structure
#: differs is aligned with the reference step's where at least 70 % of the reference's ops
#: match by name and order, GPU ops launched before the capture left out; a last span that
#: holds no operator is not a step)
STRUCTURE_DROPS: dict[str, str] = {}

#: sets whose prediction is not yet within 5 % of the measured step
PREDICTION_OFF = {
    "param_dlrm_8rank": "one step per rank, the ranks' steps staggered by up to 7.5 ms on one clock: the mean CPU "
                        "step (16.0 ms) holds the early ranks' wait for the last one, a one-off arrival the replay "
                        "(dPRO's model: every rank starts the iteration together) does not take as an input; it "
                        "predicts 14.6 ms (-9 %); given the ranks' arrivals the model puts every rank's end within "
                        "1 % (test_dlrm_8rank_given_the_arrivals_every_rank_within_1pct); no second step holds a "
                        "steady state to compare with",
    **{n: f"the median CPU step is not the replayed steps': {why}" for n, why in STRUCTURE_DROPS.items()},
}

#: sets that cannot replay, with the specific message they get instead
NOT_REPLAYABLE = {
    "hta_cpu_only": "its one ProfilerStep holds only gloo collectives without issuing ops; its 4 cpu_ops come after it",
}


def cli(*args: object) -> tuple[int, str, str]:
    from dpro.cli import cli as dpro_cli

    res = CliRunner().invoke(dpro_cli, [str(a) for a in args], prog_name="dpro", catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def replay_json(path: Path) -> dict:
    code, out, err = cli("replay", path, "--json")
    assert code == 0, err
    return orjson.loads(out)


_results: dict[str, tuple[int, str, str]] = {}


def corpus_replay(name: str) -> tuple[int, str, str]:
    if name not in _results:
        _results[name] = cli("--allow-missing-ranks", "replay", CORPUS / name, "--json")  # some ranks of a job
    return _results[name]


# --------------------------------------------------------------------------- corpus


@pytest.mark.skipif(not SETS, reason=f"trace corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", SETS or ["none"])
def test_corpus_set_replays_or_says_why(name):
    code, out, err = corpus_replay(name)
    assert "Traceback" not in out + err
    if code == 0:
        r = orjson.loads(out)
        assert r["predicted_iteration_us"] > 0
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("dpro: error: ") and "cannot interpret" not in lines[0], lines[0]


@pytest.mark.skipif(not SETS, reason=f"trace corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=STRUCTURE_DROPS[n])) if n in STRUCTURE_DROPS else n
    for n in SETS
] or ["none"])
def test_corpus_measured_is_median_cpu_step(name):
    median = measured_median(CORPUS / name)
    if median is None:
        pytest.skip("no CPU-side ProfilerStep spans")
    if name in NOT_REPLAYABLE:
        pytest.skip(NOT_REPLAYABLE[name])
    code, out, err = corpus_replay(name)
    assert code == 0, err
    measured = orjson.loads(out)["measured_iteration_us"]
    assert measured == pytest.approx(median, rel=0.02)


@pytest.mark.skipif(not SETS, reason=f"trace corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PREDICTION_OFF[n])) if n in PREDICTION_OFF else n
    for n in SETS
] or ["none"])
def test_corpus_prediction_within_5pct(name):
    """Steady state (#26 item 3): the replay predicts the step period, so GPU work that
    runs behind the CPU is not counted as step time."""
    median = measured_median(CORPUS / name)
    if median is None:
        pytest.skip("no CPU-side ProfilerStep spans")
    if name in NOT_REPLAYABLE:
        pytest.skip(NOT_REPLAYABLE[name])
    code, out, err = corpus_replay(name)
    assert code == 0, err
    assert orjson.loads(out)["predicted_iteration_us"] == pytest.approx(median, rel=0.05)


@pytest.mark.skipif(not SETS, reason=f"trace corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", SETS or ["none"])
def test_corpus_exit_code(name):
    """Exactly the sets of NOT_REPLAYABLE fail."""
    assert (corpus_replay(name)[0] != 0) == (name in NOT_REPLAYABLE)


def test_hta_cpu_only_says_what_the_step_holds():
    if "hta_cpu_only" not in SETS:
        pytest.skip("corpus absent")
    code, _, err = corpus_replay("hta_cpu_only")
    assert code == 2
    assert "4 operator segments all lie outside them" in err and "gloo collectives" in err


# --------------------------------------------------------------------------- hand-written traces


def X(name, cat, ts, dur, tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def kernel(name, ts, dur, stream=7, cat="kernel", **args):
    return X(name, cat, ts, dur, tid=stream, pid=0, device=0, stream=stream, **args)


def launch(ts, corr, cat="cuda_runtime", tid=1):
    return X("cudaLaunchKernel", cat, ts, 5, tid=tid, correlation=corr)


def write(tmp_path: Path, events: list[dict], name: str = "rank0.json") -> Path:
    d = tmp_path / "job"
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(orjson.dumps({"traceEvents": events}))
    return d


def one_step(extra_gpu: list[dict]) -> list[dict]:
    """ProfilerStep#1 (0-1000 us) on the CPU: one op launching one kernel, plus ``extra_gpu``."""
    return [
        X("ProfilerStep#1", "user_annotation", 0, 1000),
        X("aten::add", "cpu_op", 10, 100),
        launch(20, 1),
        kernel("add_kernel", 40, 50, correlation=1),
        *extra_gpu,
    ]


def test_class_a_nccl_kernel_without_launch(tmp_path):
    """An NCCL kernel in the step whose launch predates the capture (no correlation)."""
    r = replay_json(write(tmp_path, one_step([kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 200, 100)])))
    assert r["measured_iteration_us"] == 1000


def test_class_b_gpu_ops_sharing_a_queue_and_an_end(tmp_path):
    """Zero-duration kernels at one integer µs on one stream (and a CUDA-graph-like burst)."""
    burst = [kernel(f"k{i}", 300, 0) for i in range(3)] + [kernel("graph_k", 300, 0, stream=9)]
    r = replay_json(write(tmp_path, one_step(burst)))
    assert r["measured_iteration_us"] == 1000


@pytest.mark.parametrize("legacy", [True, False])
def test_class_c_no_step_and_no_cpu_op(tmp_path, legacy):
    """PyTorch 1.8's categories (Operator/Runtime/Kernel) without ProfilerStep, and a
    GPU-only trace (runtime calls and kernels, no cpu_op): replayed as one step."""
    rt, k = ("Runtime", "Kernel") if legacy else ("cuda_runtime", "kernel")
    evs = [launch(20, 1, rt), kernel("a", 40, 50, cat=k, correlation=1), launch(200, 2, rt),
           kernel("b", 210, 50, cat=k, correlation=2)]
    if legacy:
        evs.append(X("aten::add", "Operator", 10, 300))
    code, out, err = cli("replay", write(tmp_path, evs), "--json")
    assert code == 0, err
    r = orjson.loads(out)
    assert r["measured_iteration_us"] == (300 if legacy else 240)  # the whole trace is the step


def test_class_c_kernels_only(tmp_path):
    """Not even a runtime call: the GPU queue alone is replayed."""
    r = replay_json(write(tmp_path, [kernel("a", 0, 50), kernel("b", 60, 40)]))
    assert r["measured_iteration_us"] == 100


def test_class_c_legacy_categories_are_read(tmp_path):
    from dpro.importers.kineto import import_kineto

    evs = [X("ProfilerStep#3", "Operator", 0, 1000), X("aten::add", "Operator", 10, 100),
           launch(20, 1, "Runtime"), kernel("add_kernel", 40, 50, cat="Kernel", correlation=1)]
    gt = import_kineto(write(tmp_path, evs))
    (nt,) = gt.nodes.values()
    assert any(o.name.startswith("aten::add") for o in nt.ops.values() if o.device == "cpu:main")
    assert any(a.startswith("aten::add") and b.startswith("add_kernel") for a, b in nt.edges)
    assert any("legacy event categories" in n for n in gt.notes)


def test_window_from_cpu_profiler_step_not_gpu_annotation(tmp_path):
    """The GPU timeline's copy of ProfilerStep#1 (shorter, later in the file: it used to win
    and give 800 us) must not become the step."""
    gpu_copy = X("ProfilerStep#1", "gpu_user_annotation", 5, 800, tid=7, pid=0)
    r = replay_json(write(tmp_path, one_step([gpu_copy])))
    assert r["measured_iteration_us"] == 1000


def test_window_from_gpu_annotation_only_says_so(tmp_path):
    from dpro.importers.kineto import import_kineto

    evs = one_step([X("ProfilerStep#1", "gpu_user_annotation", 0, 900, tid=7, pid=0)])[1:]
    gt = import_kineto(write(tmp_path, evs))
    (nt,) = gt.nodes.values()
    assert nt.steps[1] == (0.0, 900.0)
    assert any("steps taken from the GPU timeline" in n for n in gt.notes)


def lagging_steps(n: int) -> list[dict]:
    """n CPU steps of 1000 us; each launches at +880 us a 400 us kernel that runs at +1100 us,
    in the next step's window: the GPU runs behind the CPU."""
    evs = []
    for k in range(1, n + 1):
        t0 = 1000 * (k - 1)
        evs += [X(f"ProfilerStep#{k}", "user_annotation", t0, 1000), X("aten::mul", "cpu_op", t0 + 10, 900),
                launch(t0 + 880, k), kernel("mul_kernel", t0 + 1100, 400, correlation=k)]
    return evs


@pytest.mark.parametrize("n", [1, 3])
def test_gpu_lag_is_not_step_time(tmp_path, n):
    """Steady state: the kernel that runs after its step's CPU end is carried into the next
    step (the previous step's instance; a step without one uses its own, a step earlier),
    so the prediction is the 1000 us period, not one step's 1500 us makespan."""
    from dpro.importers.kineto import import_kineto

    d = write(tmp_path, lagging_steps(n))
    r = replay_json(d)
    assert r["measured_iteration_us"] == 1000
    assert r["predicted_iteration_us"] == pytest.approx(1000)
    assert any("carried into the next step" in note for note in r["notes"])
    (nt,) = import_kineto(d).nodes.values()
    (k,) = [o.id for o in nt.ops.values() if o.name == "mul_kernel"]
    assert not any(b == k and a.startswith("aten::mul") for a, b in nt.edges)  # its launch was a step earlier
    ev = {e.step: e.ts for e in nt.events if e.op == k}
    assert ev[1] == 100 and all(ev[s] == 1000 * (s - 2) + 1100 for s in range(2, n + 1))


# --------------------------------------------------------------------------- NCCL across ranks


def nccl_job(pre: list[int], post: list[int]) -> list[dict]:
    """The ranks of an NCCL job on one clock, as PyTorch 2.0 records them: compute (``pre``
    us), an all-reduce and an all-to-all whose kernels (``ncclKernel_AllReduce``,
    ``ncclKernel_SendRecv``) carry no size, the CPU side does (``record_param_comms`` /
    ``nccl:*`` Input Dims and type), then compute (``post`` us) whose kernel waits for the
    all-to-all. A collective's kernel ends 300 us after its last rank's kernel started."""
    colls = [("c10d::allreduce_", "nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float", [[262144]], "float"),
             ("c10d::alltoall_base_", "nccl:all_to_all", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", [[4096]], "long int")]
    issue = [[p + 20 + 500 * c for c in range(2)] for p in pre]
    start, end, prev = [[0.0] * 2 for _ in pre], [0.0, 0.0], 0.0
    for c in range(2):
        for r in range(len(pre)):
            start[r][c] = max(prev, issue[r][c] + 100)
        end[c] = prev = max(start[r][c] for r in range(len(pre))) + 300
    out = []
    for r, (p, q) in enumerate(zip(pre, post)):
        evs = [X("aten::mm", "cpu_op", 10, p - 10), launch(20, 1), kernel("gemm", 30, p - 30, correlation=1)]
        for c, (op, ann, kern, dims, dtype) in enumerate(colls):
            t = issue[r][c]
            evs += [X(op, "cpu_op", t, 60, **{"Input Dims": [[]], "Input type": ["TensorList"]}),
                    X("record_param_comms", "cpu_op", t + 5, 50, **{"Input Dims": [[], []], "Input type": ["TensorList", "Scalar"]}),
                    X(ann, "user_annotation", t + 10, 40, **{"Input Dims": dims, "Input type": [dtype]}),
                    launch(t + 20, c + 2), kernel(kern, start[r][c], end[c] - start[r][c], stream=20, correlation=c + 2)]
        t = issue[r][1] + 500
        k0 = max(end[1], t + 20)
        evs += [X("aten::relu", "cpu_op", t, q), launch(t + 10, 9), kernel("relu", k0, q - 20, correlation=9)]
        evs.insert(0, X("ProfilerStep#1", "user_annotation", 0, max(t + q, k0 + q - 20) + 10))
        out.append({"traceEvents": evs, "distributedInfo": {"rank": r, "world_size": len(pre), "backend": "nccl"}})
    return out


def test_nccl_sizes_kinds_from_the_cpu_side_and_ranks_joined(tmp_path):
    """#26 items 2-3: size and kind from the CPU side; the ranks' collectives paired by
    sequence number and expanded on links between them; the critical path crosses ranks
    (rank 1 computes 3 ms before the all-reduce, rank 0 computes 3 ms after the all-to-all)."""
    from dpro.importers.kineto import import_kineto
    from dpro.replayer.replay import replay

    d = tmp_path / "job"
    d.mkdir()
    for r, trace in enumerate(nccl_job([500, 3000], [3000, 500])):
        (d / f"rank{r}.json").write_bytes(orjson.dumps(trace))
    gt = import_kineto(d)
    comm = {(n, o.sub_op): o for n, nt in gt.nodes.items() for o in nt.ops.values() if o.cat == "COMM"}
    assert comm[("worker0", "ALLREDUCE")].bytes == 262144 * 4
    assert comm[("worker1", "ALLTOALL")].bytes == 4096 * 8  # the kernel says SendRecv, the CPU all-to-all
    assert comm[("worker0", "ALLTOALL")].txn == comm[("worker1", "ALLTOALL")].txn
    res = replay(gt)
    assert res.build.expanded == 2 and res.build.kept_coarse == 0
    assert not any("sizes unknown" in n for n in res.notes)
    g = res.graph
    links = [i for i in range(g.n) if "link:" in g.devices[g.device[i]]]
    assert any("a2a" in g.names[i] for i in links) and any("ring" in g.names[i] for i in links)
    preds: dict[int, set[str]] = defaultdict(set)
    for u, v in zip(*g.edges()):
        preds[int(v)].add(g.owners[g.device_owner[g.device[u]]])
    assert any(len(preds[i]) == 2 for i in links)  # a transfer needs both ranks
    owners = [p.device.split("/")[0] for p in res.critical_path]
    assert owners[0] == "worker1" and owners[-1] == "worker0"
    # rank 1's 3000 us, the collectives, rank 0's 3000 us: as measured (rank 0's step)
    assert res.predicted_iteration_us == pytest.approx(6910, rel=0.05)


@pytest.mark.skipif("param_dlrm_8rank" not in SETS, reason="corpus absent")
def test_dlrm_8rank_collectives_modelled():
    """PARAM's DLRM, 8 ranks: 5 all-to-alls and 3 all-reduces per rank, sizes from the CPU
    side, every one expanded on links between the ranks, alpha/beta fitted from them."""
    code, out, err = corpus_replay("param_dlrm_8rank")
    assert code == 0, err
    r = orjson.loads(out)
    assert r["collectives_expanded"] == 8 and r["collectives_measured"] == 0
    assert not any("sizes unknown" in n for n in r["notes"])
    assert r["link_cost"]["samples"] >= 2 and r["link_cost"]["beta_us_per_byte"] > 0
    # the measured step is not reproduced by construction
    assert r["predicted_iteration_us"] != pytest.approx(r["measured_iteration_us"], rel=1e-3)


def test_several_process_groups_pair_within_their_group(tmp_path):
    """4 ranks, tensor-parallel groups [0, 1], [2, 3] and data-parallel groups [0, 2],
    [1, 3] (PyTorch >= 2.1's record_param_comms: Collective name, In msg nelems, dtype,
    Process Group Name / Ranks; both TP groups are named "tp"). Each group numbers its own
    collectives, so every collective pairs with its own group's members only, and each is
    expanded over its group's links with the group's own fitted cost."""
    from dpro.importers.kineto import import_kineto
    from dpro.replayer.replay import replay

    groups = {"tp": [(0, 1), (2, 3)], "dp": [(0, 2), (1, 3)]}
    pre = [100, 400, 200, 300]
    issue = {(r, name): pre[r] + 20 + 400 * i for r in range(4) for i, name in enumerate(groups)}
    kstart = {}
    kend = {}
    for name, gs in groups.items():
        for g in gs:
            t = max(max(issue[(r, name)] + 100, kend.get(r, 0)) for r in g)
            for r in g:
                kstart[(r, name)] = max(issue[(r, name)] + 100, kend.get(r, 0))
                kend[r] = t + 200
    d = tmp_path / "job"
    d.mkdir()
    for r in range(4):
        evs = [X("ProfilerStep#1", "user_annotation", 0, 2000), X("aten::mm", "cpu_op", 10, pre[r] - 10)]
        for i, (name, gs) in enumerate(groups.items()):
            g = next(g for g in gs if r in g)
            t = issue[(r, name)]
            ks = kstart[(r, name)]
            ke = max(kstart[(q, name)] for q in g) + 200
            evs += [X("c10d::allreduce_", "cpu_op", t, 60),
                    X("record_param_comms", "cpu_op", t + 5, 50, **{
                        "Collective name": "allreduce", "In msg nelems": 1 << (16 + 2 * i), "dtype": "BFloat16",
                        "Process Group Name": name, "Process Group Ranks": str(list(g))}),
                    launch(t + 20, i + 1), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", ks, ke - ks, stream=20,
                                                  correlation=i + 1)]
        (d / f"rank{r}.json").write_bytes(orjson.dumps({"traceEvents": evs, "distributedInfo": {"rank": r, "world_size": 4}}))
    gt = import_kineto(d)
    txns = defaultdict(set)
    for nt in gt.nodes.values():
        for o in nt.ops.values():
            if o.cat == "COMM":
                txns[o.txn].add(nt.info.rank)
                assert o.bytes in (2 << 16, 2 << 18)  # bf16
    assert txns == {"g0-1/allreduce.0": {0, 1}, "g2-3/allreduce.0": {2, 3},
                    "g0-2/allreduce.0": {0, 2}, "g1-3/allreduce.0": {1, 3}}
    res = replay(gt)
    assert res.build.expanded == 4 and res.build.kept_coarse == 0
    assert sum("link cost of group" in n for n in res.notes) == 4


def test_steps_of_another_structure_are_aligned(tmp_path):
    """#26 item 6: three steps whose structures all differ (step 2 has an extra op, step 3
    lacks one): no structure holds most steps, so the later ones are aligned with the first
    (ops matched by name and order) and all three are replayed, not one."""
    from dpro.importers.kineto import import_kineto

    evs = []
    names = [["a", "b", "c", "d", "e"], ["a", "b", "x", "c", "d", "e"], ["a", "b", "c", "e"]]
    for k, ops in enumerate(names, start=1):
        t0 = 1000 * (k - 1)
        evs.append(X(f"ProfilerStep#{k}", "user_annotation", t0, 900))
        evs += [X(f"aten::{n}", "cpu_op", t0 + 10 + 100 * i, 80) for i, n in enumerate(ops)]
    gt = import_kineto(write(tmp_path, evs))
    (nt,) = gt.nodes.values()
    assert gt.manifest.steps == [1, 2, 3]
    assert sorted(o.name for o in nt.ops.values()) == ["STEP_END"] + [f"aten::{n}" for n in "abcde"]
    ev = {(e.op.split("@")[0], e.step): e for e in nt.events}
    assert ev[("aten::c", 2)].ts == 1000 + 310  # matched past the extra op
    assert ev[("aten::d", 3)].dur == 0  # a stand-in for the missing op
    assert any("aligned with step 1" in n for n in gt.notes)


def test_carried_collective_keeps_its_transaction(tmp_path):
    """A one-step, two-rank NCCL job whose all-reduce kernel runs after the CPU step end: the
    stand-in carried to the head of the queue (the step's own instance, a step earlier) is
    still the same collective on both ranks, so the ranks still pair and expand it."""
    from dpro.importers.kineto import import_kineto
    from dpro.replayer.replay import replay

    d = tmp_path / "job"
    d.mkdir()
    for r in range(2):
        evs = [X("ProfilerStep#1", "user_annotation", 0, 1000), X("aten::mm", "cpu_op", 10, 800),
               X("c10d::allreduce_", "cpu_op", 850, 60),
               X("nccl:all_reduce", "user_annotation", 860, 40, **{"Input Dims": [[1 << 20]], "Input type": ["float"]}),
               launch(870, 1), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1100 + 50 * r, 400 - 50 * r,
                                      stream=20, correlation=1)]
        (d / f"rank{r}.json").write_bytes(orjson.dumps({"traceEvents": evs, "distributedInfo": {"rank": r, "world_size": 2}}))
    gt = import_kineto(d)
    txns = {o.txn for nt in gt.nodes.values() for o in nt.ops.values() if o.cat == "COMM"}
    assert txns == {"allreduce.0"}
    assert any("carried into the next step" in n for n in gt.notes)
    assert replay(gt).build.expanded == 1


# --------------------------------------------------------------------------- step and measure rules (#26 follow-up)


def test_a_last_span_without_operators_is_not_a_step(tmp_path):
    """hta_amd_mi250's rule: the span the last ``prof.step()`` opens and the profiler's exit
    closes holds no operator; it is not a step (for dpro nor for the raw reader)."""
    d = write(tmp_path, one_step([]) + [X("ProfilerStep#2", "user_annotation", 1100, 49)])
    r = replay_json(d)
    assert r["steps"] == [1] and r["measured_iteration_us"] == 1000
    assert any("ProfilerStep#2 (49 us) holds no operator" in n for n in r["notes"])
    assert measured_median(d) == 1000


def test_gpu_ops_launched_before_the_capture_are_left_out(tmp_path):
    """A kernel whose correlation id is below every launch in the trace ran for a step
    before the capture: it is no op of the first step, and that step (the capture's
    warm-up, its GPU still busy with unprofiled work) is left out where two steps follow."""
    from dpro.importers.kineto import import_kineto

    evs = [kernel("old_kernel", 100, 300, correlation=3)]
    for k in range(1, 4):
        t0 = 1000 * (k - 1)
        evs += [X(f"ProfilerStep#{k}", "user_annotation", t0, 1000), X("aten::add", "cpu_op", t0 + 10, 100),
                launch(t0 + 20, 10 + k), kernel("add_kernel", t0 + 450, 50, correlation=10 + k)]
    gt = import_kineto(write(tmp_path, evs))
    (nt,) = gt.nodes.values()
    assert not any(o.name == "old_kernel" for o in nt.ops.values())
    assert gt.manifest.steps == [2, 3]
    assert any("1 GPU ops launched before the capture began" in n for n in gt.notes)
    assert any("step 1, the first profiled step, is left out as the capture's warm-up" in n for n in gt.notes)


def gpu_bound_steps(n: int, cpu: float = 1000, gpu: float = 1300) -> list[dict]:
    """n CPU steps of ``cpu`` us, each launching at its end one ``gpu`` us kernel; the GPU
    runs them back to back, so it falls ``gpu - cpu`` further behind every step."""
    evs, free = [], 0.0
    for k in range(1, n + 1):
        t0 = cpu * (k - 1)
        start = max(t0 + cpu - 80, free)
        free = start + gpu
        evs += [X(f"ProfilerStep#{k}", "user_annotation", t0, cpu), X("aten::mm", "cpu_op", t0 + 10, cpu - 20),
                launch(t0 + cpu - 100, k), kernel("mm_kernel", start, gpu, correlation=k)]
    return evs


def test_gpu_bound_trace_measures_and_predicts_the_gpu_period(tmp_path):
    """tl_mi300_resnet_act_ckpt's rule: where the GPU falls further behind the CPU at every
    step, the job's period is the GPU's (the step-to-step start of each step's first GPU
    op), and the replay, whose carried GPU work no longer waits for the GPU's backlog at
    the step's start, predicts it."""
    from dpro.gtrace.schema import GPU_PERIOD_META
    from dpro.importers.kineto import import_kineto

    d = write(tmp_path, gpu_bound_steps(5))
    r = replay_json(d)
    assert r["measured_iteration_us"] == 1300
    assert measured_median(d) == 1300
    assert r["predicted_iteration_us"] == pytest.approx(1300, rel=0.05)
    assert any("GPU-bound" in n for n in r["notes"]) and any("GPU backlog" in n for n in r["notes"])
    (nt,) = import_kineto(d).nodes.values()
    assert nt.meta[GPU_PERIOD_META] == 1300


def test_a_gpu_that_keeps_up_is_not_gpu_bound(tmp_path):
    """The same trace with the GPU as fast as the CPU: a constant lag, the CPU step measured."""
    r = replay_json(write(tmp_path, gpu_bound_steps(5, gpu=900)))
    assert r["measured_iteration_us"] == 1000
    assert not any("GPU-bound" in n for n in r["notes"])


def test_a_missing_op_takes_the_reference_offset_between_its_neighbours():
    """An aligned step's stand-in for a missing op sits at the reference op's offset from
    its step start (a kernel the reference ran after its CPU end stays in the GPU tail),
    kept between the op before it and the next matched op."""
    from dpro.importers.kineto.convert import align_step
    from dpro.importers.kineto.segments import Seg

    dev = "gpu0:s7"
    ref = {dev: [Seg(dev, "k1", 100, 150), Seg(dev, "k2", 900, 950), Seg(dev, "k3", 960, 990), Seg(dev, "k4", 1200, 1300)]}
    step = {dev: [Seg(dev, "k1", 1120, 1170), Seg(dev, "k3", 1950, 1990)]}
    out = align_step(step, ref, 1000, 2, ref_t0=0)
    assert out is None  # 2 of 4 matched, below 70 %
    step[dev].append(Seg(dev, "k4", 2100, 2200))
    ref[dev].insert(0, Seg(dev, "k0", 10, 20))
    step[dev].insert(0, Seg(dev, "k0", 1010, 1020))
    out = align_step(step, ref, 1000, 2, ref_t0=0)
    assert [(s.name, s.ts) for s in out] == [("k0", 1010), ("k1", 1120), ("k2", 1900), ("k3", 1950), ("k4", 2100)]
    ref[dev][2] = Seg(dev, "k2", 990, 995)  # the reference's offset lies past the next matched op: clamped
    out = align_step(step, ref, 1000, 2, ref_t0=0)
    assert out[2].ts == 1950


@pytest.mark.skipif("param_dlrm_8rank" not in SETS, reason="corpus absent")
def test_dlrm_8rank_given_the_arrivals_every_rank_within_1pct():
    """The model behind PARAM's DLRM xfail: replayed with each rank held back by its
    measured arrival (benchmarks/fidelity/dlrm_stagger.py), every rank's step end, which the
    collectives on the model decide, is within 1 % of its measured step."""
    from dlrm_stagger import hold_back, rank_ends

    from dpro.importers.kineto import import_kineto
    from dpro.replayer.replay import replay

    gt = import_kineto(CORPUS / "param_dlrm_8rank", progress=False)
    (step,) = gt.manifest.steps
    starts = {n: nt.steps[step][0] for n, nt in gt.nodes.items()}
    offsets = {n: s - min(starts.values()) for n, s in starts.items()}
    measured = {n: nt.steps[step][1] for n, nt in gt.nodes.items()}
    hold_back(gt, step, offsets)
    ends = rank_ends(replay(gt))
    for n in gt.nodes:
        assert ends[n] - offsets[n] == pytest.approx(measured[n], rel=0.01), n
