"""How stable is the link fit? Fit α, β of gloo all-reduces (gloo_link.py) several times
back to back, boosted like run.py's measured jobs, and print each fit with its samples.

    python benchmarks/oracle/link_noise.py [--procs 2,2,4,2,4] [--out /tmp/dpro-oracle-link]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,2,4,2,4", help="ranks of each fit, in order")
    p.add_argument("--out", type=Path, default=Path("/tmp/dpro-oracle-link"))
    args = p.parse_args()
    sys.path[:0] = [str(HERE), str(HERE.parent / "whatif"), str(HERE.parents[1])]
    import run as bench
    from boost import boosted

    from dpro.graph.comm_model import lad_link_cost, ring_steps

    args.out.mkdir(parents=True, exist_ok=True)
    with boosted() as on:
        print(f"# measured jobs boosted: {'yes' if on else 'no'}")
        for k, n in enumerate(int(x) for x in args.procs.split(",")):
            f = args.out / f"samples_{k}_{n}.json"
            bench.torchrun(n, HERE / "gloo_link.py", "--out", str(f))
            rows = json.loads(f.read_text())["samples"]
            A = np.array([[ring_steps(n), ring_steps(n) * b / n] for b, _ in rows], dtype=float)
            c = lad_link_cost(A, np.array([t for _, t in rows], dtype=float))
            print(f"{n} ranks: α {c.alpha:.0f} µs, β {c.beta * 1e3:.3f} ns/B; median µs per size "
                  f"{[b for b, _ in rows]}: {[round(t) for _, t in rows]}", flush=True)


if __name__ == "__main__":
    main()
