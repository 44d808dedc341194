"""``dpro report``: one self-contained HTML page of a job (docs/report.md).

    job = dpro.open("traces/")
    write_report(job, Path("report.html"), optimized=job.optimize(budget_s=20))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dpro.progress import Tick, _noop
from dpro.report.html.model import HasJson, ReportData, build_report

if TYPE_CHECKING:
    from dpro.job import Job
    from dpro.optimizer.optimize import OptimizeResult

__all__ = ["ReportData", "WrittenReport", "build_report", "timeline_path", "write_report"]


@dataclass
class WrittenReport:
    """What :func:`write_report` wrote (sizes in bytes)."""

    html: Path
    html_bytes: int
    timeline: Path | None
    pngs: list[Path] = field(default_factory=list)
    aggregated: bool = False

    def to_json(self) -> dict:
        return {"html": str(self.html), "html_bytes": self.html_bytes,
                "timeline": None if self.timeline is None else str(self.timeline),
                "pngs": [str(p) for p in self.pngs], "aggregated": self.aggregated}


def timeline_path(html: Path) -> Path:
    """The Perfetto timeline written beside ``html``: ``report.html`` -> ``report.timeline.json``."""
    return html.with_name(html.stem + ".timeline.json")


def write_report(job: Job, out: Path, *, optimized: OptimizeResult | None = None,
                 extra: dict[str, HasJson] | None = None, png_dir: Path | None = None,
                 timeline: bool = True, tick: Tick = _noop) -> WrittenReport:
    """Write the report of ``job`` to ``out`` (and the Perfetto timeline beside it, and the
    charts as PNG into ``png_dir`` where given); ``tick(stage)`` reports progress."""
    from dpro.replayer.timeline import write_timeline
    from dpro.report.html.page import render_page

    out = Path(out)
    tl = timeline_path(out) if timeline else None
    tick("replay")
    job.replay()
    tick("report data")
    data = build_report(job, optimized=optimized, extra=extra, timeline_file=tl.name if tl else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    if tl is not None:
        tick("timeline")
        r = job.replay()
        write_timeline(tl, r.graph, r.schedule)
    tick("page")
    text = render_page(data)
    out.write_text(text, encoding="utf-8")
    pngs = []
    if png_dir is not None:
        from dpro.report.html.png import write_pngs

        tick("PNG charts")
        pngs = write_pngs(data, Path(png_dir))
    return WrittenReport(out, len(text.encode()), tl, pngs, data.gantt.aggregated)
