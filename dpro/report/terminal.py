"""Human-readable summaries for the terminal (rich)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpro.replayer.replay import ReplayResult


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def print_replay(res: ReplayResult, path: Path, top: int = 15, timeline: Path | None = None) -> None:
    """The terminal summary of ``dpro replay``: predicted vs measured, the graph, the
    breakdown, the longest ``top`` critical-path ops, the notes."""
    con = Console()
    con.print(f"[bold]dpro replay[/bold] {path}")
    err = res.error_pct
    con.print(
        f"  predicted iteration [bold]{_ms(res.predicted_iteration_us)}[/bold]   "
        f"measured {_ms(res.measured_iteration_us)}   "
        f"error {'n/a' if err is None else f'{err:+.1f}%'}"
    )
    lc = res.build.link_cost
    con.print(
        f"  {res.graph.n} ops on {len(res.graph.devices)} devices; "
        f"{res.build.expanded} collectives on the ring model"
        + (f" (alpha {lc.alpha:.1f} us/step{'' if lc.latency_known else ' (one collective shape: not measurable)'}, "
           f"{1 / lc.beta:.1f} MB/s per link)" if lc and lc.beta > 0 else "")
        + f", {res.build.kept_coarse} with measured times"
    )
    t = Table(title="breakdown per worker (mean)", show_edge=False)
    t.add_column("part")
    t.add_column("time", justify="right")
    t.add_column("% of iteration", justify="right")
    it = res.predicted_iteration_us or 1.0
    for k, v in res.breakdown_us.items():
        t.add_row(k, _ms(v), f"{100 * v / it:.1f}")
    con.print(t)
    cp = sorted(res.critical_path, key=lambda p: -p.dur_us)[:top]
    t = Table(title=f"critical path: {len(res.critical_path)} ops, longest {len(cp)}", show_edge=False)
    for c in ("op", "cat", "device", "start", "dur"):
        t.add_column(c, justify="right" if c in ("start", "dur") else "left")
    for p in cp:
        t.add_row(p.name[:70], p.cat, p.device, _ms(p.start_us), _ms(p.dur_us))
    con.print(t)
    for n in res.notes:
        con.print(f"  [yellow]note[/yellow]: {n}")
    if timeline:
        con.print(f"  timeline written to {timeline} (open in https://ui.perfetto.dev)")
