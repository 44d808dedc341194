"""What each part of the oracle's calibration changes: rerun the oracle on a run.py output
(its profiled trace, platform files and measured times; nothing is measured again) with
parts of the calibration taken out, and print the error per strategy.

    python benchmarks/oracle/ablate.py /tmp/dpro-oracle-bench [--platform platform_c0.json]

Variants: ``α, β only`` (the 2-process all-reduce fit, as before the calibration),
``+ links, no bucket`` (the collectives per process count: all-reduce, all-gather, halo
exchange, as α + βS), ``+ links`` (with the token bucket the calibration found, if any),
``+ host`` (the full calibration, its topology), ``+ host, <the other topology>``,
``+ host, no contention`` (φ = 1), ``+ host, isolated α`` (the full calibration without
its back-to-back calls: halo exchanges and pipeline sends charged the per-call α of
isolated calls after a barrier, as before #29's third session; the variants above
``+ host`` have none either). Error = (predicted − measured) / measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="run.py's --out directory")
    p.add_argument("--platform", default="platform_c0.json", help="platform file in OUT")
    p.add_argument("--refit", action="store_true",
                   help="first rebuild the platform file from OUT's calibration samples (gloo_link_<n>_c0.json) "
                        "with the current library (platform_from_samples); nothing measured again")
    p.add_argument("--profiles", choices=("all", "median", "first"), default="all",
                   help="the profiles besides OUT/trace: all of run.py's (every repeat at every batch; default), the "
                        "median per batch only (OUT/trace_b<B>), or none (one profile: the proportional rule)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import dpro
    from dpro.oracle import run_oracle
    from dpro.oracle.calibration import Calibration, HostCosts
    from dpro.oracle.platform import read_platform

    if args.refit:
        import os

        from dpro.oracle.calibration import platform_from_samples

        samples = {int(f.name.split("_")[2]): json.loads(f.read_text())
                   for f in sorted(args.out.glob("gloo_link_*_c0.json"))}
        args.platform = "platform_refit.json"
        (args.out / args.platform).write_text(json.dumps(platform_from_samples(samples, cores=os.cpu_count())))
        print(f"refitted {sorted(samples)} processes' samples into {args.out / args.platform}")
    res = json.loads((args.out / "result.json").read_text())
    rows = res["rows"]
    procs = sorted({r["devices"] for r in rows})
    job = dpro.open(args.out / "trace")
    # run.py's other profiles (the affine rule, issue #29): every repeat (the guarded rule's
    # input, as run.py passes them since session 27), the median per batch only (as before), or none
    dirs = sorted(t for t in args.out.glob("trace_b*") if t.is_dir())
    at = {"all": [dpro.open(t) for t in dirs],
          "median": [dpro.open(t) for t in dirs if t.name.count("_") == 1], "first": []}[args.profiles]
    print(f"profiles: trace + {', '.join(t.name for t in dirs) if args.profiles == 'all' else args.profiles}")
    full = read_platform(args.out / args.platform)
    cal = full.calibration
    plain_links = {n: {k: dataclasses.replace(c, burst=0.0, beta_burst=0.0) for k, c in d.items()}
                   for n, d in cal.links.items()}
    other = "shared" if cal.topology == "per-rank" else "per-rank"
    variants = {
        "α, β only": dataclasses.replace(full, calibration=Calibration()),
        "+ links, no bucket": dataclasses.replace(full, calibration=Calibration(plain_links, HostCosts(), cal.topology)),
        "+ links": dataclasses.replace(full, calibration=Calibration(cal.links, HostCosts(), cal.topology)),
        "+ host": full,
        f"+ host, {other}": dataclasses.replace(full, calibration=dataclasses.replace(cal, topology=other)),
        "+ host, isolated α": dataclasses.replace(full, calibration=dataclasses.replace(cal, calls={})),
    }
    preds: dict[str, dict[tuple[str, int], tuple[float, float]]] = {}
    full_res = None
    for name, plat in [*variants.items(), ("+ host, no contention", full)]:
        tmp = args.out / f"ablate_{len(preds)}.json"
        d = json.loads((args.out / args.platform).read_text())
        if plat.calibration.links or plat.calibration.host != HostCosts():
            d["oracle"] = plat.calibration.to_json()
        else:
            d.pop("oracle", None)  # α, β only: the flat all-reduce cost (and its shared link)
        tmp.write_text(json.dumps(d))
        r = run_oracle(job, procs, batch=res.get("batch", 32), platform=str(tmp), simulate=True,
                       contention=not name.endswith("no contention"), profile_at=at)
        if name == "+ host":
            full_res = r
        preds[name] = {(x.strategy, x.devices): (x.iteration_us, r.simulated.get((x.strategy, x.devices), float("nan")))
                       for x in r.predictions}
    names = list(preds)
    print(f"{'strategy':<13} {'p':>2} {'measured ms':>11}  " + "  ".join(f"{n:>22}" for n in names))
    print(f"{'':<13} {'':>2} {'':>11}  " + "  ".join(f"{'err % (sim err %)':>22}" for _ in names))
    errs: dict[str, list[float]] = {n: [] for n in names}
    serrs: dict[str, list[float]] = {n: [] for n in names}
    for r in rows:
        m, key = r["measured_us"], (r["strategy"], r["devices"])
        cells = []
        for n in names:
            it, sim = preds[n][key]
            e, se = 100 * (it - m) / m, 100 * (sim - m) / m
            errs[n].append(abs(e))
            if se == se:
                serrs[n].append(abs(se))
            cells.append(f"{e:+9.1f} ({se:+7.1f})")
        print(f"{r['strategy']:<13} {r['devices']:>2} {m / 1e3:11.2f}  " + "  ".join(f"{c:>22}" for c in cells))
    print(f"{'mean |error|':<28}" + "  ".join(f"{statistics.mean(errs[n]):9.1f} ({statistics.mean(serrs[n]):7.1f})".rjust(22)
                                            for n in names))
    # the full calibration's breakdown, as run.py prints it
    print(f"\nfull calibration ({args.platform}), with contention: breakdown (ms)")
    print(f"{'strategy':<13} {'p':>2} {'measured ms':>11} {'runs ±%':>7} {'oracle ms':>9} {'err %':>6} {'sim ms':>7} "
          f"{'err %':>6}  {'compute':>7} {'host':>5}  communication by phase (ms)")
    for r in rows:
        x = next(q for q in full_res.predictions if q.strategy == r["strategy"] and q.devices == r["devices"])
        sim, m = full_res.simulated.get((x.strategy, x.devices), float("nan")), r["measured_us"]
        comm = " ".join(f"{k} {v / 1e3:.2f}" for k, v in x.communication_us.items() if v)
        print(f"{r['strategy']:<13} {r['devices']:>2} {m / 1e3:11.2f} {r['spread_pct']:7.1f} {x.iteration_us / 1e3:9.2f} "
              f"{100 * (x.iteration_us - m) / m:+6.1f} {sim / 1e3:7.2f} {100 * (sim - m) / m:+6.1f}  "
              f"{x.compute_us / 1e3:7.2f} {sum(x.host_us.values()) / 1e3:5.2f}  {comm}")


if __name__ == "__main__":
    main()
