"""CPU time per step of the MXNet mlp with operator bulking on/off and mx.profiler off/on.

What dpro's MXNet window changes (dpro/profiler/mxnet/backend.py: bulking off, the
profiler on with the settings of the window), measured as the process's CPU time per step
(all threads; a count of work, so it runs at ``nice 19`` outside benchmarks/measure.sh),
one process, ``kvstore='local'`` (no parameter server), the four settings interleaved.

    nice -n 19 .venv-mx/bin/python benchmarks/mx_window_cpu.py --rounds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per setting and round (after 5 untimed)")
    ap.add_argument("--model", default="mlp")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    sys.path.insert(0, str(REPO / "examples" / "mxnet"))
    import mxnet as mx
    import train_ps
    from mxnet import autograd, gluon

    net, shape = train_ps.build(a.model)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore="local")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = train_ps.make_batch(a.model, 32, shape)

    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(32)
        mx.nd.waitall()

    with tempfile.TemporaryDirectory(prefix="dpro-mxcpu-") as tmp:
        def run(bulk: bool, prof: bool) -> float:
            net.hybridize(True, **({} if bulk else {"forward_bulk_size": 0, "backward_bulk_size": 0}))
            if prof:  # as the recorder's window sets it
                mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, profile_memory=True,
                                       profile_api=False, aggregate_stats=False, filename=f"{tmp}/profile.json")
                mx.profiler.set_state("run")
            cpu = []
            for i in range(5 + a.steps):
                c0 = time.process_time()
                step()
                if i >= 5:
                    cpu.append((time.process_time() - c0) * 1e6)
            if prof:
                mx.profiler.set_state("stop")
            return statistics.median(cpu)

        settings = [(True, False), (False, False), (True, True), (False, True)]
        res: dict[tuple[bool, bool], list[float]] = {s: [] for s in settings}
        for _ in range(a.rounds):
            for s in settings:
                res[s].append(run(*s))
    print(f"# {a.model}, 1 process, kvstore local: CPU µs per step (median of {a.steps} steps per round)")
    for (bulk, prof), v in res.items():
        print(f"{'bulked' if bulk else 'unbulked':<9} profiler {'on ' if prof else 'off'}  median {statistics.median(v):8.0f}"
              f"   rounds {' '.join(f'{x:.0f}' for x in v)}", flush=True)


if __name__ == "__main__":
    main()
