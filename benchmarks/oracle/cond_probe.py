"""Which condition makes the calibration's small calls dear under the cap (#29, session 28)?

    python benchmarks/oracle/cond_probe.py --out DIR [--conditions lo,ns,ns_pfifo,ns_tbf,...] [--passes 2]

Runs benchmarks/oracle/call_probe.py's ranks (2 processes, blocking send/recv pairs and halo
exchanges of 1 and 8 KiB, 8 messages per sample: back to back after 8 ms idle and a barrier,
``b2b``, the calibration's stream; the same without the idle, ``b2b0``; each call after
500 µs of compute, ``step`` / ``xstep``, a step's; a two-stage GPipe step, ``pipe`` /
``pipe2``: its cost per message beyond the compute on its path) once per condition and pass, the
conditions in a new order per pass, and prints per condition the time inside the calls:

* ``lo``: torchrun on loopback (MTU 65536, no qdisc): the loopback runs' launcher;
* ``ns``: one network namespace per rank on the bridge of benchmarks/fidelity/netns.py
  (veth, MTU 1500), no qdisc;
* ``ns_pfifo``: the same with a plain ``pfifo`` root qdisc on both ends of every veth
  (a queue, no rate);
* ``ns_tbf``: the capped runs' ``tbf`` (netns.tbf_args, ``--cap-mbit``) both ways;
* ``ns_mtu``, ``ns_tbf_mtu``: ``ns`` / ``ns_tbf`` with MTU 65535 on the veths and the bridge
  (loopback's segment size);

Every condition's namespaces are removed after its launch (and on any exit).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))
from netns import BRIDGE, NetnsCluster, host_veth, ns_name, ns_veth, run_cmd, tbf_args  # noqa: E402

PROBE = REPO / "benchmarks" / "oracle" / "call_probe.py"
LAUNCH = REPO / "benchmarks" / "oracle" / "netns_launch.py"
CONDITIONS = ("lo", "ns", "ns_pfifo", "ns_tbf", "ns_mtu", "ns_tbf_mtu")
MODES = ("b2b", "b2b0", "step", "xb2b", "xstep", "pipe", "pipe2")
MTU_BIG = 65535  # veth's largest


def _shape(n: int, cond: str, cap_mbit: float) -> None:
    """Put ``cond``'s qdisc and MTU on the ``n`` ranks' links (both ends of every veth)."""
    qdisc = tbf_args(cap_mbit) if "tbf" in cond else (["pfifo"] if "pfifo" in cond else None)
    if cond.endswith("_mtu"):
        for r in range(n):
            run_cmd(["ip", "link", "set", "dev", host_veth(r), "mtu", str(MTU_BIG)])
            run_cmd(["ip", "-n", ns_name(r), "link", "set", "dev", ns_veth(r), "mtu", str(MTU_BIG)])
        run_cmd(["ip", "link", "set", "dev", BRIDGE, "mtu", str(MTU_BIG)])
    if qdisc:
        for r in range(n):
            run_cmd(["tc", "qdisc", "add", "dev", host_veth(r), "root", *qdisc])
            run_cmd(["ip", "netns", "exec", ns_name(r), "tc", "qdisc", "add", "dev", ns_veth(r), "root", *qdisc])


def launch(cond: str, out: Path, args: argparse.Namespace) -> None:
    """One launch of call_probe.py's ranks under ``cond``; its samples to ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"}
    probe = [str(PROBE), "--out", str(out), "--sizes", "1024,8192", "--big", "0", "--calls", "8",
             "--reps", str(args.reps), "--rounds", str(args.rounds), "--modes", args.modes]
    if cond == "lo":
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                        "127.0.0.1", "--master_port", "29528", *probe], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return
    with NetnsCluster(2):
        _shape(2, cond, args.cap_mbit)
        subprocess.run([sys.executable, str(LAUNCH), "2", "29527", *probe], env=env, check=True,
                       stdout=subprocess.DEVNULL)


def table(outdir: Path) -> str:
    """Per condition, mode and size: µs per message inside the sender's calls, over every pass."""
    by: dict[tuple[str, str, int], list[float]] = {}
    for f in sorted(outdir.glob("*.json")):
        cond = f.stem.rsplit("_p", 1)[0]
        for x in json.loads(f.read_text())["rows"]:
            if x["mode"] in MODES:
                by.setdefault((cond, x["mode"], x["bytes"]), []).append(x["send_us"])
    conds = [c for c in CONDITIONS if any(k[0] == c for k in by)]
    head = f"{'mode':6} {'bytes':>5} | " + " | ".join(f"{c:>18}" for c in conds)
    lines = ["µs per message inside the sender's calls: median / mean / share of samples > 1 ms", head]
    for m in MODES:
        for s in (1024, 8192):
            cells = []
            for c in conds:
                v = by.get((c, m, s), [])
                cells.append(f"{st.median(v):5.0f} {st.mean(v):5.0f} {sum(x > 1000 for x in v) / len(v):5.0%}"
                             if v else f"{'-':>18}")
            lines.append(f"{m:6} {s:5d} | " + " | ".join(cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES), help="call_probe.py's modes")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--cap-mbit", type=float, default=200.0)
    p.add_argument("--table-only", action="store_true", help="print the table of --out, measure nothing")
    args = p.parse_args()
    if not args.table_only:
        conds = args.conditions.split(",")
        bad = [c for c in conds if c not in CONDITIONS]
        if bad:
            sys.exit(f"cond_probe: unknown condition(s) {bad}; known: {', '.join(CONDITIONS)}")
        args.out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        for k in range(args.passes):
            order = conds[:]
            rng.shuffle(order)
            for c in order:
                t0 = time.time()
                launch(c, args.out / f"{c}_p{k}.json", args)
                print(f"pass {k} {c}: {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    print(table(args.out))


if __name__ == "__main__":
    main()
