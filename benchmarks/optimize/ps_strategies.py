"""Predicted vs measured: the MXNet big-array bound `dpro optimize` picks for a parameter-server
job, against MXNet's default, no split and every key split, on real runs.

1. profile a real MXNet ``dist_sync`` job (ps-lite; in the ``-capR`` jobs every server and
   worker in its own network namespace behind a tbf cap, benchmarks/fidelity/ps_netns.py,
   root; the others on loopback) with MXNet's
   default ``MXNET_KVSTORE_BIGARRAY_BOUND``;
2. ``dpro optimize`` it, which writes ``mxnet.json`` (the bound);
3. run the unprofiled job (``DPRO_DISABLE=1``; examples/mxnet/train_ps.py, its own timer)
   with MXNet's default, with dpro's ``--dpro-strategy``, with no key split and with every key
   split, ``--repeats`` times each, interleaved (each repeat starts one setting later); print
   predicted and measured iteration times (medians) and the speed-ups over the default.

    .venv/bin/python benchmarks/optimize/ps_strategies.py --jobs mlp-2w2s-cap1000 --repeats 3 [--json]
        [--keep DIR] [--keep-bulking]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))
from ps_jobs import MX, job_cmd, measured_us, run, work_dir  # noqa: E402

#: (model, workers, servers, cap Mbit/s or None: loopback): jobs with more than one server
#: (with one, the bound changes nothing)
JOBS = {"mlp-2w2s-cap1000": ("mlp", 2, 2, 1000.0), "mlp-4w2s-cap1000": ("mlp", 4, 2, 1000.0),
        "conv-2w2s-cap200": ("conv", 2, 2, 200.0), "mlp-2w2s": ("mlp", 2, 2, None),
        "mlp-2w4s-cap1000": ("mlp", 2, 4, 1000.0)}
WARMUP, STEPS, AFTER = 12, 8, 20
#: setting -> the name of its predicted baseline in `dpro optimize --json`
SETTINGS = {"MXNet default": "MXNet default (bound 1000000)", "dpro": None, "no key split": "no key split",
            "every key split": "every key split across all servers"}


def one(job: str, repeats: int, tmp: Path, keep_bulking: bool = False) -> dict:
    m, w, s, cap = JOBS[job]
    d = tmp / job
    trace, strat = d / "trace", d / "strategy"
    run([str(MX / "dpro"), "profile", "-o", str(trace), "--warmup", str(WARMUP), "--steps", str(STEPS),
         *(["--mxnet-keep-bulking"] if keep_bulking else []), "--",
         *job_cmd(m, w, s, d / "timing_prof", WARMUP + STEPS + AFTER, cap)])
    opt = json.loads(run([str(MX / "dpro"), "optimize", str(trace), "-o", str(strat), "--json"]).stdout)
    mx = json.loads((strat / "mxnet.json").read_text())
    pred = {k: (opt["best_us"] if v is None else opt["baselines_us"][v]) for k, v in SETTINGS.items()}
    if mx.get("keep_default"):
        pred["dpro"] = opt["baselines_us"][SETTINGS["MXNet default"]]
    env = {"MXNet default": {}, "dpro": {}, "no key split": {"MXNET_KVSTORE_BIGARRAY_BOUND": str(2**31 - 1)},
           "every key split": {"MXNET_KVSTORE_BIGARRAY_BOUND": "1"}}
    names = list(SETTINGS)
    runs: dict[str, list[float]] = {k: [] for k in names}
    for i in range(repeats):
        for k in names[i % len(names):] + names[:i % len(names)]:  # the machine's pace drifts
            timing = d / f"timing_{k.replace(' ', '_')}_{i}"
            cmd = job_cmd(m, w, s, timing, WARMUP + 15, cap)
            if k == "dpro":
                cmd += ["--dpro-strategy", str(strat)]
            run(cmd, env={**os.environ, "DPRO_DISABLE": "1", **env[k]})
            runs[k].append(measured_us(timing, WARMUP))
    meas = {k: statistics.median(v) for k, v in runs.items()}
    base_p, base_m = pred["MXNet default"], meas["MXNet default"]
    return {"job": job, "bound": mx["MXNET_KVSTORE_BIGARRAY_BOUND"], "keep_default": bool(mx.get("keep_default")),
            "predicted_us": pred, "measured_us": meas, "runs_us": runs,
            "predicted_speedup": {k: base_p / v for k, v in pred.items()},
            "measured_speedup": {k: base_m / v for k, v in meas.items()},
            "optimize_time_s": opt["time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", default="mlp-2w2s-cap1000", help=f"comma-separated, of: {', '.join(JOBS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the traces, strategies and timings here")
    ap.add_argument("--keep-bulking", action="store_true", help="profile with `dpro profile --mxnet-keep-bulking`")
    a = ap.parse_args()
    rows = []
    with work_dir(a.keep, "dpro-psopt-") as tmp:
        for job in a.jobs.split(","):
            rows.append(r := one(job, a.repeats, Path(tmp), a.keep_bulking))
            if a.json:
                continue
            print(f"{job}: dpro picks MXNET_KVSTORE_BIGARRAY_BOUND={r['bound']}"
                  f"{' (keeps the default)' if r['keep_default'] else ''}")
            print(f"  {'setting':<18}{'predicted':>12}{'measured':>12}{'speed-up pred.':>16}{'measured':>10}")
            for k in SETTINGS:
                print(f"  {k:<18}{r['predicted_us'][k] / 1e3:9.2f} ms{r['measured_us'][k] / 1e3:9.2f} ms"
                      f"{r['predicted_speedup'][k]:16.3f}{r['measured_speedup'][k]:10.3f}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
