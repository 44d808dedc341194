"""What `dpro replay PATH --json` costs once dpro is imported: the wall time of the whole
command in-process (open, align, steps, op statistics, build, simulate, memory, and the
prediction without the recorder's overhead), and how often each pipeline stage runs.

The stages are counted by wrapping them; with the prepared job (dpro.job) the clocks are
aligned once and each node's op statistics computed once, however many replays follow.

    python benchmarks/replay_pipeline.py TRACE [--repeat 7]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from pathlib import Path

#: (stage, the modules whose name for it is wrapped: where it is defined and where it is bound)
STAGES = [("align", ["dpro.alignment.align", "dpro.alignment"]),
          ("node_stats", ["dpro.graph.stats", "dpro.graph.global_dfg"]),
          ("typical_steps", ["dpro.graph.stats", "dpro.replayer.replay"]),
          ("build_global_dfg", ["dpro.graph.global_dfg", "dpro.replayer.replay"]),
          ("simulate", ["dpro.replayer.engine", "dpro.replayer.replay"])]


def _run(trace: Path) -> float:
    from click.testing import CliRunner

    from dpro.cli import cli

    t0 = time.perf_counter()
    res = CliRunner().invoke(cli, ["replay", str(trace), "--json"], catch_exceptions=False)
    dt = time.perf_counter() - t0
    if res.exit_code != 0:
        raise SystemExit(res.stderr)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    _run(a.trace)  # imports what the command imports lazily
    times = [_run(a.trace) for _ in range(a.repeat)]
    counts = {}
    for fn_name, mods in STAGES:
        fn = getattr(importlib.import_module(mods[0]), fn_name)
        counts[fn_name] = [0]

        def counted(*args, _fn=fn, _c=counts[fn_name], **kw):
            _c[0] += 1
            return _fn(*args, **kw)

        for mod_name in mods:
            setattr(importlib.import_module(mod_name), fn_name, counted)
    _run(a.trace)
    print(f"{a.trace}: dpro replay --json {statistics.median(times) * 1e3:.1f} ms (median of {a.repeat}, "
          f"best {min(times) * 1e3:.1f} ms)")
    print("  one run calls: " + ", ".join(f"{k} x{v[0]}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
