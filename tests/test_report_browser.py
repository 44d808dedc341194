"""`dpro report` opened in a real headless browser: Debian's chromium (`make browser`
installs it), driven over the DevTools protocol by playwright.

For the bundled real example and a real recording (dpro's recorder, 2-rank DDP; with
--optimize), each test writes the report with the real CLI, opens it, takes a screenshot
and checks: no console errors and no network requests; one bar per worker and non-zero
part and one Gantt lane per device of the job; the critical-path ops in the page equal
`dpro replay --json`'s; the hover names the op under the pointer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"
RECORDED = REPO / "tests" / "data" / "golden" / "recordings" / "ddp_mlp" / "raw"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

if not Path(CHROMIUM).exists() or not shutil.which("chromium"):
    if os.environ.get("CI"):
        raise RuntimeError("chromium is missing: `make browser` installs it (apt-get install chromium)")
    pytest.skip("chromium not installed (`make browser` installs it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def _dpro(*args: object) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "dpro.cli", *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "ddp"
    _dpro("collect", RECORDED, "-o", out)
    return out


def _open(browser, html: Path, shot: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    console, requests = [], []
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(html.as_uri())
    page.wait_for_function("window.__dproReady === true", timeout=60_000)
    page.screenshot(path=str(shot), full_page=True)
    return page, console, requests


def _expected_bars(trace: Path) -> int:
    """Workers × non-zero stacked parts, computed from the job without the page."""
    import dpro
    from dpro.replayer.breakdown import worker_breakdown
    from dpro.report.html.charts import STACKED_PARTS

    job = dpro.open(trace)
    r = job.replay()
    g, s = r.graph, r.schedule
    workers = [i for i, o in enumerate(g.owners) if job.trace.nodes[o].info.role == "worker"]
    return sum(1 for o in workers for k, v in worker_breakdown(g, s, o, s.makespan).items()
               if k in STACKED_PARTS and v > 0)


def _check(browser, trace: Path, tmp_path: Path, *extra: str) -> dict:
    html = tmp_path / "report.html"
    _dpro("report", trace, "-o", html, *extra)
    replay = orjson.loads(_dpro("replay", trace, "--json"))
    page, console, requests = _open(browser, html, tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 10_000
    errors = [c for c in console if c[0] in ("error", "pageerror")]
    assert errors == []
    assert requests == [html.as_uri()], "the page must not fetch anything"
    # bars: one per worker and non-zero part
    assert page.locator("#chart-breakdown g.mark-rect path").count() == _expected_bars(trace)
    # lanes: one per device of the replayed job
    assert page.locator(".lane-label").count() == replay["devices"]
    info = page.evaluate("window.__dpro")
    assert info["lanes"] == replay["devices"]
    # the critical path: in the table (execution order) and drawn in the Gantt
    names = [p["name"] for p in replay["critical_path"]]
    assert page.locator("#critical-path .cp-name").all_text_contents() == names
    assert sorted(info["criticalOps"]) == sorted(names)
    # hover over the longest critical-path op names it
    cp = max(replay["critical_path"], key=lambda p: p["dur_us"])
    lanes = page.locator(".lane-label").all_text_contents()
    box = page.locator("#gantt-canvas").bounding_box()
    x = box["x"] + (cp["start_us"] + cp["dur_us"] / 2) / replay["predicted_iteration_us"] * info["width"]
    y = box["y"] + (lanes.index(cp["device"]) + 0.5) * info["laneHeight"]
    page.mouse.move(x, y)
    tip = page.locator("#gantt-tip")
    assert tip.is_visible()
    assert cp["name"] in tip.inner_text() and "on the critical path" in tip.inner_text()
    assert page.locator("#timeline-link").get_attribute("href") == "report.timeline.json"
    assert (tmp_path / "report.timeline.json").is_file()
    return {"charts": info["charts"], "page": page}


def test_bundled_example_in_chromium(browser, tmp_path: Path) -> None:
    out = _check(browser, BUNDLED, tmp_path)
    assert out["charts"] == ["breakdown", "exposed"]
    out["page"].close()


def test_real_recording_with_optimize_in_chromium(browser, recorded: Path, tmp_path: Path) -> None:
    out = _check(browser, recorded, tmp_path, "--optimize", "--budget", "3")
    page = out["page"]
    # a recording with allocations: the memory curve; DDP: the bucket_cap_mb curve
    assert out["charts"] == ["breakdown", "exposed", "memory", "optimize", "bucket_sweep"]
    assert page.locator("#chart-bucket_sweep g.mark-symbol path").count() >= 10
    assert page.locator("#memory-peaks td").first.inner_text().startswith("worker")
    page.close()


def test_aggregated_gantt_in_chromium(browser, tmp_path: Path) -> None:
    """A job above the Gantt's op limit (here forced to 40): the page says it is aggregated,
    every critical-path op is still drawn, the hover of a merged box counts its ops."""
    import dpro
    from dpro.report.html.model import build_report
    from dpro.report.html.page import render_page

    job = dpro.open(BUNDLED)
    r = job.replay()
    html = tmp_path / "agg.html"
    html.write_text(render_page(build_report(job, max_ops=40)), encoding="utf-8")
    page, console, requests = _open(browser, html, tmp_path / "agg.png")
    assert [c for c in console if c[0] in ("error", "pageerror")] == [] and requests == [html.as_uri()]
    assert "Aggregated" in page.locator("#aggregated").inner_text()
    info = page.evaluate("window.__dpro")
    assert info["lanes"] == len(r.graph.devices) and info["drawnOps"] < r.graph.n
    assert sorted(info["criticalOps"]) == sorted(p.name for p in r.critical_path)
    # hover a merged box: the longest non-critical op sits in one
    g, s = r.graph, r.schedule
    on_path = {p.name for p in r.critical_path}
    i = max((k for k in range(g.n) if g.names[k] not in on_path), key=lambda k: s.end[k] - s.start[k])
    box = page.locator("#gantt-canvas").bounding_box()
    page.mouse.move(box["x"] + (s.start[i] + (s.end[i] - s.start[i]) / 2) / s.makespan * info["width"],
                    box["y"] + (int(g.device[i]) + 0.5) * info["laneHeight"])
    assert "ops merged" in page.locator("#gantt-tip").inner_text()
    page.close()
