"""The per-rank import and the optimizer's search: here, in a local process pool, and as Ray tasks.

Starts a local Ray cluster of ``--cpus`` CPUs (its start time is printed apart), then,
``--repeat`` rounds, interleaved: ``import_kineto(DIR)`` with the serial mapper, the local
process pool (:class:`dpro.executor.ProcessPool`) and
:class:`dpro.executor.RayMapper`; with ``--optimize``, also ``Job.optimize`` serial vs Ray.
Wall seconds, medians of the rounds, ratios to serial from the same run. The results must be
identical (the imported nodes, the search's strategies and times), else it exits 1.
A real cluster: ``--address HEAD:6379`` instead of the local one.

    python benchmarks/ray_scale.py DIR --repeat 3 --cpus 2 --optimize
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _summary(gt) -> list:  # noqa: ANN001 - GTrace
    """What must not depend on where the ranks were imported (cheap; the tests check digests)."""
    return [(name, sorted(nt.ops), [(e.op, e.step, e.ts, e.dur) for e in nt.events], sorted(nt.steps.items()),
             sorted(nt.edges)) for name, nt in sorted(gt.nodes.items())] + [gt.manifest.to_json(), gt.notes]


def _found(res) -> list:  # noqa: ANN001 - OptimizeResult
    return [(r.start, r.strategy.key(), r.iteration_us, r.evaluations) for r in res.results]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    ap.add_argument("--address", default=None, help="a running cluster's address instead of a local one")
    ap.add_argument("--optimize", action="store_true", help="also time the optimizer's search, serial vs Ray")
    ap.add_argument("--mappers", default="serial,pool,ray",
                    help="which imports to time, comma-separated (serial, pool, ray); ratios need serial")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        import ray
    except ImportError:
        print("skipped: Ray is not installed (pip install 'dpro[ray]')")
        return {}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    from dpro.executor import ProcessPool, RayMapper, serial, start_local
    from dpro.importers.kineto import import_kineto

    t0 = time.perf_counter()
    if a.address:
        ray.init(address=a.address, logging_level="WARNING", log_to_driver=False)
    else:
        start_local(num_cpus=a.cpus)
    start_s = time.perf_counter() - t0
    every = {"serial": serial, "pool": ProcessPool(), "ray": RayMapper("auto")}
    mappers = {k: every[k] for k in a.mappers.split(",")}
    times: dict[str, list[float]] = {k: [] for k in mappers}
    ref = None
    for r in range(a.repeat):
        order = list(mappers) if r % 2 == 0 else list(reversed(mappers))
        for name in order:
            t0 = time.perf_counter()
            gt = import_kineto(a.path, mapper=mappers[name], progress=False)
            times[name].append(time.perf_counter() - t0)
            s = _summary(gt)
            del gt
            if ref is None:
                ref = s
            elif s != ref:
                print(f"{a.path}: the import with {name} differs", file=sys.stderr)
                sys.exit(1)
    out = {"path": str(a.path), "ray_cpus": ray.cluster_resources().get("CPU"), "ray_start_s": round(start_s, 2),
           "import_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
           "import_runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()}}
    if a.optimize:
        from dpro.job import open_job

        job = open_job(a.path, progress=False, cache=False)
        opt: dict[str, list[float]] = {"serial": [], "ray": []}
        found = {}
        for r in range(a.repeat):
            for name in (("serial", "ray") if r % 2 == 0 else ("ray", "serial")):
                t0 = time.perf_counter()
                res = job.optimize(budget_s=600, mapper=every[name])
                opt[name].append(time.perf_counter() - t0)
                found.setdefault(name, _found(res))
        if found["serial"] != found["ray"]:
            print(f"{a.path}: the search on Ray found another result", file=sys.stderr)
            sys.exit(1)
        out["optimize_s"] = {k: round(statistics.median(v), 3) for k, v in opt.items()}
        out["optimize_evaluations"] = sum(x[3] for x in found["serial"])
    ray.shutdown()
    if a.json:
        print(json.dumps(out))
    else:
        imp = out["import_s"]
        print(f"{a.path.name}: Ray ({out['ray_cpus']:.0f} CPUs) started in {start_s:.1f} s; import medians of {a.repeat}: "
              + ", ".join(f"{k} {v:.2f} s" + (f" ({imp['serial'] / v:.2f}x serial)" if "serial" in imp else "")
                        for k, v in imp.items()))
        if a.optimize:
            o = out["optimize_s"]
            print(f"  optimize ({out['optimize_evaluations']} candidate replays): serial {o['serial']:.2f} s, "
                  f"ray {o['ray']:.2f} s ({o['serial'] / o['ray']:.2f}x)")
    return out


if __name__ == "__main__":
    main()
