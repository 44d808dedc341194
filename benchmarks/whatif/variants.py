"""What-if validation of graph what-ifs on real one-process jobs: mixed precision (bf16
autocast on CPU) and a fused / foreach optimizer, in PAIRED ROUNDS.

The plain job (``examples/whatif/train_variant.py --model MODEL``) is memory-bound: its step
moves by tens of % with what the other core does, so a profile taken at one time and
variants measured at another compare two machines. Each of ``--rounds`` rounds therefore

1. profiles the plain job (its trace: ``round{r}/plain``),
2. runs the plain job and every variant UNPROFILED right after it, the order reversed
   every other round (each run timed by the script itself: the median step after the
   warm-up),
3. predicts every variant from THAT round's profile
   (``dpro whatif TRACE --apply NAME --json``).

Reported per round and as the median over rounds: predicted vs measured, the ratios each
side against its own baseline (the replayed plain profile, the round's unprofiled plain
run), and the plain job's profiled (replayed) vs unprofiled step in the same round.
Every run (profiled and not) uses benchmarks/jobenv.py's setting (``--setting``, default
``default_for("whatif")`` = ``threads1pin``: one compute thread, the process bound to one
core, ``PINNED_INDEX=0``).

The what-ifs' parameters are measured on this machine by microbenchmarks, never on the
variant runs: the autocast times by ``benchmarks/amp_calibration.py --model MODEL`` (the
model's own layer shapes, fp32 and autocast paired within each repeat, the median of 5 tries of
15 repeats, run as the jobs are: pinned, one thread; ``mixed_precision:auto=1``: absolute times where the bf16 kernel is emulated, else their ratio), the optimizers' speed-ups by
``benchmarks/whatif/optimizer_calibration.py --model MODEL``.

    benchmarks/measure.sh .venv/bin/python benchmarks/whatif/variants.py [--model mlp] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "whatif" / "train_variant.py"
#: variant -> (train_variant.py options, what-if to apply; {speedup}: optimizer_calibration.py's)
VARIANTS = {
    "amp-bf16": (["--amp"], "mixed_precision:auto=1"),
    "sgd-foreach": (["--optimizer", "sgd-foreach"], "fused_optimizer:speedup={speedup}"),
    "sgd-fused": (["--optimizer", "sgd-fused"], "fused_optimizer:speedup={speedup}"),
}

#: glibc malloc never trims the heap nor serves large blocks by mmap (freed memory is reused)
MALLOC_KEEP = "glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=4294967295"


def round_order(names: list[str], r: int) -> list[str]:
    """The unprofiled runs of round ``r``: the plain job then the variants, reversed every other round."""
    order = ["plain", *names]
    return order if r % 2 == 0 else order[::-1]


def median_interval(values: list[float], conf: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the rounds' values: the order statistics
    ``(x_(k), x_(n+1-k))`` with the largest ``k`` whose coverage, ``1 - 2 P(Binomial(n, 1/2) <= k-1)``,
    is still ``>= conf`` (``k = 1``, the whole range, when none is). Returns (low, high, coverage).
    A model's median error is told from the rounds' spread when this interval leaves out 0."""
    xs, n = sorted(values), len(values)

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= conf:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def summarize(rounds: list[dict], names: list[str]) -> list[dict]:
    """Per variant: the medians over rounds of the predicted and measured step, of the per-round
    error and of the per-round ratios (each side against its own baseline)."""
    rows = []
    for name in names:
        per = [rd["variants"][name] for rd in rounds]
        rows.append({
            "variant": name, "whatif": per[0]["whatif"],
            "predicted_us": statistics.median(p["predicted_us"] for p in per),
            "measured_us": statistics.median(p["measured_us"] for p in per),
            "error_pct": statistics.median(p["error_pct"] for p in per),
            "error_pct_rounds": [p["error_pct"] for p in per],
            "error_pct_interval": median_interval([p["error_pct"] for p in per]),
            "predicted_ratio": statistics.median(p["predicted_ratio"] for p in per),
            "measured_ratio": statistics.median(p["measured_ratio"] for p in per),
            "ratio_error_pct": statistics.median(100 * (p["predicted_ratio"] / p["measured_ratio"] - 1) for p in per),
        })
    return rows


def main() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import jobenv
    from scriptload import load_script

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds: profile, plain and variants unprofiled")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--setting", default=jobenv.default_for("whatif").name, choices=sorted(jobenv.SETTINGS),
                    help="benchmarks/jobenv.py setting of every run, profiled or not")
    ap.add_argument("--malloc", choices=["keep", "default"], default="keep",
                    help="keep: every run with glibc's malloc trim and mmap thresholds at their maximum "
                         "(GLIBC_TUNABLES), so freed tensors stay in the heap; default: glibc's own. Unprofiled, "
                         "the MLP gives its freed memory back and faults it in again every step (392k minor "
                         "faults in 80 steps against 106k profiled: the profiler's buffers keep the heap from "
                         "being trimmed), which made it up to 60 %% slower than its own profile")
    ap.add_argument("--amp-factors", type=Path, default=None,
                    help="DPRO_AMP_FACTORS for the prediction (default: measured here by benchmarks/amp_calibration.py)")
    ap.add_argument("--optimizer-speedups", type=Path, default=None,
                    help="optimizer_calibration.py --json file (default: measured here first)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif-variants"))
    o = ap.parse_args()
    fid = load_script("fidelity_run", REPO / "benchmarks" / "fidelity" / "run.py")
    setting = jobenv.SETTINGS[o.setting]
    names = o.variants.split(",")
    o.out.mkdir(parents=True, exist_ok=True)
    # one process: pinned.py binds it to core PINNED_INDEX % cores (with the setting's pin)
    job_env = dict(os.environ, PINNED_INDEX="0", **setting.env())
    if o.malloc == "keep":  # the same heap behaviour profiled and unprofiled (see --malloc)
        job_env["GLIBC_TUNABLES"] = MALLOC_KEEP
    base = ["--model", o.model, "--steps", str(o.steps), "--warmup", str(o.warmup)]

    def train(args: list[str], timing: Path) -> list[float]:
        cmd = [sys.executable, *setting.script(SCRIPT), *args, "--timing-out", str(timing)]
        subprocess.run(cmd, check=True, timeout=1200, capture_output=True, env=job_env)
        return json.loads(timing.read_text())["step_us"]

    factors = o.amp_factors or o.out / "amp_factors.json"
    if "amp-bf16" in names and not factors.exists():  # the pass's factors are this machine's, not the defaults (another CPU)
        # on the jobs' core, with their threads and malloc (setting.script: pinned.py with PINNED_INDEX);
        # paired repeats, the median of its tries (amp_calibration.py's defaults)
        subprocess.run([sys.executable, *setting.script(REPO / "benchmarks" / "amp_calibration.py"),
                        "--model", o.model, "--json", str(factors)], check=True, capture_output=True, timeout=1800,
                       env=job_env)
    speedups = o.optimizer_speedups or o.out / "optimizer_speedups.json"
    if not speedups.exists():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "whatif" / "optimizer_calibration.py"),
                        "--model", o.model, "--json", str(speedups)], check=True, capture_output=True,
                       timeout=600, env=job_env)
    speedup = json.loads(speedups.read_text())["speedup"]
    specs = {n: VARIANTS[n][1].format(speedup=speedup.get(n, 1.0)) for n in names}
    dpro_env = dict(os.environ, PYTHONPATH=str(REPO), DPRO_AMP_FACTORS=str(factors))
    rounds = []
    for r in range(o.rounds):
        meter = fid.CpuMeter()
        d = o.out / f"round{r}"
        d.mkdir(exist_ok=True)
        trace = d / "plain"
        prof_steps = train([*base, "--profile-dir", str(trace)], d / "plain_profiled.json")
        med = {}
        for name in round_order(names, r):  # unprofiled, right after the profile
            opts = [] if name == "plain" else VARIANTS[name][0]
            med[name] = statistics.median(train([*base, *opts], d / f"{name}.json"))
        foreign = meter.foreign_pct()
        rd = {"round": r, "order": round_order(names, r), "plain_unprofiled_us": med["plain"],
              "plain_profiled_run_us": statistics.median(prof_steps), "foreign_cpu_pct": foreign, "variants": {}}
        for name in names:
            pred = json.loads(subprocess.run(
                [sys.executable, "-m", "dpro.cli", "whatif", str(trace), "--apply", specs[name], "--json"],
                check=True, capture_output=True, text=True, env=dpro_env).stdout)
            p, b, m = pred["predicted_iteration_us"], pred["baseline_iteration_us"], med[name]
            rd["plain_replayed_us"] = b
            rd["variants"][name] = {"whatif": specs[name], "predicted_us": p, "measured_us": m,
                                    "error_pct": 100 * (p - m) / m, "predicted_ratio": p / b,
                                    "measured_ratio": m / med["plain"]}
        rounds.append(rd)
        print(f"round {r} ({' '.join(rd['order'])}): plain replayed {rd['plain_replayed_us'] / 1e3:.2f} ms, "
              f"profiled run {rd['plain_profiled_run_us'] / 1e3:.2f}, unprofiled {med['plain'] / 1e3:.2f}; "
              + ", ".join(f"{n} {v['predicted_us'] / 1e3:.2f}/{v['measured_us'] / 1e3:.2f} ms {v['error_pct']:+.1f} %"
                          for n, v in rd["variants"].items()) + f"; foreign {foreign or 0:.0f} %", flush=True)
    rows = summarize(rounds, names)
    print(f"{'variant':14} {'what-if':34} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'pred x':>7} {'meas x':>7} "
          f"{'x err %':>7} {'median, >=90 %':>15}  per-round err %")
    for x in rows:
        print(f"{x['variant']:14} {x['whatif']:34} {x['predicted_us'] / 1e3:9.2f} {x['measured_us'] / 1e3:9.2f} "
              f"{x['error_pct']:+7.1f} {x['predicted_ratio']:7.3f} {x['measured_ratio']:7.3f} "
              f"{x['ratio_error_pct']:+7.1f} {x['error_pct_interval'][0]:+7.1f}..{x['error_pct_interval'][1]:+.1f}  "
              + " ".join(f"{e:+.1f}" for e in x["error_pct_rounds"]))
    pl = [rd["plain_unprofiled_us"] for rd in rounds]
    rp = [rd["plain_replayed_us"] for rd in rounds]
    print(f"plain: replayed profile {statistics.median(rp) / 1e3:.2f} ms vs unprofiled {statistics.median(pl) / 1e3:.2f} "
          f"ms (median of per-round ratio x{statistics.median(a / b for a, b in zip(rp, pl)):.3f}); unprofiled "
          f"{min(pl) / 1e3:.2f}-{max(pl) / 1e3:.2f} ms across rounds")
    print(f"({os.cpu_count()} cores, setting {o.setting}, malloc {o.malloc}, load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    (o.out / "results.json").write_text(json.dumps({"setting": o.setting, "malloc": o.malloc, "model": o.model, "rows": rows,
                                                     "rounds": rounds}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from boost import boosted

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
