"""Where the TF window's page faults start: per-call minor faults of kept overhead.py runs.

Reads the runs that ``benchmarks/overhead.py --paths tf --keep DIR`` kept (each rank's
``timing.<rank>.json``, written by examples/tensorflow/hvd_recorder.py: ``minflt``, the minor
page faults of each call, and ``cpu_us``, the process's CPU over it) and prints, per variant
(``off`` = dpro disabled):

* per window position (its first call, second, ...): the share of the calls (ranks x runs)
  with more than ``--threshold`` faults, and their mean faults: whether the faults start at
  the window's first profiled call or after some calls;
* the same for the warm-up (less its first call) and the calls after the window;
* the CPU per call against its faults (least squares over every call but each run's first):
  µs of CPU per fault.

Fault counts do not depend on the machine's load, so this needs no measuring lock:

    .venv/bin/python benchmarks/tf_faults.py /tmp/keep/tf-convnet-4w-lo --warmup 5 --steps 5
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def load(job_dir: Path) -> dict[str, list[dict]]:
    """variant -> the rank timings of its runs (``<variant><k>/timing.<rank>.json``)."""
    out: dict[str, list[dict]] = {}
    for run in sorted(p for p in job_dir.iterdir() if p.is_dir()):
        variant = re.sub(r"\d+$", "", run.name)
        for f in sorted(run.glob("timing.*.json")):
            t = json.loads(f.read_text())
            if "minflt" in t:
                out.setdefault(variant, []).append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job_dir", type=Path, help="one job's directory under overhead.py's --keep")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threshold", type=int, default=1000, help="a call 'faults' above this many faults")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    if not a.job_dir.is_dir():
        raise SystemExit(f"tf_faults.py: {a.job_dir} is not a directory")
    runs = load(a.job_dir)
    if not runs:
        raise SystemExit(f"tf_faults.py: no timing.*.json with minflt under {a.job_dir}")
    w, s = a.warmup, a.steps
    doc: dict[str, dict] = {}
    print(f"# {a.job_dir.name}: calls with > {a.threshold} minor faults, share (mean faults per call); "
          f"window positions 1..{s}")
    for variant, ts in runs.items():
        row: dict[str, object] = {"ranks_x_runs": len(ts)}

        def share(idx: list[int]) -> tuple[float, float]:
            xs = [t["minflt"][i] for t in ts for i in idx if i < len(t["minflt"])]
            return sum(x > a.threshold for x in xs) / len(xs), statistics.mean(xs)

        pos = [share([w + j]) for j in range(s)]
        warm, after = share(list(range(1, w))), share(list(range(w + s, len(ts[0]["minflt"]))))
        row.update(window=pos, warmup=warm, after=after)
        pts = [(t["minflt"][i], t["cpu_us"][i] / 1e3) for t in ts if "cpu_us" in t for i in range(1, len(t["minflt"]))]
        if len(pts) > 2 and len({x for x, _ in pts}) > 1:
            mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            row["cpu_us_per_fault"] = slope * 1e3
        doc[variant] = row
        cells = "  ".join(f"{100 * f:3.0f}% ({m:5.0f})" for f, m in pos)
        print(f"{variant:<9} n={len(ts):<3} window {cells} | warm-up {100 * warm[0]:3.0f}% ({warm[1]:5.0f}) "
              f"after {100 * after[0]:3.0f}% ({after[1]:5.0f})"
              + (f" | CPU {row['cpu_us_per_fault']:.1f} us/fault" if "cpu_us_per_fault" in row else ""))
    if a.json_out:
        a.json_out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
