"""What `dpro optimize -o DIR` writes: a summary for people, strategy files for libraries.

``DIR/summary.txt``      the summary `dpro optimize` prints
``DIR/strategy.json``    everything (the `--json` output)
``DIR/ddp.json``         PyTorch DDP: ``bucket_cap_mb`` (+ the buckets it gives), or ``keep_default``
``DIR/horovod.json``     Horovod: explicit ``groups`` of parameter names, fusion threshold, cycle time, or ``keep_default``
``DIR/horovod.env``      the same as environment variables
``DIR/mxnet.json``       MXNet kvstore (parameter-server jobs): ``MXNET_KVSTORE_BIGARRAY_BOUND``, the keys it splits
``DIR/mxnet.env``        the same as an environment variable
``DIR/compile.json``     op fusion: the fused ops and the layers to compile (torch.compile), or XLA (TensorFlow)
``DIR/memory.json``      memory: modules to checkpoint, micro-batches per step, predicted peak
``DIR/amp.json``         mixed precision: run forward and loss under autocast (when chosen)

The names and the keys a training script reads: :mod:`dpro.contracts.strategy_files`; how to
apply each: docs/optimizer.md.
"""

from __future__ import annotations

from pathlib import Path

from dpro.contracts import strategy_files as sf
from dpro.jsonio import check_writable_dir, dump_json, write_dir_atomically
from dpro.optimizer.memory.fit import fmt_bytes
from dpro.optimizer.optimize import MIN_GAIN, OptimizeResult


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:.2f} ms"


def summary_text(res: OptimizeResult, top: int = 8) -> str:
    """The summary `dpro optimize` prints: times, baselines, changes, how to apply them, notes."""
    b = res.best
    lines = [
        f"job as profiled: {_ms(res.baseline_us)} predicted (full replay {_ms(res.replay_us)}, measured {_ms(res.measured_us)})",
        f"best found:      {_ms(b.iteration_us)} predicted, {res.baseline_us / b.iteration_us:.3f}x "
        f"({100 * (1 - b.iteration_us / res.baseline_us):.1f}% less), search from {b.start}, "
        f"{sum(r.evaluations for r in res.results)} replays in {res.time_s:.1f} s"
        + ("" if b.converged else " (budget spent before convergence)"),
        "",
        "baselines (predicted):",
    ]
    for name, t in sorted(res.baselines.items(), key=lambda kv: kv[1]):
        lines.append(f"  {name:<40} {_ms(t):>12}  {res.baseline_us / t:.3f}x")
    lines += _memory_lines(res)
    lines += ["", f"changes ({len(b.steps)}, largest first):"]
    for s in sorted(b.steps, key=lambda s: s.after_us - s.before_us)[:top]:
        lines.append(f"  [{s.pass_name}] -{(s.before_us - s.after_us) / 1e3:.2f} ms: {s.reason}")
    if len(b.steps) > top:
        lines.append(f"  ... and {len(b.steps) - top} smaller ({sf.STRATEGY_JSON} lists all)")
    st = b.strategy
    lines += ["", f"synchronisation groups ({len(st.groups)}):"]
    for i, g in enumerate(st.groups):
        names = [res.model.units[u].name for u in g]
        shown = ", ".join(names[:4]) + (f", ... (+{len(names) - 4})" if len(names) > 4 else "")
        lines.append(f"  {i}: {st.group_bytes(res.model, i)} B in {st.partitions[i]} piece(s): {shown}")
    if st.fusions:
        lines.append(f"fused op chains: {len(st.fusions)}")
    lines += ["", "apply it:"]
    for r in res.realized:
        if r.library in ("pytorch-ddp", "horovod") and r.settings.get(sf.KEEP_DEFAULT):
            what = "DDP's default buckets" if r.library == "pytorch-ddp" else "Horovod's default fusion"
            why = (f"nothing predicted {100 * MIN_GAIN:g} % faster" if r.library == "pytorch-ddp"
                   or res.best.iteration_us >= r.iteration_us * (1 - MIN_GAIN) else
                   "the faster grouping found sends more collectives, whose cost the profile cannot show: see the notes")
            lines.append(f"  {'PyTorch DDP' if r.library == 'pytorch-ddp' else 'Horovod'}: keep {what} ({why})"
                         f"  -> {_ms(r.iteration_us)} predicted")
        elif r.library == "pytorch-ddp":
            lines.append(f"  PyTorch DDP: DistributedDataParallel(..., bucket_cap_mb={r.settings[sf.BUCKET_CAP_MB]:.4g})"
                         f"  -> {_ms(r.iteration_us)} predicted ({sf.DDP_JSON})")
        elif r.library == "horovod":
            lines.append(f"  Horovod: hvd.DistributedOptimizer(..., groups=<{sf.HOROVOD_JSON} {sf.GROUPS}>), "
                         f"{sf.HOROVOD_FUSION_THRESHOLD}={r.settings[sf.HOROVOD_FUSION_THRESHOLD]}  "
                         f"-> {_ms(r.iteration_us)} predicted")
        elif r.library == "mxnet-kvstore":
            keep = " (keep MXNet's default)" if r.settings.get(sf.KEEP_DEFAULT) else ""
            lines.append(f"  MXNet kvstore: {sf.MXNET_KVSTORE_BIGARRAY_BOUND}={r.settings[sf.MXNET_KVSTORE_BIGARRAY_BOUND]}{keep} "
                         f"on every worker  -> {_ms(r.iteration_us)} predicted ({sf.MXNET_ENV})")
    xla = _xla(res) if st.fusions else None
    if xla:
        lines.append("  op fusion: XLA, the gradient computation under tf.function(jit_compile=True) "
                     f"({sf.COMPILE_JSON}; priced by the recorder's XLA time, {xla:.3f}x its graph's)")
    elif st.fusions:
        modules, measured = _compile_plan(res)
        names = ", ".join(repr(x) if x else "the whole model" for x in modules)
        lines.append(f"  op fusion: torch.compile {names} ({sf.COMPILE_JSON}; "
                     f"{'priced by torch.compile' if measured else 'an estimate'})")
        if not measured:
            lines.append("    price it for real with `dpro profile --measure-compile`; a compiled backward also changes "
                         f"the order gradients become ready in, so DDP's buckets can differ from {sf.DDP_JSON}'s list")
    if st.recompute:
        lines.append(f"  recomputation: torch.utils.checkpoint on {', '.join(st.recompute)} ({sf.MEMORY_JSON})")
    if _amp(res):
        lines.append(f"  mixed precision: forward and loss under torch.autocast(device, dtype=torch.bfloat16) ({sf.AMP_JSON})")
    if st.accum > 1:
        lines.append(f"  gradient accumulation: {st.accum} micro-batches per step, DDP no_sync() on the first "
                     f"{st.accum - 1} (the batch must divide by {st.accum}; {sf.MEMORY_JSON})")
    for label, rows in (("critical path before", res.critical_before), ("critical path after", res.critical_after)):
        lines += ["", f"{label} (longest {min(top, len(rows))}):"]
        for r in rows[:top]:
            lines.append(f"  {r['dur_us'] / 1e3:9.3f} ms  {r['name'][:90]}")
    if res.notes:
        lines += [""] + [f"note: {n}" for n in res.notes]
    return "\n".join(lines) + "\n"


def _amp(res: OptimizeResult) -> bool:
    return any(s.pass_name == "mixed_precision" for s in res.best.steps)


def _memory_lines(res: OptimizeResult) -> list[str]:
    if res.peak_before_bytes is None:
        return []
    out = ["", f"predicted peak memory (one worker): {fmt_bytes(res.peak_before_bytes)} as profiled, "
               f"{fmt_bytes(res.peak_after_bytes or 0)} with the best strategy"]
    fit = res.memory
    if fit is not None:
        if fit.chosen is fit.before:
            out.append(f"  fits the budget of {fmt_bytes(fit.budget_bytes)} as profiled: no memory change")
        else:
            c = fit.chosen
            out.append(f"  budget {fmt_bytes(fit.budget_bytes)}: {'; '.join(c.changes)} -> peak {fmt_bytes(c.peak_bytes)}, "
                       f"{_ms(c.iteration_us)} ({len(fit.tried)} combinations of the memory passes replayed)")
    return out


def strategy_files(res: OptimizeResult) -> dict[str, object]:
    """File name -> JSON object or text."""
    files: dict[str, object] = {sf.STRATEGY_JSON: res.to_json(), sf.SUMMARY_TXT: summary_text(res)}
    for r in res.realized:
        if r.library == "pytorch-ddp":
            files[sf.DDP_JSON] = {**r.settings, sf.PREDICTED_ITERATION_US: r.iteration_us}
        elif r.library == "horovod":
            files[sf.HOROVOD_JSON] = {**r.settings, sf.PREDICTED_ITERATION_US: r.iteration_us}
            files[sf.HOROVOD_ENV] = sf.env_lines(r.settings, sf.HOROVOD_ENV_VARS)
        elif r.library == "mxnet-kvstore":
            files[sf.MXNET_JSON] = {**r.settings, sf.PREDICTED_ITERATION_US: r.iteration_us}
            files[sf.MXNET_ENV] = sf.env_lines(r.settings, sf.MXNET_ENV_VARS)
    st = res.best.strategy
    if res.memory is not None or st.recompute or st.accum > 1:
        files[sf.MEMORY_JSON] = {
            sf.CHECKPOINT_MODULES: list(st.recompute), sf.ACCUMULATION_STEPS: st.accum,
            "predicted_peak_bytes": res.peak_after_bytes, "peak_as_profiled_bytes": res.peak_before_bytes,
            "budget_bytes": res.memory.budget_bytes if res.memory is not None else None,
            sf.PREDICTED_ITERATION_US: res.best.iteration_us,
        }
    if _amp(res):
        files[sf.AMP_JSON] = {sf.AUTOCAST: True, "dtype": "bfloat16", "ops": len(st.scales),
                              sf.PREDICTED_ITERATION_US: res.best.iteration_us}
    xla = _xla(res) if st.fusions else None
    if xla:
        files[sf.COMPILE_JSON] = {
            "framework": "tensorflow", sf.XLA_JIT_COMPILE: True, "ops": len(st.fusions[0].ops),
            "priced_by": "measured (XLA)", "xla_over_graph": xla,
            sf.PREDICTED_ITERATION_US: res.best.iteration_us,
        }
    elif st.fusions:
        m = res.model
        modules, measured = _compile_plan(res)
        files[sf.COMPILE_JSON] = {
            "op_fusion": [{"ops": list(f.ops), "layers": sorted({m.ops[o].layer for o in f.ops if m.ops[o].layer}),
                           "dur_us": f.dur} for f in st.fusions],
            sf.TORCH_COMPILE_MODULES: modules,
            "priced_by": "measured (torch.compile)" if measured else "estimate (host gaps removed)",
        }
    return files


def _xla(res: OptimizeResult) -> float | None:
    """XLA / graph time when the best strategy compiles a TF job with XLA, else None."""
    from dpro.optimizer.xla import xla_fusion, xla_ratio

    return xla_ratio(res.model) if xla_fusion(res.model, res.best.strategy) else None


def _compile_plan(res: OptimizeResult) -> tuple[list[str], bool]:
    """The modules to compile for the best strategy's op fusions, and whether every fusion
    was priced by measurement: the measured modules they were priced by (``""``: the whole
    model), else the smallest module around each fusion."""
    from dpro.optimizer.passes.op_fusion import enclosing_module, measured_module, outermost

    m, fusions = res.model, res.best.strategy.fusions
    measured = {measured_module(m, f.ops) for f in fusions}
    if None not in measured:
        return outermost({x for x in measured if x is not None}), True
    return outermost({enclosing_module(m, f.ops) for f in fusions}), False


def write_strategy_dir(res: OptimizeResult, root: Path, *, force: bool = False) -> None:
    """Write :func:`strategy_files` into ``root`` at once (``force``: replace what it holds)."""
    root = Path(root)
    check_writable_dir(root, force)
    files = strategy_files(res)

    def fill(tmp: Path) -> None:
        for name, content in files.items():
            if isinstance(content, str):
                (tmp / name).write_text(content)
            else:
                dump_json(tmp / name, content, gz=False)

    write_dir_atomically(root, fill)
