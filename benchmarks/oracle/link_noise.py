"""How stable is the oracle's calibration? Run gloo_link.py several times back to back,
boosted like run.py's measured jobs, fit each run (dpro/oracle/calibration.py) and print
every fit and, per process count, the spread of α and of a few predicted costs; and, from
the same launches, the per-call α of back-to-back calls (measure.streams: what a step's
halo exchanges and pipeline sends pay) beside the isolated calls' α the oracle charged them
before (a pipeline send: the all-reduce's α per ring step; a halo exchange: the exchange's).

    python benchmarks/oracle/link_noise.py [--procs 2,2,2,2,4,4,4] [--out /tmp/dpro-oracle-link]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the costs whose spread is printed: (kind, bytes)
PROBES = (("allreduce", 1 << 10), ("allreduce", 128 << 10), ("allgather", 512 << 10), ("exchange", 32 << 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,2,2,2,4,4,4", help="ranks of each fit, in order")
    p.add_argument("--out", type=Path, default=Path("/tmp/dpro-oracle-link"))
    p.add_argument("--no-host", action="store_true", help="collectives only (faster)")
    p.add_argument("--compute-us", type=float, default=0.0, help="compute before every timed call (gloo_link.py)")
    args = p.parse_args()
    sys.path[:0] = [str(HERE), str(HERE.parent / "whatif"), str(HERE.parents[1])]
    import run as bench
    from boost import boosted

    from dpro.oracle.calibration import fit_collectives, fit_host, fit_streams
    from dpro.oracle.formulas import Link

    args.out.mkdir(parents=True, exist_ok=True)
    seen: dict[int, list[tuple[float, list[float]]]] = {}
    per_call: dict[int, list[dict[str, float]]] = {}
    with boosted() as on:
        print(f"# measured jobs boosted: {'yes' if on else 'no'}; collectives after {args.compute_us:g} µs of compute")
        for k, n in enumerate(int(x) for x in args.procs.split(",")):
            f = args.out / f"samples_{k}_{n}.json"
            bench.torchrun(n, HERE / "gloo_link.py", "--out", str(f), "--seed", str(k), "--compute-us", str(args.compute_us),
                           *(["--no-host"] if args.no_host else []))
            d = json.loads(f.read_text())
            c = fit_collectives(n, d["raw"])
            ar, ag, ex = c["allreduce"], c["allgather"], c["exchange"]
            link = Link(ar, 1.0, ag, ex)
            cost = {"allreduce": lambda m: link.allreduce(n, m), "allgather": lambda m: link.allgather(n, m),
                    "exchange": lambda m: link.exchange(1, m)}
            probes = [cost[kind](m) for kind, m in PROBES]
            seen.setdefault(n, []).append((ar.alpha, probes))
            line = "; ".join(f"{kind} α {x.alpha:.0f} µs β {x.beta * 1e3:.3f} ns/B" for kind, x in c.items())
            host = ""
            if d["raw"].get("cat"):
                h = fit_host(d["raw"], d["function_us"])
                host = (f"; host: cat {h.cat.alpha:.1f} µs + {h.cat.beta * 1e3:.3f} ns/B, slice {h.slice.alpha:.1f} + "
                        f"{h.slice.beta * 1e3:.3f}, clone {h.clone.alpha:.1f} + {h.clone.beta * 1e3:.3f}, zeros "
                        f"{h.zeros.alpha:.1f} + {h.zeros.beta * 1e3:.3f}, Function {h.function_us:.1f} µs")
            print(f"{n} ranks: {line}{host}", flush=True)
            st = fit_streams(n, d["raw"], c, int(d.get("stream_calls", 1)))
            if st:
                per_call.setdefault(n, []).append({"old p2p": ar.alpha, "old exchange": ex.alpha} |
                                                  {f"new {k}": v.cost.alpha for k, v in st.items()})
                print("   back to back: " + "; ".join(
                    f"{k} α {v.cost.alpha:.0f} µs (rounds {v.alpha_rounds[0]:.0f}-{v.alpha_rounds[2]:.0f}) "
                    f"β {v.cost.beta * 1e3:.3f} ns/B" for k, v in st.items()), flush=True)
    for n, fits in sorted(seen.items()):
        al = [a for a, _ in fits]
        print(f"{n} ranks, {len(fits)} fits: all-reduce α {min(al):.0f}-{max(al):.0f} µs", end="")
        for i, (kind, m) in enumerate(PROBES):
            v = [pr[i] for _, pr in fits]
            print(f"; {kind} {m >> 10} KiB {min(v):.0f}-{max(v):.0f} µs", end="")
        print()
    for n, fits in sorted(per_call.items()):  # old vs new per-call α over the launches
        for k in fits[0]:
            v = sorted(f[k] for f in fits if k in f)
            med = statistics.median(v)
            print(f"{n} ranks, {len(v)} launches, per-call α {k:<14} {v[0]:7.0f}-{v[-1]:7.0f} µs, median {med:7.0f}, "
                  f"spread (max-min)/median {100 * (v[-1] - v[0]) / med if med else float('nan'):5.1f} %")


if __name__ == "__main__":
    main()
