"""Time to open a `dpro report` of a 64-rank, >= 1M-op job in headless Chromium (target < 5 s).

The job is :mod:`replay_speed`'s: 64 workers of a ResNet-50-shaped model, each gradient
tensor's ring AllReduce expanded on the 64 links (1.36 M ops, 192 devices). It is
simulated, then the report is built from the replay (:func:`report_of_replay`: the Gantt
aggregated, as the page says) and written; Chromium (Debian's, driven by playwright) opens
the file ``--repeat`` times, each in a fresh page, and the time from navigation to
``window.__dproReady`` (every chart and the Gantt drawn) is measured.

    python benchmarks/report_open.py                 # 64 workers, 3 opens
    python benchmarks/report_open.py --workers 8 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_speed import build  # noqa: E402

from dpro.graph.global_dfg import BuildInfo  # noqa: E402
from dpro.replayer.breakdown import breakdown  # noqa: E402
from dpro.replayer.critical_path import critical_path  # noqa: E402
from dpro.replayer.engine import simulate  # noqa: E402
from dpro.replayer.replay import ReplayResult  # noqa: E402
from dpro.report.html.model import report_of_replay  # noqa: E402
from dpro.report.html.page import render_page  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def open_times(html: Path, repeat: int, chromium: str = CHROMIUM) -> tuple[list[float], dict]:
    """Seconds from navigation to ``window.__dproReady`` for each of ``repeat`` fresh pages."""
    from playwright.sync_api import sync_playwright

    times, info = [], {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(repeat):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m, e=errors: e.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda x, e=errors: e.append(str(x)))
            t0 = time.perf_counter()
            page.goto(html.as_uri())
            page.wait_for_function("window.__dproReady === true", timeout=120_000, polling=20)
            times.append(time.perf_counter() - t0)
            info = page.evaluate("({lanes: window.__dpro.lanes, drawn: window.__dpro.drawnOps, "
                                 "critical: window.__dpro.criticalOps.length})")
            info["console_errors"] = errors
            page.close()
        browser.close()
    return times, info


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chromium", default=CHROMIUM)
    ap.add_argument("--keep", type=Path, default=None, help="write the report here instead of a temporary file")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    g, ncoll = build(a.workers)
    sched = simulate(g)
    replay_s = time.perf_counter() - t0
    r = ReplayResult(predicted_iteration_us=sched.makespan, measured_iteration_us=None,
                     breakdown_us=breakdown(g, sched), critical_path=critical_path(g, sched), graph=g, schedule=sched,
                     build=BuildInfo(link_cost=g.meta.get("link_cost"), expanded=ncoll))
    t0 = time.perf_counter()
    data = report_of_replay(r, title=f"synthetic {a.workers}-rank ResNet-50-shaped job (benchmarks/report_open.py)",
                            info={"framework": "synthetic", "library": "ring", "scheme": "allreduce",
                                  "world_size": a.workers, "workers": a.workers})
    text = render_page(data)
    report_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="dpro-report-") as tmp:
        html = (a.keep or Path(tmp) / "report.html").resolve()
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(text, encoding="utf-8")
        times, info = open_times(html, a.repeat, a.chromium)
    out = {
        "workers": a.workers, "ops": g.n, "devices": len(g.devices), "gantt_boxes": int(len(data.gantt.start)),
        "aggregated": data.gantt.aggregated, "critical_path_ops": len(r.critical_path),
        "html_bytes": len(text.encode()), "build_and_replay_s": replay_s, "report_build_s": report_s,
        "open_s": times, "open_median_s": statistics.median(times), "page": info,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"job: {g.n:,} ops on {len(g.devices)} devices ({a.workers} workers); built + replayed in {replay_s:.1f} s")
        print(f"report: {out['html_bytes'] / 1e6:.2f} MB, {out['gantt_boxes']:,} Gantt boxes "
              f"({'aggregated' if out['aggregated'] else 'every op'}), {out['critical_path_ops']:,} critical-path ops; "
              f"built in {report_s:.1f} s")
        print(f"open in chromium (to window.__dproReady): median {out['open_median_s']:.2f} s over {a.repeat} "
              f"({', '.join(f'{t:.2f}' for t in times)}); console errors: {len(info['console_errors'])}; "
              f"load average {' '.join(out['loadavg'])}")
    return out


if __name__ == "__main__":
    main()
