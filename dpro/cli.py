"""The `dpro` command line."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from dpro.cli_imports import rank_pattern_option, register_import_commands
from dpro.errors import DproInputError
from dpro.jsonio import print_bytes, print_json
from dpro.sizes import DEFAULT_MAX_INPUT, parse_size

_rank_opt = rank_pattern_option
_ray_opt = click.option(
    "--ray", "ray_address", default=None, metavar="auto|local|ADDRESS",
    help="Run the independent work as Ray tasks (pip install 'dpro[ray]'; docs/scale.md): auto = the cluster "
         "`ray start` started (or $RAY_ADDRESS), local = a Ray started here, or HOST:6379 / ray://HOST:10001.")


def _fail(err: Exception) -> None:
    click.echo(f"dpro: error: {err}", err=True)
    sys.exit(getattr(err, "exit_code", 2))


class _Group(click.Group):
    """Turns DproInputError into one line and exit code 2, never a traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except DproInputError as e:
            _fail(e)
        except OSError as e:  # e.g. stdout on a full disk or a closed pipe
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            if isinstance(e, BrokenPipeError):
                sys.exit(1)
            _fail(DproInputError(e.filename, e.strerror or str(e)))
        except KeyboardInterrupt:
            click.echo("dpro: interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dpro")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("--max-input-bytes", metavar="SIZE", envvar="DPRO_MAX_INPUT_BYTES", default=DEFAULT_MAX_INPUT, show_default=True,
              help="Refuse an input file larger than SIZE once decompressed (e.g. 8GiB).")
@click.option("--allow-missing-ranks", is_flag=True, envvar="DPRO_ALLOW_MISSING_RANKS",
              help="Go on with the ranks present when some are missing or unreadable (said in the output).")
@click.pass_context
def cli(ctx: click.Context, verbose: int, max_input_bytes: str, allow_missing_ranks: bool) -> None:
    """dpro: why is distributed training slow, and what will make it faster.

    \b
    Typical use:
      dpro replay traces/            predicted vs measured iteration time, breakdown, critical path
      dpro replay traces/ --json     the same as one JSON object
      dpro validate traces/          check a trace directory
      dpro align traces/             clock offsets between hosts (CVXPY)
      dpro optimize traces/ -o out/  a faster strategy (fusion, partition) and its settings
      dpro report traces/ -o r.html  one self-contained HTML page (charts, Gantt, critical path)
      dpro whatif traces/ --workers 2,4,8   what if: more workers/servers, another network, AMP, ...
      dpro calibrate -o platform.json       this machine's all-reduce cost, for dpro whatif --platform
      dpro import kineto DIR -o OUT  convert torch.profiler traces to a gTrace directory
      dpro import byteps DIR -o OUT  convert BytePS traces (docs/byteps.md)
      dpro import pslite DIR -o OUT  convert ps-lite message traces (docs/pslite.md)

    Times are in microseconds and sizes in bytes in every file and JSON output.
    """
    logging.basicConfig(level=logging.WARNING - 10 * verbose, format="%(levelname)s %(name)s: %(message)s")
    from dpro.jsonio import current_read_options, read_options

    limit = parse_size(max_input_bytes, "--max-input-bytes")
    allow = allow_missing_ranks or current_read_options().allow_missing_ranks  # (a caller's own setting)
    ctx.with_resource(read_options(max_input_bytes=limit, allow_missing_ranks=allow))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@click.option("--timeline", type=click.Path(path_type=Path), help="Write the simulated iteration as a Chrome trace (Perfetto).")
@click.option("--top", default=15, show_default=True, help="Critical-path ops to show in the summary.")
@click.option("--no-expand", is_flag=True, help="Keep each collective's measured time instead of the ring model.")
@click.option("--no-align", is_flag=True, help="Keep every node's recorded clock (no clock alignment across hosts).")
@_rank_opt
@click.option("--no-cache", is_flag=True,
              help="Import the traces again instead of using the trace cache (~/.cache/dpro/traces, $DPRO_CACHE_DIR).")
@_ray_opt
def replay(
    path: Path, as_json: bool, timeline: Path | None, top: int, no_expand: bool, no_align: bool, rank_pattern: str,
    no_cache: bool, ray_address: str | None,
) -> None:
    """Replay one training iteration of the job traced in PATH.

    PATH is a gTrace directory or a directory of torch.profiler traces (one file per
    rank). Prints the predicted iteration time next to the one measured in the trace and,
    where dpro's recorder measured its own overhead, the prediction without it.

    An import of torch.profiler traces is cached: a second replay of unchanged files
    skips it, and a second --json replay with the same options prints the cached result
    (--no-cache, or DPRO_NO_CACHE=1, turns both off). With --ray the rank files
    are imported as Ray tasks (each worker reads its file: the same path must be readable
    there).

    The last line says which replay engine ran: the compiled core when it was built
    (else the Python one, and why); DPRO_ENGINE=python|compiled|both forces one.
    """
    from dpro.job import result_cache

    # --json of unchanged traces: the result cache (before anything heavy is imported)
    cached = None if not as_json or timeline or no_cache or ray_address else result_cache(
        path, "replay", {"expand_collectives": not no_expand, "align": not no_align}, rank_pattern=rank_pattern)
    if cached is not None and (hit := cached.load()) is not None:
        print_bytes(hit)  # the bytes the first replay printed
        return
    from dpro.executor import mapper_for
    from dpro.job import open_job

    import gc

    mapper = mapper_for(ray_address) if ray_address else None
    # numpy loads while the import's forked workers run (dpro.importers.kineto.pool); its
    # OpenBLAS would start a thread per core that spins a while on the workers' core, and
    # the replay's arrays are small: one thread, unless the caller's environment says otherwise
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    gc.disable()  # opening makes few cycles; each collection would traverse the trace just imported
    try:
        job = open_job(path, rank_pattern=rank_pattern, align=not no_align, cache=False if no_cache else None,
                       progress=False if as_json else None, mapper=mapper)
    finally:
        gc.enable()
    gc.freeze()  # the trace lives until this process ends: the collector need not traverse it again
    res = job.replay(expand_collectives=not no_expand)
    if timeline:
        from dpro.replayer.timeline import write_timeline

        write_timeline(timeline, res.graph, res.schedule)
    if as_json:
        out = res.to_json()
        if cached is not None:
            print_bytes(cached.save(out))  # print_json's bytes, as stored
            return
        print_json(out)
        return
    from dpro.report import print_replay

    print_replay(res, path, top=top, timeline=timeline)
    ov, unprof, memory = res.profiling_overhead, res.predicted_unprofiled_iteration_us, res.memory
    if ov is not None:
        click.echo(f"  profiling overhead (recorder's clock): {ov.pct:+.1f}% ({ov.unprofiled_us / 1e3:.2f} ms per step "
                   f"outside the window, {ov.profiled_us / 1e3:.2f} ms in it)")
    if unprof is not None:
        click.echo(f"  predicted iteration without the profiling overhead: {unprof / 1e3:.2f} ms")
    for w, m in memory.items():
        if m.source == "allocations":
            click.echo(f"  {w}: predicted peak memory {m.peak_bytes / 2**20:.1f} MiB at {m.peak_us / 1e3:.1f} ms "
                       f"({m.peak_op}); static {m.static_bytes / 2**20:.1f} MiB")
        elif m.static_bytes:
            click.echo(f"  {w}: parameters + gradients {m.static_bytes / 2**20:.1f} MiB (allocations not recorded: "
                       "no peak memory estimate)")
    from dpro.replayer.engine import engine_line

    click.echo(f"  {engine_line()}")
    from dpro.importers.kineto.read import reader_line

    if job.trace.manifest.meta.get("importer") == "kineto" and (line := reader_line()) is not None:
        click.echo(f"  {line}")  # the compiled reader loop is missing: the import ran in Python


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True,
              help="HTML file to write; the Perfetto timeline goes beside it (NAME.timeline.json).")
@click.option("--optimize", "run_optimize", is_flag=True,
              help="Add the optimizer's section: baselines, the best strategy and, for DDP, step time vs bucket_cap_mb.")
@click.option("--budget", default=20.0, show_default=True, help="With --optimize: search time budget in seconds.")
@click.option("--png", "png_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Also write each chart as a PNG file into DIR (for CI logs and issues).")
@click.option("--result", "results", multiple=True, type=click.Path(path_type=Path), metavar="FILE",
              help="A JSON result to add as a section (e.g. a what-if's --json); its lists of "
                   "{devices|workers, iteration_us} points are drawn as a scaling curve. Repeatable.")
@click.option("--whatif", "whatif_workers", default=None, metavar="N1,N2,..",
              help="Add the scale-out what-if for these worker counts (dpro whatif --workers; docs/whatif.md).")
@click.option("--oracle", "oracle_devices", default=None, metavar="N1,N2,..",
              help="Add dpro oracle's strategies for these device counts (needs dpro's recorder; docs/oracle.md).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@click.option("--no-align", is_flag=True, help="Keep every node's recorded clock (no clock alignment across hosts).")
@_rank_opt
def report(path: Path, output: Path, run_optimize: bool, budget: float, png_dir: Path | None,
           results: tuple[Path, ...], whatif_workers: str | None, oracle_devices: str | None, as_json: bool,
           no_align: bool, rank_pattern: str) -> None:
    """Write one self-contained HTML report of the job traced in PATH.

    \b
    The page opens offline (every script inline): predicted vs measured iteration,
    each worker's breakdown, a Gantt of the simulated iteration with the critical
    path, the exposed communication per collective, predicted memory over the
    iteration, and with --optimize the strategies and DDP's bucket_cap_mb curve.
    Big jobs are aggregated in the Gantt and the page says so (docs/report.md).
    """
    from dpro.job import open_job
    from dpro.jsonio import read_json
    from dpro.progress import progress_pulse
    from dpro.report.html import write_report
    from dpro.report.html.model import JsonResult

    if budget <= 0:
        raise click.BadParameter("must be positive", param_hint="--budget")
    extra = {}
    for f in results:
        obj = read_json(f)
        if not isinstance(obj, dict):
            raise DproInputError(f, "expected a JSON object (a result's --json)")
        extra[f.stem] = JsonResult(obj)
    job = open_job(path, rank_pattern=rank_pattern, align=not no_align)
    if whatif_workers is not None:
        from dpro.whatif.platform import parse_workers
        from dpro.whatif.scaleout import Cluster, predict

        try:
            counts = parse_workers(whatif_workers)
        except ValueError as e:
            raise DproInputError(None, f"--whatif: {e}") from None
        extra["what-if: scale-out"] = predict(job, [Cluster(workers=n) for n in counts])
    if oracle_devices is not None:
        from dpro.oracle import run_oracle

        counts = []
        for t in oracle_devices.split(","):
            if not t.strip().isdigit() or int(t) < 1:
                raise DproInputError(None, f"--oracle: {t.strip()!r} is not a device count >= 1")
            counts.append(int(t))
        extra["oracle"] = run_oracle(job, counts)
    opt = None
    if run_optimize:
        with progress_pulse("optimizing") as tick:
            opt = job.optimize(budget_s=budget, tick=tick)
    with progress_pulse("writing the report") as tick:
        written = write_report(job, output, optimized=opt, extra=extra, png_dir=png_dir, tick=tick)
    if as_json:
        print_json(written.to_json())
        return
    click.echo(f"wrote {written.html} ({written.html_bytes / 1e6:.1f} MB)"
               + (f" and {written.timeline}" if written.timeline else "")
               + (f"; {len(written.pngs)} PNG files in {png_dir}" if written.pngs else ""))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@_rank_opt
@_ray_opt
def validate(path: Path, rank_pattern: str, ray_address: str | None) -> None:
    """Check that PATH is a well-formed trace (gTrace or torch.profiler) and say what it holds."""
    from dpro.executor import mapper_for
    from dpro.loader import open_trace

    gt = open_trace(path, rank_pattern, mapper=mapper_for(ray_address) if ray_address else None)
    m = gt.manifest
    ops = sum(len(n.ops) for n in gt.nodes.values())
    workers = sum(1 for n in gt.nodes.values() if n.info.role == "worker")
    servers = sum(1 for n in gt.nodes.values() if n.info.role == "server")
    who = f"{workers} of {m.world_size} workers" + (f" + {servers} server(s)" if servers else "")
    click.echo(f"{path}: ok: {m.framework}/{m.library} {m.scheme}, {who}, steps {m.steps}, {ops} ops")
    for note in gt.notes:
        click.echo(f"  note: {note}")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("dpro_traces"), show_default=True,
              help="gTrace directory to write (the ranks' raw traces go to OUTPUT/raw).")
@click.option("--warmup", default=5, show_default=True, help="Calls of the step function before profiling.")
@click.option("--steps", default=5, show_default=True, help="Calls of the step function to profile.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@click.option("--measure-compile", is_flag=True,
              help="After the window, time the model's blocks eagerly and compiled (PyTorch: each block under "
                   "torch.compile, tens of seconds per distinct block; TensorFlow: the model's forward + backward "
                   "with and without XLA), so that `dpro optimize` prices op fusion by measurement.")
@click.option("--mxnet-unbulk", is_flag=True,
              help="MXNet: turn operator bulking off in the window, so that each op of the block is its own event "
                   "(layers and op classes for op fusion, the AMP what-if, per-op replay). It changes the job: "
                   "pushes then leave op by op, and the window runs at another pace than the job (faster or "
                   "slower). Default: bulking kept, the job runs as unprofiled and a bulked segment is one op "
                   "(docs/profiling.md).")
@click.option("--mxnet-keep-bulking", is_flag=True,
              help="MXNet: accepted for old scripts; keeping bulking is now the default (the flag does nothing).")
@click.option("--shapes/--no-shapes", "record_shapes", default=None,
              help="PyTorch: record every op's input shapes (torch.profiler record_shapes), which `dpro oracle` "
                   "needs for its layer sizes. Default: off (it slows the profiled steps; docs/profiling.md).")
@click.option("--memory/--no-memory", "profile_memory", default=None,
              help="PyTorch: record every allocation and free in the window (torch.profiler profile_memory), "
                   "for the allocation-based memory estimates (docs/memory.md). Default: off.")
@click.option("--cuda-light", "cuda_light", is_flag=True,
              help="PyTorch on CUDA: record the window's first step with its CPU operators (the structure) and "
                   "the others with the CUDA activity alone (kernels, copies, runtime calls: the timing), which "
                   "costs a fraction of torch.profiler's per-op CPU tracing (docs/gpu.md). Default: off.")
@click.option("--cpu-light/--no-cpu-light", "cpu_light", default=None,
              help="PyTorch on the CPU: record the window's first step with torch.profiler (the structure) and "
                   "time the others by the recorder's hooks alone (layers, DDP buckets, optimizer steps), which costs a fraction of the "
                   "profiler's tracing (docs/profiling.md). Default: on for a model on the CPU, unless --memory or Horovod; "
                   "--no-cpu-light records every step with torch.profiler.")
@click.option("--shallow-ranks/--no-shallow-ranks", "shallow_ranks", default=None,
              help="PyTorch: ranks other than 0 record only the window's first call, and the replay takes "
                   "their later steps from rank 0's (data parallelism: every rank runs the same ops). Default: "
                   "on only for a DDP model over every rank on a host that runs more ranks than it has cores, "
                   "where each rank's recording takes cores from the others (docs/profiling.md).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def profile(output: Path, warmup: int, steps: int, force: bool, measure_compile: bool, mxnet_unbulk: bool,
            mxnet_keep_bulking: bool, record_shapes: bool | None, profile_memory: bool | None, cuda_light: bool,
            cpu_light: bool | None, shallow_ranks: bool | None, command: tuple[str, ...]) -> None:
    """Run a training COMMAND with dpro recording on, and collect one gTrace.

    \b
    The training script must use the recorder (two lines):
        recorder = dpro.Recorder(model)
        @dpro.profile(recorder)
        def train_one_step(...): ...
    \b
    Examples:
        dpro profile -o traces/ -- torchrun --nproc_per_node 2 train.py --epochs 1
        dpro profile -o traces/ -- horovodrun -np 2 --gloo python train.py
        dpro profile train.py            # runs `python train.py`, writes ./dpro_traces
    \b
    The job's output and exit code pass through. If it fails, what was recorded before is
    kept. Several hosts: run `dpro profile` on each, then `dpro collect` their OUTPUT/raw.
    """
    from dpro.profiler.launcher import profile_job

    if warmup < 0 or steps < 1:
        raise click.BadParameter("need --warmup >= 0 and --steps >= 1")
    if mxnet_keep_bulking:
        if mxnet_unbulk:
            raise click.BadParameter("--mxnet-keep-bulking and --mxnet-unbulk contradict each other")
        click.echo("dpro: --mxnet-keep-bulking: keeping MXNet's op bulking is now the default (the flag does "
                   "nothing; --mxnet-unbulk for per-op detail)", err=True)
    if cuda_light:  # the job inherits the environment (dpro.profiler.config)
        from dpro.contracts.recording import ENV_CUDA_LIGHT

        os.environ[ENV_CUDA_LIGHT] = "1"
    if cpu_light is not None:
        from dpro.contracts.recording import ENV_CPU_LIGHT

        os.environ[ENV_CPU_LIGHT] = "1" if cpu_light else "0"
    if shallow_ranks is not None:
        from dpro.contracts.recording import ENV_SHALLOW_RANKS

        os.environ[ENV_SHALLOW_RANKS] = "1" if shallow_ranks else "0"
    res = profile_job(list(command), output, warmup=warmup, steps=steps, force=force, measure_compile=measure_compile,
                      mxnet_unbulk=mxnet_unbulk, record_shapes=record_shapes,
                      profile_memory=profile_memory)
    click.echo(f"dpro: {res.message}", err=True)
    if res.out is not None:
        click.echo(f"dpro: next: dpro replay {res.out}", err=True)
    sys.exit(res.returncode)


@cli.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="gTrace directory to write.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
def collect(dirs: tuple[Path, ...], output: Path, force: bool) -> None:
    """Merge the recordings of several hosts (each host's OUTPUT/raw) into one gTrace."""
    import tempfile

    from dpro.gtrace.io import write_gtrace
    from dpro.importers.recording import collect as collect_raw, merge_dirs

    with tempfile.TemporaryDirectory(prefix="dpro-merge-") as tmp:
        merge_dirs(list(dirs), Path(tmp))
        try:
            gt = collect_raw(Path(tmp), source=", ".join(str(d) for d in dirs))
        except DproInputError as e:  # name the user's file, not its merged copy
            if not (e.path and Path(e.path).is_relative_to(tmp)):
                raise
            rel = Path(e.path).relative_to(tmp)
            raise DproInputError(next((d / rel for d in dirs if os.path.lexists(d / rel)), dirs[0] / rel), e.problem) from None
    write_gtrace(gt, output, force=force)
    click.echo(f"wrote {output} ({len(gt.nodes)} ranks)")
    for note in gt.notes:
        click.echo(f"  note: {note}")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Write the summary and the strategy files (ddp.json, horovod.json, ...) here.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@click.option("--budget", default=30.0, show_default=True, help="Search time budget in seconds.")
@click.option("--passes", "pass_names", default=None,
              help="Comma-separated passes to search with (default: every throughput pass).")
@click.option("--load-pass", "modules", multiple=True, metavar="MODULE",
              help="Import MODULE and use the passes it marks with @dpro.passes.register (repeatable).")
@click.option("--list-passes", is_flag=True, help="List the available passes and exit.")
@click.option("--no-align", is_flag=True, help="Keep every node's recorded clock (no clock alignment across hosts).")
@click.option("--memory-budget", "memory_budget", default=None, metavar="SIZE",
              help="Peak memory per worker to fit first (e.g. 8GiB, 500MB, 123456): recomputation and "
                   "gradient accumulation are searched when the job does not fit.")
@click.option("--micro-trace", "micro_trace", default=None, type=click.Path(path_type=Path), metavar="PATH",
              help="The same job profiled with a smaller per-rank batch (e.g. half): gradient accumulation's "
                   "micro-batch op times are interpolated from it instead of scaled by 1/k.")
@_rank_opt
@_ray_opt
def optimize(path: Path | None, output: Path | None, force: bool, as_json: bool, budget: float, pass_names: str | None,
             modules: tuple[str, ...], list_passes: bool, no_align: bool, memory_budget: str | None,
             micro_trace: Path | None, rank_pattern: str, ray_address: str | None) -> None:
    """Search a faster strategy for the job traced in PATH and say how to apply it.

    \b
    Walks the replayed critical path (dPRO's Algorithm 1) with the graph passes
    (tensor fusion, op fusion, tensor partition, and any --load-pass), replays every
    change, and keeps those that make the iteration faster. Prints the predicted
    iteration time before/after, next to the library defaults (DDP 25 MiB buckets,
    Horovod fusion, fuse everything, no fusion), and with -o writes the settings
    the libraries take: ddp.json (bucket_cap_mb), horovod.json/.env (groups,
    fusion threshold), compile.json (layers to compile).

    With --ray the rank files are imported and the candidates of each search round
    replayed as Ray tasks, all at once (the result is the same as without).

    \b
    MXNet parameter-server traces: every distinct MXNET_KVSTORE_BIGARRAY_BOUND (which
    keys are split across the servers) is replayed against MXNet's default, no split
    and every key split; -o writes mxnet.json/.env.

    \b
    With --memory-budget the job is first made to fit: the predicted peak memory
    is checked and, if over, every combination of the memory passes
    (recomputation of model blocks, gradient accumulation) is replayed and the
    fastest that fits is kept (memory.json says what to checkpoint and how many
    micro-batches to run).
    """
    from dpro.optimizer.passes.registry import default_registry

    if budget <= 0:
        raise click.BadParameter("must be positive", param_hint="--budget")
    mem_bytes = parse_size(memory_budget, "--memory-budget") if memory_budget is not None else None
    reg = default_registry(list(modules))
    if list_passes:
        for p in reg:
            click.echo(f"{p.name:<20} {p.kind:<11} {(p.__doc__ or '').strip().splitlines()[0] if p.__doc__ else ''}")
        return
    if path is None:
        raise click.UsageError("Missing argument 'PATH'.")
    names = [n.strip() for n in pass_names.split(",") if n.strip()] if pass_names else None
    passes = reg.select(names) if names else [p for p in reg if p.kind == "throughput"]
    mem_passes = [p for p in passes if p.kind == "memory"] if names else [p for p in reg if p.kind == "memory"]
    if output is not None:
        from dpro.jsonio import check_writable_dir

        check_writable_dir(output, force)  # before the search, not after it
    from dpro.executor import mapper_for
    from dpro.job import open_job
    from dpro.loader import open_trace
    from dpro.optimizer.output import summary_text, write_strategy_dir
    from dpro.progress import progress_pulse

    mapper = mapper_for(ray_address) if ray_address else None

    quiet = False if as_json else None  # --json: no progress bars
    job = open_job(path, rank_pattern=rank_pattern, align=not no_align, progress=quiet, mapper=mapper)
    small = open_trace(micro_trace, rank_pattern, progress=quiet) if micro_trace is not None else None
    with progress_pulse("optimizing", enabled=quiet) as tick:
        res = job.optimize(passes=passes, budget_s=budget, memory_budget=mem_bytes, memory_passes=mem_passes,
                           micro_trace=small, tick=tick, mapper=mapper)
    if output is not None:
        write_strategy_dir(res, output, force=force)
    if as_json:
        print_json(res.to_json())
        return
    click.echo(summary_text(res), nl=False)
    if output is not None:
        click.echo(f"\nwrote {output}/ (summary.txt, strategy.json and the files above)")


@cli.command(name="align")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the aligned trace (a gTrace directory).")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it already holds files.")
@click.option("--reference", default=None, help="Node whose clock is the reference (default: the lowest-rank worker).")
@click.option("--one-host", "one_host", is_flag=True, help="Align even when every node reports the same host.")
@_rank_opt
def align_cmd(
    path: Path, as_json: bool, output: Path | None, force: bool, reference: str | None, one_host: bool, rank_pattern: str
) -> None:
    """Estimate every node's clock offset (µs) so that the whole trace is on one clock.

    Nodes with the same host share a clock. Offsets come from the cross-node dependencies
    (SEND/RECV, PUSH/PULL, collectives), solved with CVXPY; see docs/alignment.md.
    """
    from dpro.alignment import AlignOptions, apply_offsets
    from dpro.job import open_job

    job = open_job(path, rank_pattern=rank_pattern, align=AlignOptions(reference=reference, force=one_host),
                   progress=False if as_json else None)
    res = job.alignment
    if output is not None:
        from dpro.gtrace.io import write_gtrace

        write_gtrace(apply_offsets(job.profiled, res.offsets_us), output, force=force)
    if as_json:
        d = res.to_json()
        d["output"] = None if output is None else str(output)
        print_json(d)
        return
    click.echo(
        f"{path}: {len(res.offsets_us)} nodes, reference {res.reference}: {res.solver} {res.status}, "
        f"{res.variables} variables, {res.constraints} constraints, {res.iterations} iteration(s), {res.time_s:.2f} s"
    )
    for name, theta in res.offsets_us.items():
        lo, hi = res.bounds_us.get(name, (None, None))
        allowed = "" if lo is None and hi is None else (
            f"   dependencies allow {'-inf' if lo is None else f'{lo:+.1f}'} .. {'+inf' if hi is None else f'{hi:+.1f}'}")
        click.echo(f"  {name:<20} {theta:+14.1f} µs{allowed}")
    for note in res.notes:
        click.echo(f"  note: {note}")
    if output is not None:
        click.echo(f"wrote {output}")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--devices", default="2,4,8,16,32,64,128,256,512,1024", show_default=True, metavar="N,N,...",
              help="Device counts to predict, comma-separated.")
@click.option("--memory", "memory", default=None, metavar="SIZE",
              help="Memory per device (e.g. 80GiB, 500MB): strategies above it are infeasible.")
@click.option("--platform", "platform", default=None, type=click.Path(path_type=Path), metavar="FILE",
              help='Link cost {"alpha_us": ..., "beta_us_per_byte": ...} (default: fitted from the trace\'s collectives).')
@click.option("--batch", default=None, type=int, help="Global batch (default: the profiled per-device batch x workers).")
@click.option("--micro", default=None, type=int, help="Pipeline micro-batches (default: 4 x stages, at most the batch).")
@click.option("--no-contention", is_flag=True, help="No contention penalty between the concurrent groups of hybrids.")
@click.option("--simulate", is_flag=True, help="Also replay each feasible strategy's DFG with dpro's replayer.")
@click.option("--profile-at", "profile_at", multiple=True, type=click.Path(path_type=Path), metavar="PATH2",
              help="A profile of the same model at another per-device batch, or a repeat at the same one "
                   "(repeatable): each layer's time is then fitted as a + b x batch where both parts exceed the "
                   "repeats' spread, else taken proportional to the batch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@_rank_opt
def oracle(path: Path, devices: str, memory: str | None, platform: Path | None, batch: int | None, micro: int | None,
           no_contention: bool, simulate: bool, as_json: bool, rank_pattern: str,
           profile_at: tuple[Path, ...] = ()) -> None:
    """Which parallelism strategy, on how many devices, and why (docs/oracle.md).

    \b
    From one profiled worker (dpro's recorder: per-layer annotations and shapes),
    predicts for data, spatial, filter, channel, pipeline, data+filter and
    data+spatial parallelism and each device count: compute, communication by phase,
    iteration time and memory per device (ParaDL's analytical model, HPDC'21), marks
    what exceeds a limit (memory, batch, filters, channels, feature-map height,
    layers), ranks the feasible ones and names each one's bottleneck, and says what
    to set in the launcher (device grid, pipeline micro-batches and stages).
    """
    from dpro.job import open_job
    from dpro.oracle import run_oracle

    counts = []
    for t in devices.split(","):
        if not t.strip().isdigit() or int(t) < 1:
            raise DproInputError(None, f"--devices: {t.strip()!r} is not a device count >= 1")
        counts.append(int(t))
    if batch is not None and batch < 1:
        raise DproInputError(None, f"--batch {batch}: must be >= 1")
    if micro is not None and micro < 1:
        raise DproInputError(None, f"--micro {micro}: must be >= 1")
    mem = parse_size(memory, "--memory") if memory is not None else None
    job = open_job(path, rank_pattern=rank_pattern)
    others = [open_job(q, rank_pattern=rank_pattern) for q in profile_at]
    res = run_oracle(job, counts, batch=batch, memory_budget=mem, platform=platform, micro=micro,
                     contention=not no_contention, simulate=simulate, profile_at=others)
    if as_json:
        print_json(res.to_json())
        return
    from dpro.oracle.render import print_oracle

    print_oracle(res, path)


@cli.command(name="whatif")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("--workers", default=None, metavar="N|N1,N2,..",
              help="Predict for N workers (a list gives a scaling curve). Default: as profiled.")
@click.option("--servers", type=int, default=None, help="Parameter servers (PS jobs; default: as profiled).")
@click.option("--bandwidth", default=None, metavar="RATE", help="Link bandwidth, e.g. 10Gbit, 200Mbit, 1.25GB/s.")
@click.option("--profiled-bandwidth", default=None, metavar="RATE",
              help="The bandwidth the profile ran at: --bandwidth then swaps only the wire's share of beta.")
@click.option("--latency", default=None, metavar="TIME", help="Per-message overhead, e.g. 5us, 0.2ms.")
@click.option("--platform", "platform_file", type=click.Path(path_type=Path), default=None,
              help="alpha/beta measured by `dpro calibrate` (needed when the profile has no collectives to fit); "
                   "with --host-cores, its overlap keys let a rank's computation and its collectives slow each "
                   "other while both run.")
@click.option("--algorithm", type=click.Choice(["ring", "tree"]), default="ring", show_default=True,
              help="All-reduce algorithm of the scale-out model.")
@click.option("--async", "asynchronous", is_flag=True, help="Asynchronous SGD (PS): throughput by discrete-event simulation.")
@click.option("--steps", "sim_steps", default=1000, show_default=True, help="Steps of the asynchronous simulation.")
@click.option("--host-cores", type=int, default=None, metavar="C",
              help="All workers share C cores of one host (local runs): compute slows by workers/C beyond C.")
@click.option("--pinned", is_flag=True,
              help="With --host-cores: each rank is bound to core rank % C, so the busiest core runs ceil(N/C) ranks.")
@click.option("--cpu-cost", "cpu_file", type=click.Path(path_type=Path), default=None,
              help="Platform file (dpro calibrate) whose all-reduce CPU time per rank (or, PS, CPU time per "
                   "message of the worker and the server: --backend ps-lite) counts as CPU demand "
                   "with --host-cores (default: --platform's, if it has one).")
@click.option("--apply", "apply_specs", multiple=True, metavar="NAME[:k=v,..]",
              help="Apply a what-if to the job's graph and replay it (repeatable; see --list).")
@click.option("--load-whatif", "modules", multiple=True, metavar="MODULE",
              help="Import MODULE and offer its @dpro.whatif.whatif functions to --apply.")
@click.option("--list", "list_only", is_flag=True, help="List the available what-ifs and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@click.option("--no-align", is_flag=True, help="Keep every node's recorded clock (no clock alignment across hosts).")
@_rank_opt
def whatif_cmd(path: Path | None, workers: str | None, servers: int | None, bandwidth: str | None,
               profiled_bandwidth: str | None, latency: str | None,
               platform_file: Path | None, algorithm: str, asynchronous: bool, sim_steps: int,
               host_cores: int | None, apply_specs: tuple[str, ...], modules: tuple[str, ...], list_only: bool,
               as_json: bool, no_align: bool, rank_pattern: str, cpu_file: Path | None = None,
               pinned: bool = False) -> None:
    """What if the job traced in PATH ran differently (docs/whatif.md)?

    \b
    Scale-out: --workers/--servers/--bandwidth/--latency/--async predict the step time
    (or asynchronous throughput) on another cluster, from a profile of any size:
      dpro whatif traces/ --workers 2,4,8 --json        scaling curve (all-reduce: ring)
      dpro whatif traces/ --workers 4 --bandwidth 1Gbit --platform platform.json
      dpro whatif ps-traces/ --workers 4 --servers 2 --async
    Graph what-ifs (Daydream's primitives): --apply NAME[:k=v,...], e.g.
      dpro whatif traces/ --apply mixed_precision --apply network:bandwidth=10
    With scale-out options too, the what-ifs change each worker before it is scaled out.
    """
    from dpro.whatif import available
    from dpro.whatif.platform import load_platform, parse_bandwidth, parse_time_us, parse_workers

    table = available(modules)
    if list_only:
        for name, fn in sorted(table.items()):
            click.echo(f"{name:18} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return
    if path is None:
        raise click.UsageError("PATH is required (unless --list)")
    try:
        counts = parse_workers(workers) if workers is not None else None
        bw = parse_bandwidth(bandwidth) if bandwidth is not None else None
        lat = parse_time_us(latency) if latency is not None else None
        pbw = parse_bandwidth(profiled_bandwidth) if profiled_bandwidth is not None else None
    except ValueError as e:
        raise DproInputError(None, str(e)) from None
    if servers is not None and servers < 1:
        raise DproInputError(None, f"--servers {servers}: must be >= 1")
    if host_cores is not None and host_cores < 1:
        raise DproInputError(None, f"--host-cores {host_cores}: must be >= 1")
    if sim_steps < 1:
        raise DproInputError(None, f"--steps {sim_steps}: must be >= 1")
    plat = load_platform(platform_file) if platform_file is not None else None
    cpu_cost = ps_cpu = None
    if cpu_file is not None:
        cpu_plat = load_platform(cpu_file)
        cpu_cost, ps_cpu = cpu_plat.allreduce_cpu, cpu_plat.ps_cpu
        if cpu_cost is None and ps_cpu is None:
            raise DproInputError(cpu_file, "--cpu-cost: the platform file has no cpu_alpha_us/cpu_beta_us_per_byte "
                                 "(all-reduce) nor ps worker_cpu_*/server_cpu_* (write it with this version's "
                                 "dpro calibrate)")
    from dpro.job import open_job

    job = open_job(path, rank_pattern=rank_pattern, align=not no_align)
    calls = []
    scale_out = counts is not None or bw is not None or lat is not None or servers is not None or asynchronous
    if apply_specs:
        from dpro.whatif import of
        from dpro.whatif.registry import parse_apply

        calls = [parse_apply(s, table) for s in apply_specs]
    if apply_specs and not scale_out:
        g = of(job)
        base = job.replay()
        for fn, params in calls:
            fn(g, **params)
        r = g.simulate()
        out = {"applied": list(apply_specs), "baseline_iteration_us": base.predicted_iteration_us,
               "predicted_iteration_us": r.iteration_us,
               "speedup": base.predicted_iteration_us / r.iteration_us if r.iteration_us else None}
        if as_json:
            print_json(out)
        else:
            click.echo(f"{path}: {', '.join(apply_specs)}: {base.predicted_iteration_us / 1e3:.2f} ms -> "
                       f"{r.iteration_us / 1e3:.2f} ms (x{out['speedup']:.2f})")
        return
    from dpro.whatif.scaleout import Cluster, predict

    nprof = sum(1 for nt in job.trace.nodes.values() if nt.info.role == "worker")
    pts = [Cluster(n, servers, bw, lat, algorithm, asynchronous, sim_steps, host_cores=host_cores,
                   profiled_bandwidth=pbw, comm_cpu=cpu_cost, pinned=pinned, ps_cpu=ps_cpu)
           for n in (counts or [nprof])]
    res = predict(job, pts, plat, whatifs=calls)
    if as_json:
        print_json(res.to_json())
        return
    t = res.transfer
    click.echo(f"{path}: {res.kind}{' (asynchronous)' if res.asynchronous else ''}, profiled with "
               f"{res.profiled_workers} worker(s); link alpha {t.alpha:.1f} us, beta {t.beta * 1e3:.4f} us/KB "
               f"({res.transfer_source})")
    if res.measured_iteration_us:
        click.echo(f"  measured iteration (profile): {res.measured_iteration_us / 1e3:.2f} ms")
    for p in res.points:
        srv = f", {p.servers} server(s)" if p.servers else ""
        click.echo(f"  {p.workers:4d} worker(s){srv}: {p.iteration_us / 1e3:9.2f} ms per step, "
                   f"{p.throughput:8.2f} steps/s")
    for n in res.notes:
        click.echo(f"  note: {n}")


@cli.command(name="calibrate")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("platform.json"), show_default=True,
              help="Platform file to write (docs/whatif.md).")
@click.option("--processes", "-n", default=2, show_default=True, help="Local processes in the group.")
@click.option("--backend", type=click.Choice(["gloo", "nccl", "mpi", "ucc", "horovod", "ps-lite"]), default="gloo",
              show_default=True,
              help="torch.distributed backend, horovod (Horovod's own all-reduce over gloo, run by horovodrun: "
                   "its background thread and fusion buffer included), or ps-lite (MXNet's parameter server).")
@click.option("--pin", is_flag=True,
              help="--backend horovod: bind each rank to core rank %% cores, as jobs pinned that way run.")
@click.option("--repeats", default=10, show_default=True, help="Timed all-reduces per size (ps-lite: the least push/pull rounds per size).")
@click.option("--tries", default=3, show_default=True,
              help="All-reduce: measure this many times in fresh processes and keep each size's median (one try "
                   "catches one of the machine's regimes).")
@click.option("--python", "python", default=None, metavar="EXE",
              help="ps-lite: the Python with MXNet to run the scheduler, server and worker (default: this one).")
@click.option("--json", "as_json", is_flag=True, help="Also print the platform file.")
@click.option("--port-workers", default=None, metavar="N,N,...",
              help="ps-lite: also measure a server port's efficiency with N asynchronous workers (1 server, no "
                   "computation), which `dpro whatif --async --platform` divides the busiest port's bound by.")
@click.option("--port-keys-from", "port_trace", type=click.Path(path_type=Path), default=None, metavar="PATH",
              help="--port-workers: push and pull keys of this PS profile's sizes (its message mix; default: a "
                   "fixed mix of 4 KiB to 4 MiB), each round after its computation (a worker step's, as CPU).")
@click.option("--port-momentum", default=0.0, show_default=True, metavar="M",
              help="--port-workers: the servers run SGD with this momentum (the job's optimizer: gluon's 'sgd' "
                   "with momentum 0.9 costs the server more per push than plain SGD).")
@click.option("--oracle", is_flag=True,
              help="Write the platform file of `dpro oracle --platform` instead (gloo, docs/oracle.md): per process "
                   "count of --nprocs the all-reduce, all-gather and halo exchange (with a link's token-bucket burst "
                   "when it has one), the per-call cost of back-to-back sends and halo exchanges (as a training step "
                   "pays them), the host copies of examples/parallel/, and whether ranks share a link.")
@click.option("--nprocs", default="2,4", show_default=True, metavar="N,N,...",
              help="--oracle: the process counts to measure at (a p-process prediction uses the largest <= p).")
@click.option("--topology", type=click.Choice(["measure", "shared", "per-rank"]), default="measure", show_default=True,
              help="--oracle: do collectives of disjoint ranks share a link (loopback, one NIC per host: the contention "
                   "penalty applies) or has every rank its own? measure: two pairs' all-reduces at once vs one pair "
                   "(needs 4 processes in --nprocs, else shared).")
@click.option("--rounds", default=6, show_default=True,
              help="--oracle: rounds over every size (5 calls each, a new order per round).")
@click.option("--idle-us", default=8000.0, show_default=True,
              help="--oracle: idle time before every timed call (µs), so that a token bucket refills as during compute.")
def calibrate_cmd(output: Path, processes: int, backend: str, repeats: int, as_json: bool, oracle: bool,
                  nprocs: str, topology: str, rounds: int, idle_us: float, tries: int = 3, pin: bool = False,
                  python: str | None = None,
                  port_workers: str | None = None, port_trace: Path | None = None,
                  port_momentum: float = 0.0) -> None:
    """Measure this machine's all-reduce (or ps-lite) cost for `dpro whatif --platform`.

    Runs PROCESSES local processes that all-reduce tensors of 4 KiB to 64 MiB with BACKEND
    and fits t = 2(N-1) * (alpha + beta * bytes/N) (per ring step; µs, bytes).
    With --backend ps-lite: one MXNet worker, server and scheduler push and pull arrays
    of 4 KiB to 16 MiB; fits the wall and the worker's and server's CPU time per message
    (alpha + beta * bytes), the CPU cost `dpro whatif --host-cores --cpu-cost` uses.

    With --oracle, the costs `dpro oracle --platform` uses (docs/oracle.md "Calibration").
    """
    if oracle:
        from dpro.jsonio import write_json
        from dpro.oracle.measure import calibrate_oracle, parse_nprocs
        from dpro.oracle.render import print_calibration
        from dpro.progress import progress_bar

        counts = parse_nprocs(nprocs, rounds, idle_us)
        with progress_bar(len(counts), "calibrating the oracle") as tick:
            d = calibrate_oracle(counts, topology=topology, rounds=rounds, idle_us=idle_us, tick=tick)
        write_json(output, d)
        if as_json:
            print_json(d)
        else:
            print_calibration(d, output)
        return
    if backend == "ps-lite":
        _calibrate_ps(output, repeats, python, as_json, port_workers, port_trace, port_momentum)
        return
    if processes < 2:
        raise DproInputError(None, f"--processes {processes}: at least 2")
    if repeats < 1:
        raise DproInputError(None, f"--repeats {repeats}: at least 1")
    if tries < 1:
        raise DproInputError(None, f"--tries {tries}: at least 1")
    if pin and backend != "horovod":
        raise DproInputError(None, "--pin: only with --backend horovod")
    from dpro.jsonio import write_json
    from dpro.progress import progress_bar
    from dpro.whatif.calibrate import calibrate, unsteady_note

    with progress_bar(tries, "calibrating the all-reduce") as tick:
        if backend == "horovod":
            from dpro.whatif.calibrate_hvd import calibrate_horovod

            d = calibrate_horovod(processes, repeats=repeats, tries=tries, pin=pin, tick=tick)
        else:
            d = calibrate(processes, backend, repeats=repeats, tries=tries, tick=tick)
    write_json(output, d)
    if as_json:
        print_json(d)
    else:
        a = d["allreduce"]
        click.echo(f"wrote {output}: {backend}, {processes} processes: alpha {a['alpha_us']:.1f} us, "
                   f"beta {a['beta_us_per_byte'] * 1e3:.4f} us/KB per ring step (fit error {a['fit_error']:.0%}); "
                   f"while the ranks compute: alpha {a['overlap_alpha_us']:.1f} us, beta "
                   f"{a['overlap_beta_us_per_byte'] * 1e3:.4f} us/KB, computation at x{a['overlap_compute_rate']:.2f}")
        if note := unsteady_note(d):
            click.echo(note, err=True)


def _calibrate_ps(output: Path, repeats: int, python: str | None, as_json: bool, port_workers: str | None = None,
                  port_trace: Path | None = None, port_momentum: float = 0.0) -> None:
    import sys

    from dpro.jsonio import write_json
    from dpro.whatif.calibrate_ps import calibrate_ps, measure_port, port_efficiency
    from dpro.whatif.platform import parse_workers

    if repeats < 1:
        raise DproInputError(None, f"--repeats {repeats}: at least 1")
    try:
        ports = parse_workers(port_workers) if port_workers else []
    except ValueError as e:
        raise DproInputError(None, f"--port-{e}") from None
    if not 0.0 <= port_momentum < 1.0:
        raise DproInputError(None, f"--port-momentum {port_momentum}: between 0 and 1")
    sizes, compute_us = None, 0.0
    if port_trace is not None:
        from dpro.job import open_job
        from dpro.whatif.scaleout import ps_compute_us, ps_key_sizes

        job = open_job(port_trace)
        sizes = ps_key_sizes(job) or None
        if sizes is None:
            raise DproInputError(port_trace, "--port-keys-from: the profile pushes no keys (not a PS profile)")
        compute_us = ps_compute_us(job)
    try:
        d = calibrate_ps(python or sys.executable, repeats=repeats)
        rows = [measure_port(python or sys.executable, n, 1, sizes=sizes, compute_us=compute_us, momentum=port_momentum)
                for n in ports]
        for r in rows:
            r["efficiency"] = port_efficiency(r, d["ps"]["alpha_us"], d["ps"]["beta_us_per_byte"])
        if rows:
            d["ps"]["port_efficiency"] = rows
    except (RuntimeError, OSError) as e:
        raise DproInputError(None, str(e)) from None
    write_json(output, d)
    if as_json:
        print_json(d)
        return
    ps = d["ps"]
    click.echo(f"wrote {output}: ps-lite, 1 worker + 1 server: per message alpha {ps['alpha_us']:.1f} us, "
               f"beta {ps['beta_us_per_byte'] * 1e3:.4f} us/KB; CPU worker {ps['worker_cpu_alpha_us']:.1f} us + "
               f"{ps['worker_cpu_beta_us_per_byte'] * 1e3:.4f} us/KB, server {ps['server_cpu_alpha_us']:.1f} us + "
               f"{ps['server_cpu_beta_us_per_byte'] * 1e3:.4f} us/KB")


@cli.group(name="import")
def import_() -> None:
    """Convert traces from other tools into a gTrace directory."""


register_import_commands(import_)


def main() -> None:
    cli(prog_name="dpro")


if __name__ == "__main__":
    main()
