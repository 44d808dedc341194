"""The terminal summary of ``dpro oracle`` (reads an OracleResult, never a trace)."""

from __future__ import annotations

import math
from pathlib import Path

import click

from dpro.oracle.oracle import ADVICE, OracleResult

_SHORT = {"gradient_exchange": "GE", "layerwise_collectives": "layer", "halo_exchange": "halo", "pipeline_p2p": "P2P"}


def _ms(us: float) -> str:
    return f"{us / 1e3:9.2f}" if math.isfinite(us) else "        -"


def print_oracle(res: OracleResult, path: Path) -> None:
    """Per device count: the strategies ranked, their breakdown, memory, limit, bottleneck;
    then the launcher settings of the best one."""
    p = res.platform
    rule = (f"profiled batch {res.model.batch} per device" if len(res.model.batches) < 2 else
            f"profiled batches {', '.join(map(str, res.model.batches))} per device ({res.model.rule} rule)")
    click.echo(f"{path}: {len(res.model.layers)} layers, {rule}, "
               f"global batch {res.batch}; link α {p.alpha_us:.1f} µs, β {p.beta_us_per_byte * 1e3:.4f} ns/B ({p.source})")
    for n in res.devices:
        click.echo(f"\n{n} devices      rank  iteration ms  compute ms  communication ms (by phase)          memory MiB  bottleneck / limit")
        rows = sorted((x for x in res.predictions if x.devices == n),
                      key=lambda x: (not x.feasible, x.iteration_us if math.isfinite(x.iteration_us) else math.inf))
        for x in rows:
            phases = " ".join(f"{_SHORT[k]} {v / 1e3:.2f}" for k, v in x.communication_us.items() if v and math.isfinite(v))
            if x.host_us:  # the host work around the collectives (calibrated copies, Functions)
                phases += f" +host {sum(x.host_us.values()) / 1e3:.2f}"
            sim = res.simulated.get((x.strategy, n))
            tail = x.bottleneck if x.feasible else f"infeasible: {x.limit_reason}"
            click.echo(f"  {x.strategy:<13} {x.rank or '-':>4}  {_ms(x.iteration_us)}{'' if sim is None or not math.isfinite(sim) else f' (sim {sim / 1e3:.2f})'}"
                       f"   {_ms(x.compute_us)}  {phases or '-':<36} {x.memory_bytes / 2**20:10.1f}  {tail}")
        best = res.best(n)
        if best is not None:
            click.echo(f"  best: {best.strategy} {best.grid}; {ADVICE.get(best.bottleneck, '')}")
            click.echo(f"  launcher: {res.launcher(best)}")
    for note in res.to_json()["notes"]:
        click.echo(f"note: {note}")


def print_calibration(d: dict, output: Path) -> None:
    """What ``dpro calibrate --oracle`` measured (the platform file ``d``, written to ``output``)."""
    cal = d["oracle"]
    topo = cal["topology"]
    ratio = topo.get("concurrent_ratio")
    how = f"measured: two pairs at once take {ratio:.2f}x one pair" if ratio is not None else "declared"
    click.echo(f"wrote {output}: gloo, {d.get('cores')} cores; ranks' links: {topo['links']} ({how})")
    for n, kinds in cal["links"].items():
        for k, c in kinds.items():
            burst = (f", token bucket: first {c['burst_bytes'] / 1024:.0f} KiB at {c['burst_beta_us_per_byte'] * 1e3:.3f} ns/B"
                     if c.get("burst_bytes") else "")
            click.echo(f"  {n} processes {k:<9}: alpha {c['alpha_us']:8.1f} us per call, "
                       f"beta {c['beta_us_per_byte'] * 1e3:7.3f} ns per byte sent{burst}")
    for n, kinds in (cal.get("calls") or {}).items():
        for k, c in kinds.items():
            lo, mid, hi = c["alpha_rounds_us"]
            click.echo(f"  {n} processes {k:<9}: back to back: alpha {c['alpha_us']:8.1f} us per call "
                       f"(rounds {lo:.0f}-{hi:.0f}, median {mid:.0f}, {c['rounds']} rounds), "
                       f"beta {c['beta_us_per_byte'] * 1e3:7.3f} ns per byte sent")
    h = cal["host"]
    click.echo("  host: " + ", ".join(f"{k} {h[k]['alpha_us']:.1f} us + {h[k]['beta_us_per_byte'] * 1e3:.3f} ns/B"
                                      for k in ("cat", "slice", "clone", "zeros")) +
               f", autograd.Function {h['function_us']:.1f} us")
