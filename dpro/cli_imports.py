"""Every `dpro import X` command, registered on the CLI's ``import`` group in one place.

The importers themselves are plain functions (:mod:`dpro.importers`) and know nothing of
the command line; each command here reads its source, writes the gTrace and says what it
wrote.
"""

from __future__ import annotations

from pathlib import Path

import click

from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN

#: ``--rank-pattern``, as on the other commands that read torch.profiler traces
rank_pattern_option = click.option(
    "--rank-pattern",
    default=DEFAULT_RANK_PATTERN,
    show_default=True,
    help="Regex whose first group is the rank in a trace file name (when the trace has no distributedInfo).",
)


def register_import_commands(group: click.Group) -> None:
    """Add ``kineto``, ``byteps`` and ``pslite`` to ``group`` (the CLI's ``dpro import``)."""
    group.add_command(import_kineto_cmd)
    group.add_command(import_byteps_cmd)
    group.add_command(import_pslite_cmd)


@click.command(name="kineto")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="gTrace directory to write.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@rank_pattern_option
def import_kineto_cmd(path: Path, output: Path, force: bool, rank_pattern: str) -> None:
    """Convert torch.profiler (Kineto) traces in PATH, one file per rank, to gTrace."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.kineto import import_kineto

    gt = import_kineto(path, rank_pattern)
    write_gtrace(gt, output, force=force)
    click.echo(f"wrote {output} ({len(gt.nodes)} nodes)")


@click.command(name="byteps")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="gTrace directory to write.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@click.option("--start-step", type=int, default=None,
              help="BYTEPS_TRACE_START_STEP of the run (numbers steps; matches server requests by count).")
@click.option("--framework", default="unknown", show_default=True, help="Framework recorded in the manifest.")
def import_byteps_cmd(path: Path, output: Path, force: bool, start_step: int | None, framework: str) -> None:
    """Convert a BytePS trace directory (BYTEPS_TRACE_DIR, optional server_profile.json) to gTrace."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.byteps import import_byteps

    gt = import_byteps(path, start_step=start_step, framework=framework)
    write_gtrace(gt, output, force=force)
    click.echo(f"wrote {output} ({len(gt.nodes)} nodes)")
    for n in gt.notes:
        click.echo(f"  note: {n}")


@click.command(name="pslite")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="gTrace directory to write.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@click.option("--framework", default="ps-lite", show_default=True, help="Framework recorded in the manifest (e.g. mxnet).")
def import_pslite_cmd(path: Path, output: Path, force: bool, framework: str) -> None:
    """Convert ps-lite message traces (PS_TRACE_DIR of native/pslite_patch) to gTrace."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.pslite import import_pslite

    gt = import_pslite(path, framework=framework)
    write_gtrace(gt, output, force=force)
    click.echo(f"wrote {output} ({len(gt.nodes)} nodes, {len(gt.manifest.steps)} steps)")
    for n in gt.notes:
        click.echo(f"  note: {n}")
