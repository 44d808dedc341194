"""``dpro report --png DIR``: the page's charts as PNG files (vl-convert renders the same
Vega-Lite specs without a browser; the Gantt from :func:`~dpro.report.html.charts.gantt_spec`)."""

from __future__ import annotations

from pathlib import Path

from dpro.report.html.charts import chart_specs, gantt_spec
from dpro.report.html.model import ReportData


def write_pngs(report: ReportData, out_dir: Path) -> list[Path]:
    """Write ``<chart>.png`` for each chart of the report into ``out_dir``; returns the files."""
    import vl_convert

    out_dir.mkdir(parents=True, exist_ok=True)
    d = report.to_json()
    specs = {**chart_specs(d), "gantt": gantt_spec(d["gantt"])}
    written = []
    for name, spec in specs.items():
        p = out_dir / f"{name}.png"
        p.write_bytes(vl_convert.vegalite_to_png(spec, scale=1.5))
        written.append(p)
    return written
