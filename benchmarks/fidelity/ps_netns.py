"""Launch an MXNet parameter-server job with each server and worker in its own network namespace.

The namespaces are :mod:`netns`'s (linked through a bridge, optionally capped with tbf
both ways), so every worker <-> server transfer crosses two capped links; the scheduler
(control messages only) runs in the root namespace at the bridge's address. Processes are
started as ``examples/mxnet/launch_local.py`` starts them; servers take namespaces
0..S-1, workers S..S+W-1, each told its address and interface (``DMLC_NODE_HOST``,
``DMLC_INTERFACE``).

    python benchmarks/fidelity/ps_netns.py -n 2 -s 1 --rate-mbit 200 -- examples/mxnet/train_ps.py --model mlp
    dpro profile -o traces/ -- python benchmarks/fidelity/ps_netns.py -n 2 -s 1 --rate-mbit 200 -- \\
        examples/mxnet/train_ps.py --model mlp

Needs root. Exits with the first non-zero worker exit code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples" / "mxnet"))
from launch_local import launch  # noqa: E402
from netns import BRIDGE, BRIDGE_ADDR, NetnsCluster, ns_name, ns_veth, rank_addr  # noqa: E402


def placer(servers: int):
    """Servers in namespaces 0..S-1, workers after them, the scheduler in the root namespace."""

    def place(role: str, i: int) -> tuple[list[str], dict[str, str]]:
        if role == "scheduler":
            return [], {"DMLC_NODE_HOST": BRIDGE_ADDR, "DMLC_INTERFACE": BRIDGE}
        slot = i if role == "server" else servers + i
        return ["ip", "netns", "exec", ns_name(slot)], {"DMLC_NODE_HOST": rank_addr(slot),
                                                        "DMLC_INTERFACE": ns_veth(slot)}

    return place


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("-s", "--servers", type=int, default=1)
    ap.add_argument("--rate-mbit", type=float, default=None, help="tbf cap per direction of every process's link")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- train.py [args]")
    a = ap.parse_args()
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    if not script:
        ap.error("no training script given")
    with NetnsCluster(a.workers + a.servers, a.rate_mbit):
        return launch(script, a.workers, a.servers, timeout=a.timeout, root_uri=BRIDGE_ADDR, place=placer(a.servers))


if __name__ == "__main__":
    sys.exit(main())
