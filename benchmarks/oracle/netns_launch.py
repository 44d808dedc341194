"""Start N ranks of a torch.distributed script, each in its own network namespace of the
capped "cluster" that ``run.py --cap-mbit`` holds up (benchmarks/fidelity/netns.py):

    python benchmarks/oracle/netns_launch.py N PORT SCRIPT [ARGS...]

The environment (``DPRO_*`` under ``dpro profile``) passes through to the ranks. Exits
non-zero, after killing the others, when a rank fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))
from netns import NetnsCluster  # noqa: E402


def main() -> int:
    n, port, script, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    net = NetnsCluster(n)  # not brought up here: its namespaces 0..n-1 exist already
    procs = [subprocess.Popen(net.exec_prefix(r) + ["env", *net.env_assignments(r, port), sys.executable, script, *args])
             for r in range(n)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                return 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.exit(main())
