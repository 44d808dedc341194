"""Launch a Horovod (gloo) job with each rank in its own network namespace.

``horovodrun`` starts remote ranks over ssh; here the "hosts" are the namespaces of
:mod:`netns` (one rank each, linked through a bridge, optionally capped with tbf), so this
launcher does what ``horovodrun --gloo`` does for them: it runs Horovod's rendezvous
server in the root namespace (reachable at the bridge's address) and starts every rank
with ``ip netns exec`` and the environment Horovod's gloo launcher sets.

    python benchmarks/fidelity/hvd_netns.py --np 2 --rate-mbit 200 -- python train.py ...
    python benchmarks/fidelity/hvd_netns.py --np 2 --existing -- python train.py ...   # namespaces already up
    dpro profile -o traces/ -- python benchmarks/fidelity/hvd_netns.py --np 2 --rate-mbit 200 -- \\
        python examples/pytorch/hvd_recorder.py --model mlp

Exits with the first non-zero exit code of the ranks (all are killed when one fails).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns import BRIDGE_ADDR, NetnsCluster, ns_name, ns_veth  # noqa: E402


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    """What ``horovodrun --gloo`` sets for a rank alone on its host."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": BRIDGE_ADDR, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": ns_veth(rank),
        "HOROVOD_HOSTNAME": f"host{rank}", "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": str(size), "OMP_NUM_THREADS": "1",
    }


def run_ranks(size: int, cmd: list[str], timeout_s: float = 1800.0) -> int:
    """Start the rendezvous server and the ranks; wait for all. Returns the job's exit code."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(get_host_assignments([HostInfo(f"host{r}", 1) for r in range(size)], size))
    procs = []
    for r in range(size):
        env = {**os.environ, **rank_env(r, size, port)}
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns_name(r), *cmd], env=env))
    rc, deadline = 0, time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                rc = failed[0] if failed else 124
                break
            time.sleep(0.1)
        else:
            rc = next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.stop()
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, required=True, help="ranks (one namespace each)")
    ap.add_argument("--rate-mbit", type=float, default=None, help="tbf cap per direction of every rank's link")
    ap.add_argument("--existing", action="store_true", help="the namespaces are already up (e.g. the harness's)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the rank's command")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the rank's command after --")
    if args.existing:
        return run_ranks(args.np, cmd, args.timeout)
    with NetnsCluster(args.np, args.rate_mbit):
        return run_ranks(args.np, cmd, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
