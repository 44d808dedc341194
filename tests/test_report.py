"""`dpro report` without a browser: the data the page draws (exposed communication per
collective, the aggregated Gantt, the scaling hook), the PNG charts, the CLI and its errors.
The page in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

import dpro
from dpro.report.html.charts import breakdown_rows, scaling_spec
from dpro.report.html.gantt import gantt_data
from dpro.report.html.model import JsonResult, build_report, scaling_points

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def job():
    return dpro.open(BUNDLED)


def test_terminal_summary_still_imports() -> None:
    from dpro.report import print_replay
    from dpro.report.terminal import print_replay as same

    assert print_replay is same


def test_exposed_shares_add_up_to_the_breakdown(job) -> None:
    """Each exposed instant is shared among the collectives running then: the shares sum to
    the breakdown's mean exposed communication, and the biggest comes first."""
    r = job.replay()
    data = build_report(job)
    assert data.exposed, "the bundled DDP job has exposed communication"
    assert sum(e["exposed_us"] for e in data.exposed) == pytest.approx(r.breakdown_us["exposed_COMM"], rel=1e-6)
    assert sum(e["share"] for e in data.exposed) == pytest.approx(1.0)
    us = [e["exposed_us"] for e in data.exposed]
    assert us == sorted(us, reverse=True)
    assert all(e["collective"].startswith("allreduce.") for e in data.exposed)


def test_bars_are_the_workers_nonzero_parts(job) -> None:
    data = build_report(job)
    rows = breakdown_rows(data.breakdown)
    assert {r["worker"] for r in rows} == {"worker0", "worker1"}
    assert all(r["part"] != "COMM" and r["us"] > 0 for r in rows)
    # the stacked parts of each worker add up to the predicted iteration
    for w in ("worker0", "worker1"):
        assert sum(r["us"] for r in rows if r["worker"] == w) == pytest.approx(
            data.summary["predicted_iteration_us"], rel=0.02)


def test_small_gantt_keeps_every_op_and_the_critical_path(job) -> None:
    r = job.replay()
    g = gantt_data(r, job.trace)
    assert not g.aggregated and len(g.start) == r.graph.n
    assert [c["name"] for c in g.critical] == [p.name for p in r.critical_path]
    assert sorted(g.names[i] for i in g.name[g.crit]) == sorted(p.name for p in r.critical_path)


def test_big_gantt_is_aggregated_and_keeps_the_critical_path(job) -> None:
    r = job.replay()
    g = gantt_data(r, job.trace, max_ops=40)
    n_crit = len(r.critical_path)
    assert g.aggregated and g.bins_per_lane >= 16
    assert len(g.start) < r.graph.n
    assert int(g.count.sum()) == r.graph.n  # every op is drawn: itself or in one merged box
    assert sorted(g.names[i] for i in g.name[g.crit]) == sorted(p.name for p in r.critical_path)
    assert int(g.crit.sum()) == n_crit
    # a merged box lies within the iteration, on its lane, no longer than its ops' time
    assert (g.start >= -1e-6).all() and (g.start + g.dur <= r.schedule.makespan + 1e-6).all()
    merged = ~g.crit
    dur = np.asarray(r.schedule.end) - np.asarray(r.schedule.start)
    for lane in set(g.lane[merged].tolist()):
        on = (np.asarray(r.graph.device) == lane)
        assert g.dur[merged & (g.lane == lane)].sum() <= dur[on].sum() + 1e-6


def test_scaling_hook_draws_any_device_curve(tmp_path: Path) -> None:
    """A what-if / oracle result only needs to_json() with {devices|workers, iteration_us} points."""
    import vl_convert

    result = JsonResult({"name": "what-if", "curves": {"ring": [{"devices": d, "iteration_us": 1e5 / d + 2e3 * d}
                                                                for d in (2, 4, 8, 16)]},
                         "measured": [{"workers": 2, "iteration_us": 6.1e4}, {"workers": 4, "iteration_us": 3.9e4}]})
    pts = scaling_points(result.to_json())
    assert {p["series"] for p in pts} == {"curves.ring", "measured"}
    assert len(pts) == 6 and {p["devices"] for p in pts} == {2, 4, 8, 16}
    png = vl_convert.vegalite_to_png(scaling_spec(pts))
    assert png.startswith(PNG)
    assert scaling_points({"x": [{"devices": 2}], "y": "z"}) == []  # no iteration_us: not a curve


def test_cli_writes_page_timeline_and_pngs(run_cli, tmp_path: Path) -> None:
    res = tmp_path / "what_if.json"
    res.write_bytes(orjson.dumps({"curve": [{"devices": 2, "iteration_us": 1e5}, {"devices": 4, "iteration_us": 6e4}]}))
    out = tmp_path / "r" / "report.html"
    rc, stdout, _ = run_cli("report", BUNDLED, "-o", out, "--png", tmp_path / "png", "--result", res, "--json")
    assert rc == 0
    info = orjson.loads(stdout)
    assert info["html"] == str(out) and info["html_bytes"] == out.stat().st_size
    assert Path(info["timeline"]) == tmp_path / "r" / "report.timeline.json"
    tl = orjson.loads(Path(info["timeline"]).read_bytes())
    assert any(e.get("ph") == "X" for e in tl["traceEvents"])
    names = {Path(p).name for p in info["pngs"]}
    assert names == {"breakdown.png", "exposed.png", "gantt.png", "scaling.png"}
    assert all(Path(p).read_bytes().startswith(PNG) for p in info["pngs"])
    page = out.read_text()
    assert 'href="report.timeline.json"' in page and 'id="chart-scaling"' in page
    assert "<script src" not in page and "<link" not in page  # everything inline


@pytest.mark.parametrize("args, needle", [
    (("report", "/nonexistent/trace"), "/nonexistent/trace"),
    (("report", str(BUNDLED), "--result", "/nonexistent/r.json"), "r.json: file not found"),
])
def test_bad_input_is_one_line(run_cli, tmp_path: Path, args, needle) -> None:
    rc, stdout, stderr = run_cli(*args, "-o", tmp_path / "r.html")
    assert rc == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_result_that_is_not_an_object_is_refused(run_cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    rc, _, stderr = run_cli("report", BUNDLED, "-o", tmp_path / "r.html", "--result", bad)
    assert rc == 2 and "bad.json: expected a JSON object" in stderr


def _page_data(page: str) -> dict:
    start = page.index('<script type="application/json" id="dpro-data">') + len(
        '<script type="application/json" id="dpro-data">')
    return orjson.loads(page[start:page.index("</script>", start)].replace("<\\/", "</"))


def test_cli_whatif_and_oracle_sections(run_cli, tmp_path: Path) -> None:
    """`--whatif` adds the scale-out curve (one series); `--oracle` one curve per feasible strategy."""
    out = tmp_path / "w.html"
    rc, _, err = run_cli("report", BUNDLED, "-o", out, "--whatif", "2,4,8")
    assert rc == 0, err
    d = _page_data(out.read_text())
    assert [p["devices"] for p in d["scaling"]] == [2, 4, 8]
    assert d["extra"]["what-if: scale-out"]["scaling"][0]["workers"] == 2
    oracle_trace = Path(__file__).resolve().parent / "data" / "oracle_cnn"
    rc, _, err = run_cli("report", oracle_trace, "-o", tmp_path / "o.html", "--oracle", "2,4")
    assert rc == 0, err
    d = _page_data((tmp_path / "o.html").read_text())
    feasible = {(s["strategy"], s["devices"]) for s in d["extra"]["oracle"]["strategies"] if s["feasible"]}
    assert {(p["series"].rsplit(": ", 1)[1], p["devices"]) for p in d["scaling"]} == feasible
    rc, _, err = run_cli("report", BUNDLED, "-o", tmp_path / "x.html", "--whatif", "0")
    assert rc == 2 and "--whatif" in err and len(err.strip().splitlines()) == 1
