"""Markdown tables of the what-if harnesses' results (run.py, ps.py, variants.py JSON files).

    python benchmarks/whatif/table.py /tmp/dpro-whatif/results.json [/tmp/dpro-whatif-ps/results.json ...]

One table per file; the last line of each gives the median and the largest |error| and
how many cases are within 5 % and 10 %. Rows of ps.py with ``predicted_without_cpu_cost_us``
(predictions with ps-lite's CPU cost) get a column and a summary line for the prediction
without it. Rows of p3.py with ``measured_speedup`` get a line with the measured and
predicted speed-up.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _case(r: dict) -> str:
    if "variant" in r:
        return f"{r['variant']} (`{r['whatif']}`)"
    if "kvstore" in r:
        return f"{r['kvstore']} 1w1s -> {r['workers']}w{r['servers']}s"
    fw = "Horovod " if r.get("framework") == "horovod" else ""
    return f"{fw}{r['network']} P{r['profiled_workers']} -> N{r['workers']}"


def _summary(e: list[float]) -> str:
    e = sorted(e)
    return (f"median |error| {statistics.median(e):.1f} %, max {e[-1]:.1f} %; "
            f"{sum(x <= 5 for x in e)}/{len(e)} within 5 %, {sum(x <= 10 for x in e)}/{len(e)} within 10 %")


def table(rows: list[dict]) -> str:
    if all(r.get("predicted_without_cpu_cost_us") for r in rows):
        return _table_cpu(rows)
    out = ["| case | predicted ms | measured ms | error % | noise % | repeat % | foreign % |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.get("repeat_pct")
        if rep is None and r.get("run_medians_us"):
            m = r["run_medians_us"]
            rep = 100 * (max(m) - min(m)) / r["measured_us"]
        out.append(f"| {_case(r)} | {r['predicted_us'] / 1e3:.1f} | {r['measured_us'] / 1e3:.1f} | "
                   f"{r['error_pct']:+.1f} | {r.get('noise_pct', float('nan')):.1f} | "
                   f"{'' if rep is None else f'{rep:.1f}'} | {r.get('foreign_cpu_pct') or 0:.0f} |")
    out.append("")
    out.append(_summary([abs(r["error_pct"]) for r in rows]))
    for r in rows:  # p3.py: the speed-up over the plain job of the same rounds
        if "measured_speedup" in r:
            out.append(f"\n{r['variant']}: speed-up measured x{r['measured_speedup']:.3f}, "
                       f"predicted x{r['predicted_speedup']:.3f}")
    return "\n".join(out)


def _table_cpu(rows: list[dict]) -> str:
    """ps.py's rows with and without ps-lite's CPU cost."""
    out = ["| case | predicted ms | error % | without CPU cost ms | error % | measured ms | noise % | repeat % "
           "| foreign % |", "|---|---|---|---|---|---|---|---|---|"]
    without = []
    for r in rows:
        m, p0 = r["measured_us"], r["predicted_without_cpu_cost_us"]
        without.append(100 * (p0 - m) / m)
        out.append(f"| {_case(r)} | {r['predicted_us'] / 1e3:.1f} | {r['error_pct']:+.1f} | {p0 / 1e3:.1f} | "
                   f"{without[-1]:+.1f} | {m / 1e3:.1f} | {r.get('noise_pct', float('nan')):.1f} | "
                   f"{r.get('repeat_pct', float('nan')):.1f} | {r.get('foreign_cpu_pct') or 0:.0f} |")
    out += ["", "with the CPU cost: " + _summary([abs(r["error_pct"]) for r in rows]),
            "", "without it: " + _summary([abs(e) for e in without])]
    return "\n".join(out)


def main() -> None:
    for f in sys.argv[1:]:
        print(f"### {f}\n")
        print(table(json.loads(Path(f).read_text())))
        print()


if __name__ == "__main__":
    main()
