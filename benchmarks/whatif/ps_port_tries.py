"""Single tries of the PS port calibration, repeated, in several conditions (issue #28).

Behind the cap of benchmarks/whatif/ps.py (its namespaces and placement, ``threads1pin``'s
environment), each case runs ``dpro.whatif.calibrate_ps.measure_port_once`` (one try: N
asynchronous workers, S servers, the keys of a platform file written by ps.py) and prints its
efficiency against that file's link twice: with the rounds counted while every worker was in
its timed rounds (the calibration's statistic) and with each worker's rounds over its own span
(the statistic before). A case is ``NwSs:pin|nopin:COMPUTE_US:MOMENTUM``; ``--repeat`` runs
the list that many times, interleaved. Root; run it alone (``benchmarks/measure.sh``):

    benchmarks/measure.sh .venv-mx/bin/python benchmarks/whatif/ps_port_tries.py \\
        --platform OUT/platform_ps_cap1000.json --cases 4w1s:nopin:0:0,4w1s:pin:11150:0.9 --repeat 4 --json out.json

The try's samples (every worker's round ends) go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))
import jobenv  # noqa: E402
from scriptload import load_script  # noqa: E402


def parse_case(text: str) -> tuple[int, int, bool, float, float]:
    """``4w1s:pin:11150:0.9`` -> (workers, servers, pinned, compute µs, momentum)."""
    try:
        ws, pin, comp, mom = text.split(":")
        w, s = ws.rstrip("s").split("w")
        if pin not in ("pin", "nopin"):
            raise ValueError(pin)
        return int(w), int(s), pin == "pin", float(comp), float(mom)
    except ValueError:
        raise SystemExit(f"--cases: {text!r} is not NwSs:pin|nopin:COMPUTE_US:MOMENTUM") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--platform", type=Path, required=True, help="a platform file of ps.py --cap-mbit (keys, link)")
    ap.add_argument("--cases", default="4w1s:nopin:0:0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cap-mbit", type=float, default=1000.0)
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    o = ap.parse_args()
    from dpro.whatif.calibrate_ps import measure_port_once, port_efficiency

    cases = [parse_case(c) for c in o.cases.split(",")]
    try:
        plat = json.loads(o.platform.read_text())["ps"]
        sizes, alpha, beta = plat["port_sizes"], plat["alpha_us"], plat["beta_us_per_byte"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{o.platform}: not a platform file of ps.py --cap-mbit with port sizes ({e})") from None
    pj = load_script("ps_jobs", REPO / "benchmarks" / "fidelity" / "ps_jobs.py", add_dir=True)
    nn = load_script("netns", REPO / "benchmarks" / "fidelity" / "netns.py", add_dir=True)
    placer = load_script("ps_netns", pj.PS_NETNS, add_dir=True).placer
    env = {**os.environ, "PYTHONPATH": str(REPO), **jobenv.default_for("mx").env()}
    rows = []
    for _ in range(o.repeat):
        for w, s, pin, comp, mom in cases:
            with nn.NetnsCluster(w + s, o.cap_mbit):
                r = measure_port_once(str(pj.MX / "python"), w, s, place=placer(s), root_uri=nn.BRIDGE_ADDR, env=env,
                                      sizes=sizes, rounds=o.rounds, compute_us=comp, pin=pin, momentum=mom)
            r["eff"] = port_efficiency(r, alpha, beta)
            r["eff_own"] = port_efficiency({**r, "round_us": r["own_span_round_us"]}, alpha, beta)
            rows.append(r)
            print(f"{time.strftime('%H:%M:%S', time.gmtime())} {w}w{s}s pin={pin} compute={comp / 1e3:.1f}ms "
                  f"mom={mom}: common-window round {r['round_us'] / 1e3:.1f} ms eff {r['eff']:.3f} (window "
                  f"{r['window_s']:.1f} s); own-span {r['own_span_round_us'] / 1e3:.1f} ms eff {r['eff_own']:.3f}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    if o.json:
        o.json.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
