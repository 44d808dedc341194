#!/usr/bin/env bash
# Records the bundled example trace examples/traces/ddp_gloo_2rank_mlp/:
#   rank0.json.gz, rank1.json.gz        torch.profiler Chrome traces of ACTIVE steps (profiled run)
#   timing/rank{0,1}.json               ground truth: per-step times of a separate unprofiled run
#   timing/profiled_rank{0,1}.json      per-step times of the profiled run
#   README.md                           what/how/where, with the measured step times
# The timing files sit in a subfolder so that the folder itself holds only trace files
# (`dpro replay examples/traces/ddp_gloo_2rank_mlp` reads every *.json there).
#
# 2-rank DDP (gloo over loopback) of the `mlp` model: ~34 MB of gradients in two DDP buckets,
# so the all-reduces are clearly visible next to compute.
#
# Usage: examples/pytorch/record_example.sh            (from anywhere; ~30 s)
# Env overrides: PYTHON, TORCHRUN, OUT, MODEL, NPROC, BATCH, WARMUP, ACTIVE, TIMED, PORT,
#   WAIT_QUIET (seconds to wait before each run for other processes to use < 10% of the
#   CPUs; default 600, 0 = do not wait)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-/work/venv/bin/python}"
TORCHRUN="${TORCHRUN:-$(dirname "$PYTHON")/torchrun}"
MODEL="${MODEL:-mlp}"
NPROC="${NPROC:-2}"
BATCH="${BATCH:-32}"
WARMUP="${WARMUP:-5}"     # steps before timing / profiling
ACTIVE="${ACTIVE:-5}"     # profiled steps
TIMED="${TIMED:-20}"      # timed steps of the unprofiled ground-truth run
PORT="${PORT:-29531}"
WAIT_QUIET="${WAIT_QUIET:-600}"
OUT="${OUT:-$REPO/examples/traces/ddp_gloo_${NPROC}rank_${MODEL}}"
SCRIPT="examples/pytorch/train_ddp.py"

cd "$REPO"
rm -rf "$OUT"
mkdir -p "$OUT"

COMMON=(--model "$MODEL" --batch-size "$BATCH" --warmup "$WARMUP")
TRUTH_CMD=("$TORCHRUN" --nproc_per_node "$NPROC" --master_addr 127.0.0.1 --master_port "$PORT"
  "$SCRIPT" "${COMMON[@]}" --steps $((WARMUP + TIMED)) --timing-out "$OUT/timing/rank{rank}.json")
PROF_CMD=("$TORCHRUN" --nproc_per_node "$NPROC" --master_addr 127.0.0.1 --master_port $((PORT + 1))
  "$SCRIPT" "${COMMON[@]}" --steps $((WARMUP + ACTIVE)) --active "$ACTIVE"
  --profile-dir "$OUT" --timing-out "$OUT/timing/profiled_rank{rank}.json")

# Share of all cores used by OTHER processes while a command ran: machine CPU time
# (user+nice+system from /proc/stat) minus this shell's children's CPU time. `times` must
# run in this shell itself (a $(...) subshell would report its own, empty, children).
machine_cpu_s() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2 + $3 + $4) / hz}' /proc/stat; }
times_to_s() { tail -n 1 "$1" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } print t }'; }
# wait_quiet: wait up to WAIT_QUIET s until the machine's CPU use over 2 s is < 10%.
wait_quiet() {
  local deadline=$((SECONDS + WAIT_QUIET)) a b pct
  while :; do
    a=$(machine_cpu_s); sleep 2; b=$(machine_cpu_s)
    pct=$(echo "$a $b $(nproc)" | awk '{ printf "%.0f", 100 * ($2 - $1) / (2 * $3) }')
    if [ "$pct" -lt 10 ] || [ "$SECONDS" -ge "$deadline" ]; then
      echo "machine CPU use before the run: ${pct}% of all cores"
      return
    fi
    echo "machine busy (${pct}% of all cores), waiting"
    sleep 8
  done
}
# run_measured NAME CMD...: run CMD; append "NAME <foreign CPU %>" to $OUT/timing/foreign_cpu.txt.
run_measured() {
  local name="$1" m0 t0 before after
  shift
  before="$(mktemp)"; after="$(mktemp)"
  wait_quiet
  times > "$before"; m0=$(machine_cpu_s); t0=$(date +%s.%N)
  echo "+ $*"
  "$@"
  times > "$after"
  echo "$name $m0 $(machine_cpu_s) $(times_to_s "$before") $(times_to_s "$after") $t0 $(date +%s.%N) $(nproc)" |
    awk '{ f = 100 * (($3 - $2) - ($5 - $4)) / (($7 - $6) * $8); printf "%s %.0f\n", $1, (f < 0 ? 0 : f) }' \
    >> "$OUT/timing/foreign_cpu.txt"
  rm -f "$before" "$after"
}

mkdir -p "$OUT/timing"
run_measured unprofiled "${TRUTH_CMD[@]}"
run_measured profiled "${PROF_CMD[@]}"

# Relative commands for the README (run from the repository root).
rel() { local s="$*"; s="${s//$REPO\//}"; echo "$s"; }
TRUTH_TXT="$(rel "${TRUTH_CMD[*]}")"
PROF_TXT="$(rel "${PROF_CMD[*]}")"

"$PYTHON" - "$OUT" "$TRUTH_TXT" "$PROF_TXT" <<'EOF'
"""Write README.md for the recorded example from the timing files (no hard-coded numbers)."""
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

out, truth_cmd, prof_cmd = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


def load(prefix: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "timing").glob(f"{prefix}rank*.json"))]


def per_step_max(recs: list[dict], key: str = "step_us") -> list[float]:
    """Each step's slowest rank (ranks sync every step, so they agree to within noise)."""
    return [max(steps) for steps in zip(*(r[key] for r in recs))]


truth = load("")
prof = load("profiled_")
t_steps = per_step_max(truth)
# Profiled: the traced steps, minus the profiler's own start/stop bookkeeping in prof.step().
lo, hi = prof[0]["active_steps"]
p_steps = [max(s - q for s, q in zip(*pair)) for pair in
           zip(zip(*(r["step_us"] for r in prof)), zip(*(r["profiler_us"] for r in prof)))][lo:hi]
t_med, p_med = statistics.median(t_steps), statistics.median(p_steps)
foreign = dict(l.split() for l in (out / "timing" / "foreign_cpu.txt").read_text().splitlines() if l.strip())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "README.md")
size_kib = sum(p.stat().st_size for p in files) / 1024
r0 = truth[0]

buckets = r0.get("ddp_bucket_bytes") or []
bucket_txt = " + ".join(f"{b / 1e6:.1f} MB" for b in buckets) or "?"

readme = f"""# Example trace: {r0['world_size']}-rank DDP (gloo) `{r0['model']}`

Recorded by `examples/pytorch/record_example.sh`: PyTorch DDP training of the `{r0['model']}`
model from `examples/pytorch/models.py` ({r0['num_parameters'] / 1e6:.1f} M parameters,
{4 * r0['num_parameters'] / 1e6:.1f} MB of fp32 gradients, all-reduced by DDP in
{len(buckets)} bucket(s): {bucket_txt}) on {r0['world_size']} ranks, gloo backend over
loopback, batch {r0['batch_size']} per rank, SGD with momentum 0.9, one intra-op thread per rank.

## Files

| file | what |
|---|---|
| `rank0.json.gz`, `rank1.json.gz` | `torch.profiler` Chrome traces (CPU activity, shapes recorded) of {prof[0]['active_steps'][1]} steps after {prof[0]['warmup']} warm-up steps |
| `timing/rank{{0,1}}.json` | ground truth: per-step wall-clock times (us) of a separate, unprofiled run ({len(t_steps)} steps after {r0['warmup']} warm-up) |
| `timing/profiled_rank{{0,1}}.json` | per-step times of the profiled run |
| `timing/foreign_cpu.txt` | % of all CPUs used by other processes during each run |

The timing files are in a subfolder so that this folder holds only trace files:
`dpro replay examples/traces/ddp_gloo_2rank_mlp` reads every `*.json(.gz)` directly in it.

`step_us` is `time.perf_counter()` from one step's start to the next; `profiler_us` is time
spent inside `prof.step()` (profiler start/stop bookkeeping, not covered by the trace).

## Measured step time

* unprofiled (ground truth): **{t_med / 1e3:.1f} ms** median over {len(t_steps)} steps
  (each step's slowest rank; min {min(t_steps) / 1e3:.1f}, max {max(t_steps) / 1e3:.1f} ms)
* profiled steps (in the trace): {p_med / 1e3:.1f} ms median over {len(p_steps)} steps
  (profiler bookkeeping excluded), i.e. {100 * (p_med / t_med - 1):+.0f}% profiling overhead

Other processes used {foreign.get('unprofiled', '?')}% (unprofiled run) and {foreign.get('profiled', '?')}%
(profiled run) of all CPUs while these were recorded (`timing/foreign_cpu.txt`).
Step times on this small shared VM drift by up to ~2x over periods of seconds (the two vCPUs
do not deliver two cores' worth of throughput all the time), so two runs of the same job can
differ by 20-50%; compare with the spread above rather than expecting exact agreement.

## Commands

Run from the repository root (`examples/pytorch/record_example.sh` does exactly this):

```
{truth_cmd}
{prof_cmd}
```

## Machine

{os.cpu_count()}-core CPU VM ({cpu}), Linux {platform.release()}, Python {platform.python_version()},
torch {torch.__version__}, gloo over loopback (127.0.0.1), both ranks on the same host.

Total size of the recorded files: {size_kib:.0f} KiB.
"""
(out / "README.md").write_text(readme)
print(f"unprofiled median {t_med / 1e3:.1f} ms, profiled {p_med / 1e3:.1f} ms, {size_kib:.0f} KiB in {out}")
EOF
