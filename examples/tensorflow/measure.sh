#!/usr/bin/env bash
# Profile a TF + Horovod example with `dpro profile`, replay it, and print one line:
# model, workers, dpro's predicted and measured iteration (µs), error, and the script's own
# median step time over the profiled and the unprofiled steps (µs, mean over ranks).
#
# Usage: examples/tensorflow/measure.sh MODEL NP [OUT_DIR]   (after scripts/setup_tf.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODEL="${1:-convnet}"; NP="${2:-2}"; OUT="${3:-$ROOT/out/tf_${MODEL}_np${NP}}"
TF="${TF_VENV:-$ROOT/.venv-tf}/bin"
DPRO="${DPRO:-$TF/dpro}"
rm -rf "$OUT" "$OUT.timing".*
"$DPRO" profile -o "$OUT" --warmup "${WARMUP:-5}" --steps "${STEPS:-5}" -- \
    "$TF/horovodrun" -np "$NP" --gloo -H "localhost:$NP" "$TF/python" "$ROOT/examples/tensorflow/hvd_recorder.py" \
    --model "$MODEL" --steps "${TOTAL:-20}" --timing-out "$OUT.timing" >"$OUT.log" 2>&1 \
    || { tail -20 "$OUT.log"; exit 1; }
"$DPRO" replay "$OUT" --json >"$OUT.replay.json"
"$TF/python" - "$OUT" "$MODEL" "$NP" <<'PY'
import glob, json, statistics, sys
out, model, np_ = sys.argv[1:]
r = json.load(open(out + ".replay.json"))
t = [json.load(open(f)) for f in sorted(glob.glob(out + ".timing.*.json"))]
mean = lambda k: statistics.mean(x[k] for x in t if x[k] is not None)
print(f"{model:12s} np={np_}  predicted {r['predicted_iteration_us']:9.0f}  measured {r['measured_iteration_us']:9.0f}"
      f"  error {r['error_pct']:+6.1f}%   own clock: profiled {mean('median_step_us_profiled'):9.0f}"
      f"  unprofiled {mean('median_step_us_unprofiled'):9.0f}")
PY
