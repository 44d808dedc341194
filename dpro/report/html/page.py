"""The report as one self-contained HTML page: the data and the Vega-Lite specs as JSON,
the Vega bundle (from vl-convert), the page's script and style, all inline."""

from __future__ import annotations

import html
from importlib import resources

import orjson

from dpro.report.html.charts import chart_specs
from dpro.report.html.model import ReportData

#: critical-path ops listed in the page's table (the Gantt draws them all)
CRITICAL_ROWS = 2000


def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script (vl-convert ships it; ~0.9 MB)."""
    import vl_convert

    return vl_convert.javascript_bundle()


def _asset(name: str) -> str:
    return resources.files("dpro.report.html").joinpath("assets", name).read_text(encoding="utf-8")


def _script(text: str) -> str:
    return text.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _json_script(obj, id_: str) -> str:
    text = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return f'<script type="application/json" id="{id_}">{_script(text)}</script>'


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:,.2f} ms"


def _row(k: str, v: str) -> str:
    return f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>"


def _summary(d: dict) -> str:
    s = d["summary"]
    e = s["error_pct"]
    ov = s["profiling_overhead"]
    rows = [
        _row("predicted iteration", f'<span class="big" id="predicted">{_ms(s["predicted_iteration_us"])}</span>'),
        _row("measured iteration", _ms(s["measured_iteration_us"])),
        _row("error", "n/a" if e is None else f"{e:+.1f} %"),
        _row("profiling overhead", "not measured" if ov is None else
             f"{ov['overhead_pct']:+.1f} % ({_ms(ov['unprofiled_step_us'])} per step outside the window, "
             f"{_ms(ov['profiled_step_us'])} in it)"),
    ]
    if s["predicted_unprofiled_iteration_us"] is not None:
        rows.append(_row("predicted without the profiling overhead", _ms(s["predicted_unprofiled_iteration_us"])))
    rows += [
        _row("steps used", html.escape(", ".join(map(str, s["steps"])) or "all")),
        _row("job", html.escape(f"{s['framework']}/{s['library']} {s['scheme']}, {s['workers']} workers "
                                f"(world size {s['world_size']})")),
        _row("graph", f"{s['ops']:,} ops on {s['devices']} devices; {s['collectives_expanded']} collectives on the "
                      f"ring model, {s['collectives_measured']} with measured times"),
    ]
    notes = "".join(f'<li class="note">{html.escape(n)}</li>' for n in s["notes"])
    return f'<table id="summary">{"".join(rows)}</table>' + (f"<ul>{notes}</ul>" if notes else "")


def _gantt(d: dict) -> str:
    g = d["gantt"]
    agg = ""
    if g["aggregated"]:
        agg = (f'<p class="agg" id="aggregated">Aggregated: {g["total_ops"]:,} ops are too many to draw one by one. '
               f'Every critical-path op is drawn; the others are merged per lane into {g["bins_per_lane"]} time bins '
               f'({g["shown"]:,} boxes), each drawn in the category that fills most of it; its hover gives the number '
               f'of ops merged.</p>')
    legend = "".join(f'<span><i style="background:{c}"></i>{k}</span>' for k, c in
                     {"FW": "#4e79a7", "BW": "#f28e2b", "UPDATE": "#59a14f", "IO": "#b07aa1", "COMM": "#e15759",
                      "OTHER": "#9c9c9c"}.items())
    legend += ('<span><i style="background:#fff;border:1px solid #000"></i><i style="background:#c00"></i>critical path '
               '(outlined; red where narrow; joined by a red line)</span>')
    return (f'{agg}<p class="legend">{legend}</p><p class="muted">{len(g["lanes"])} lanes (one per device), '
            f'<span id="gantt-range"></span>. Wheel: zoom; drag: pan; double-click: reset; hover: the op.</p>'
            '<div id="gantt-wrap"><div id="gantt-labels"></div><div id="gantt-canvas-box"><canvas id="gantt-canvas">'
            '</canvas></div></div><div id="gantt-tip"></div>')


def _critical(d: dict) -> str:
    cp = d["gantt"]["critical"]
    rows = "".join(
        f'<tr class="cp-op"><td class="num">{k}</td><td class="cp-name">{html.escape(p["name"])}</td><td>{p["cat"]}</td>'
        f'<td>{html.escape(p["device"])}</td><td class="num">{_ms(p["start_us"])}</td><td class="num">{_ms(p["dur_us"])}</td></tr>'
        for k, p in enumerate(cp[:CRITICAL_ROWS]))
    more = f"<p>the first {CRITICAL_ROWS} of {len(cp):,} shown</p>" if len(cp) > CRITICAL_ROWS else ""
    longest = sorted(cp, key=lambda p: -p["dur_us"])[:10]
    top = "".join(f"<li>{html.escape(p['name'])}: {_ms(p['dur_us'])} ({p['cat']}, {html.escape(p['device'])})</li>"
                  for p in longest)
    return (f"<p>{len(cp):,} ops; the longest:</p><ol>{top}</ol><details><summary>every critical-path op, in "
            f'execution order</summary>{more}<table id="critical-path"><tr><th>#</th><th>op</th><th>cat</th><th>device</th>'
            f'<th class="num">start</th><th class="num">duration</th></tr>{rows}</table></details>')


def _memory(d: dict) -> str:
    rows = []
    for m in d["memory"]:
        if m["source"] == "allocations":
            rows.append(f"<tr><td>{html.escape(m['worker'])}</td><td class='num'>{m['peak_bytes'] / 2**20:,.1f} MiB</td>"
                        f"<td class='num'>{_ms(m['peak_us'])}</td><td>{html.escape(m['peak_op'] or '')}</td></tr>")
        else:
            rows.append(f"<tr><td>{html.escape(m['worker'])}</td><td colspan=3>parameters + gradients "
                        f"{m['static_bytes'] / 2**20:,.1f} MiB (allocations not recorded: no memory curve)</td></tr>")
    return ('<div id="chart-memory"></div><table id="memory-peaks"><tr><th>worker</th><th class="num">predicted peak</th>'
            f'<th class="num">at</th><th>peak op</th></tr>{"".join(rows)}</table>')


def _optimize(d: dict) -> str:
    o = d["optimize"]
    if o is None:
        return '<p class="muted">Not run: <code>dpro report PATH --optimize</code> adds it.</p>'
    speed = "" if o["speedup"] is None else f" ({o['speedup']:.2f}× the job as profiled)"
    steps = "".join(f"<li><b>{html.escape(str(s.get('pass')))}</b>: {html.escape(str(s.get('reason')))} "
                    f"({_ms(s.get('before_us'))} → {_ms(s.get('after_us'))})</li>" for s in o["best"]["steps"])
    real = "".join(f"<tr><td>{html.escape(r['library'])}</td><td><code>{html.escape(orjson.dumps(r['settings']).decode()[:400])}"
                   f"</code></td><td class='num'>{_ms(r['iteration_us'])}</td></tr>" for r in o["realized"])
    notes = "".join(f'<li class="note">{html.escape(n)}</li>' for n in o["notes"])
    sweep = ""
    if d.get("bucket_sweep"):
        best = min(d["bucket_sweep"], key=lambda p: p["iteration_us"])
        sweep = (f'<h3>DDP bucket size</h3><div id="chart-bucket_sweep"></div><p>Fastest predicted: bucket_cap_mb = '
                 f'{best["bucket_cap_mb"]:.3g} ({best["buckets"]} buckets, {_ms(best["iteration_us"])}).</p>')
    return (f'<p>Best strategy: <span class="big">{_ms(o["best_us"])}</span>{speed}, starting from '
            f'{html.escape(str(o["best"]["start"]))}. Its changes:</p><ol id="best-steps">{steps or "<li>none</li>"}</ol>'
            f'<div id="chart-optimize"></div><table><tr><th>library</th><th>settings</th><th class="num">predicted</th></tr>'
            f'{real}</table>{sweep}' + (f"<ul>{notes}</ul>" if notes else ""))


def _extra(d: dict) -> str:
    out = ""
    if d["scaling"]:
        out += '<h2>Scaling</h2><div id="chart-scaling"></div>'
    for k, v in d["extra"].items():
        text = orjson.dumps(v, option=orjson.OPT_INDENT_2).decode()
        out += f"<h2>{html.escape(k)}</h2><details><summary>result (JSON)</summary><pre>{html.escape(text[:200_000])}</pre></details>"
    return out


def render_page(report: ReportData) -> str:
    """The whole page as one string."""
    d = report.to_json()
    specs = chart_specs(d)
    tl = d["timeline_file"]
    link = (f'<p>The simulated iteration as a Perfetto / Chrome trace: <a id="timeline-link" href="{html.escape(tl)}">'
            f'{html.escape(tl)}</a> (written beside this page; open it with ui.perfetto.dev → "Open trace file").</p>'
            if tl else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dpro report: {html.escape(d['title'])}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:">
<style>{_asset('report.css')}</style></head><body>
<h1>dpro report: {html.escape(d['title'])}</h1>
<p class="muted">All times in ms and sizes in MiB on this page; the data inside it are in µs and bytes.</p>
<h2>Summary</h2>{_summary(d)}{link}
<h2>Breakdown per worker</h2><div id="chart-breakdown"></div>
<h2>Simulated iteration</h2>{_gantt(d)}
<h2>Critical path</h2>{_critical(d)}
<h2>Exposed communication</h2>{'<div id="chart-exposed"></div>' if d['exposed'] else '<p>No communication is exposed.</p>'}
<h2>Memory</h2>{_memory(d)}
<h2>Optimization</h2>{_optimize(d)}
{_extra(d)}
{_json_script(d, 'dpro-data')}
{_json_script(specs, 'dpro-specs')}
<script>{_script(vega_bundle())}</script>
<script>{_script(_asset('report.js'))}</script>
</body></html>
"""
