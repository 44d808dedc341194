"""Run a training script with this rank bound to one core: ``python pinned.py SCRIPT ARGS...``.

The core is ``rank % cores`` (the cores this process may use), the rank read from the
launcher's environment (``RANK``: torchrun and the namespace launchers; ``HOROVOD_RANK``:
horovodrun; ``PINNED_INDEX``: the workers of examples/mxnet/launch_local.py). Without a rank it runs unpinned.
Used by benchmarks/jobenv.py (``JobSettings.pin``).
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: pinned.py SCRIPT [ARGS...]")
    rank = next((os.environ[k] for k in ("RANK", "HOROVOD_RANK", "PINNED_INDEX")
                 if os.environ.get(k, "").isdigit()), None)
    cores = sorted(os.sched_getaffinity(0))
    if rank is not None and len(cores) > 1:
        os.sched_setaffinity(0, {cores[int(rank) % len(cores)]})
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
