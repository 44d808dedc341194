"""Turn what the ranks recorded (Kineto trace + metadata per rank) into one gTrace."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dpro.contracts.recording import (
    FRAMEWORK_MXNET,
    FRAMEWORK_PYTORCH,
    FRAMEWORK_TENSORFLOW,
    NCCL_DIR,
    LIGHT_SUFFIX,
    NCCL_TRACE_GLOB,
    RANK_PREFIX,
    RANK_META_GLOB,
    RANK_TRACE_GLOB,
    SERVER_GLOB,
    TIMELINE_NAME,
    MetaKey,
    light_trace_name,
    rank_trace_name,
)
from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, NodeTrace, Tensor
from dpro.importers.horovod.atoms import apply_horovod_timeline
from dpro.importers.kineto import import_kineto
from dpro.importers.kineto.shapes import LAYER_SHAPES
from dpro.importers.recording.allocations import attach_allocations
from dpro.importers.recording.shallow import fill_shallow_steps
from dpro.gtrace.validate import MAX_WORLD_SIZE
from dpro.jsonio import read_json, regular_file_problem

if TYPE_CHECKING:
    from dpro.importers.kineto.light import LightMatch

log = logging.getLogger(__name__)


def rank_files(raw: Path) -> list[Path]:
    """The per-rank trace files a recording directory holds."""
    return sorted(p for p in raw.glob(RANK_TRACE_GLOB) if not p.name.startswith("."))


def _copy_regular(src: Path, dst: Path) -> None:
    """Copy a regular file; a FIFO or device (which would block or never end) is an error."""
    if problem := regular_file_problem(src):
        raise DproInputError(src, problem)
    shutil.copy2(src, dst)


def merge_dirs(dirs: list[Path], dest: Path) -> None:
    """Copy the rank files of several hosts' recording directories into ``dest``.

    A Horovod timeline (written on rank 0's host only) comes along.
    """
    seen: dict[str, Path] = {}
    for d in dirs:
        if not d.is_dir():
            raise DproInputError(d, "not a directory")
        files = rank_files(d)
        if not files:
            raise DproInputError(d, f"holds no {RANK_TRACE_GLOB} traces")
        timeline = [d / TIMELINE_NAME] if os.path.lexists(d / TIMELINE_NAME) else []  # (copied only if regular)
        servers = sorted(d.glob(SERVER_GLOB))  # MXNet parameter servers (dpro/profiler/mxnet/server.py)
        light = sorted(d.glob(f"{RANK_PREFIX}*{LIGHT_SUFFIX}"))  # CUDA-light recordings' light steps
        for f in files + sorted(d.glob(RANK_META_GLOB)) + timeline + servers + light:
            if f.name in seen:
                if f.name == TIMELINE_NAME:
                    raise DproInputError(f, f"also in {seen[f.name].parent}: two Horovod timelines (only rank 0 writes one)")
                raise DproInputError(f, f"also in {seen[f.name].parent}: two hosts recorded the same rank or server")
            seen[f.name] = f
            _copy_regular(f, dest / f.name)


def _enrich(nt: NodeTrace, meta: dict) -> None:
    """Host, gradient tensors (with their bucket and producing op) and facts from the recorder."""
    nt.info.host = str(meta.get(MetaKey.HOST) or nt.info.host)
    if not isinstance(meta.get(MetaKey.MEMORY, {}), dict):  # the recorder's memory facts (found by the fuzzer)
        raise TypeError(f"'{MetaKey.MEMORY}' is not an object")
    comm_by_tensor = {op.tensor: op for op in nt.ops.values() if op.cat == "COMM"}
    bucket_of = {name: b["index"] for b in meta.get(MetaKey.BUCKETS, []) for name in b.get("params", [])}
    for b in meta.get(MetaKey.BUCKETS, []):  # sizes the trace lacks (recorded without shapes)
        op = comm_by_tensor.get(f"bucket{b.get('index')}")
        if op is not None and not op.bytes and isinstance(b.get("bytes"), int) and b["bytes"] > 0:
            op.bytes = b["bytes"]
    last_bw: dict[str, str] = {}
    for op in nt.ops.values():  # ops are in device order; keep the last BW op of each layer
        if op.cat == "BW" and op.layer:
            last_bw[op.layer] = op.id
    for p in meta.get(MetaKey.PARAMS, []):
        if not p.get("requires_grad", True):
            continue
        name = str(p["name"])
        layer = name.rsplit(".", 1)[0]
        comm = comm_by_tensor.get(f"bucket{bucket_of[name]}") if name in bucket_of else None
        nt.tensors.append(Tensor(
            name=name,
            bytes=int(p["bytes"]),
            shape=tuple(int(x) for x in p.get("shape", [])),
            dtype=str(p.get("dtype", "float32")),
            producer=last_bw.get(layer),
            txn=comm.txn if comm is not None else None,
        ))
    nt.meta = {k: meta[k] for k in (MetaKey.FRAMEWORK_VERSION, MetaKey.DDP, MetaKey.BUCKETS, MetaKey.STEPS,
                                    MetaKey.MEMORY, MetaKey.COMPILE, MetaKey.STEP_WALL_US, MetaKey.STEP_WALL_AFTER_US,
                                    MetaKey.CPU, MetaKey.CPU_AFTER_US, MetaKey.HOROVOD_WRITER_THREAD,
                                    MetaKey.HOROVOD_SETTINGS) if k in meta} | (
        {LAYER_SHAPES: nt.meta[LAYER_SHAPES]} if LAYER_SHAPES in nt.meta else {})  # from the trace (oracle)


def _light_match(nt: NodeTrace, raw: Path, meta: dict, notes: list[str]) -> LightMatch | None:
    """A CUDA-light recording (``MetaKey.CUDA_LIGHT``): how the node's light trace matches its
    structure step (:func:`dpro.importers.kineto.light.match_light_steps`), or None, with a
    note, where that trace is missing, unreadable or does not match."""
    from dpro.importers.kineto.light import match_light_steps, mismatch_note
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, load_rank_file

    info = meta[MetaKey.CUDA_LIGHT]
    rank = nt.info.rank
    path = raw / light_trace_name(rank)  # never a path from the meta file
    st = info.get("structure_step") if isinstance(info, dict) else None
    numbers = info.get("steps") if isinstance(info, dict) else None
    if not (isinstance(st, int) and isinstance(numbers, list) and numbers
            and all(isinstance(x, int) and not isinstance(x, bool) for x in numbers)):
        notes.append(f"{nt.info.name}: CUDA-light recording: '{MetaKey.CUDA_LIGHT}' in its meta.json is not "
                     f"{{structure_step, steps}}; replaying the structure step alone")
        return None
    if not path.is_file():
        notes.append(f"{nt.info.name}: CUDA-light recording without {path.name}; replaying step {st} alone, with "
                     f"its CPU operators profiled")
        return None
    try:
        struct_rf = load_rank_file(raw / rank_trace_name(rank), DEFAULT_RANK_PATTERN, rank)
        light_rf = load_rank_file(path, DEFAULT_RANK_PATTERN, rank)
    except DproInputError as e:
        notes.append(f"{nt.info.name}: CUDA-light recording: {e}; replaying step {st} alone")
        return None
    try:
        m = match_light_steps(nt, struct_rf, light_rf, st, numbers)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError) as e:  # never a crash
        m = f"{type(e).__name__}: {str(e)[:120]}"
    if isinstance(m, str):
        notes.append(mismatch_note(nt.info.name, path.name, st, m))
        return None
    return m


def _structure_pace(nt: NodeTrace, info: object) -> None:
    """A light rank replaying its structure step: that call's wall is its profiled pace, the
    one the unprofiled correction compares with (:mod:`dpro.graph.overhead`)."""
    st = info.get("structure_step") if isinstance(info, dict) else None
    walls = nt.meta.get(MetaKey.STEP_WALL_US)
    if isinstance(st, int) and isinstance(walls, list) and 0 <= st < len(walls):
        nt.meta[MetaKey.STEP_WALL_US] = walls[:st + 1]


def _light_steps(gt: GTrace, raw: Path, metas: dict[int, dict]) -> None:
    """Time the CUDA-light ranks' steps from their light traces (:mod:`dpro.importers.kineto.light`),
    all of them or none: where one rank's light steps cannot be used, every light rank
    replays its structure step alone (the ranks must share their steps). A rank replaying
    its structure step gets that call's wall as its profiled pace, the one the unprofiled
    correction compares with (:mod:`dpro.graph.overhead`: the window's first call only)."""
    from dpro.importers.kineto.light import apply_light_match

    light = {nt.info.name: nt for nt in gt.nodes.values() if MetaKey.CUDA_LIGHT in metas.get(nt.info.rank, {})}
    if not light:
        return
    matches = {name: _light_match(nt, raw, metas[nt.info.rank], gt.notes) for name, nt in light.items()}
    if all(m is not None for m in matches.values()):
        for name, m in matches.items():
            gt.notes.append(apply_light_match(light[name], m))
    else:
        used = sorted(name for name, m in matches.items() if m is not None)
        if used:
            gt.notes.append(f"{', '.join(used)}: CUDA-light steps match, but replaying the structure step alone like "
                            f"the ranks whose light steps do not, so that every rank replays the same steps")
        for nt in light.values():
            _structure_pace(nt, metas[nt.info.rank][MetaKey.CUDA_LIGHT])
    gt.manifest.steps = sorted(set.intersection(*(set(nt.steps) for nt in gt.nodes.values())))


def _cpu_light_steps(gt: GTrace, raw: Path, metas: dict[int, dict]) -> None:
    """Time the CPU-light ranks' steps from their hooks (:mod:`dpro.importers.kineto.cpu_light`),
    all of them or none, as :func:`_light_steps` does for CUDA-light ranks."""
    from dpro.importers.kineto.cpu_light import apply_cpu_light
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, load_rank_file

    light = [nt for nt in gt.nodes.values() if MetaKey.CPU_LIGHT in metas.get(nt.info.rank, {})]
    if not light:
        return
    done: list[tuple[NodeTrace, dict, list[Event]]] = []
    notes: list[str] = []
    why = None
    for nt in light:
        info = metas[nt.info.rank][MetaKey.CPU_LIGHT]
        saved = (dict(nt.steps), list(nt.events))
        try:
            if not isinstance(info, dict):
                raise ValueError(f"'{MetaKey.CPU_LIGHT}' in its meta.json is not an object")
            rf = load_rank_file(raw / rank_trace_name(nt.info.rank), DEFAULT_RANK_PATTERN, nt.info.rank)
            note = apply_cpu_light(nt, rf, info)
        except (DproInputError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError) as e:
            why = f"{nt.info.name}: CPU-light recording not used ({str(e)[:160]})"
            break
        done.append((nt, *saved))
        notes.append(note)
    if why is None:
        gt.notes += notes
    else:  # every rank back to its structure step: the ranks must share their steps
        for nt, steps, events in done:
            nt.steps, nt.events = steps, events
        gt.notes.append(f"{why}; every rank replays the window's first step alone, recorded by torch.profiler")
        for nt in light:
            _structure_pace(nt, metas[nt.info.rank][MetaKey.CPU_LIGHT])
    gt.manifest.steps = sorted(set.intersection(*(set(nt.steps) for nt in gt.nodes.values())))


def _apply_nccl_chunks(gt: GTrace, raw: Path, nccl: Path) -> GTrace:
    """Replace coarse NCCL collectives by the per-chunk SEND/RECV the plugin measured."""
    from dpro.importers.nccl import kineto_time_offsets, replace_collectives

    with tempfile.TemporaryDirectory(prefix="dpro-nccl-") as tmp:
        for f in rank_files(raw):
            _copy_regular(f, Path(tmp) / f.name)
        offsets = kineto_time_offsets(Path(tmp))
    try:
        res = replace_collectives(gt, nccl, time_offset_us=offsets or None)
    except DproInputError as e:
        gt.notes.append(f"NCCL plugin output not used ({e}): collectives use the ring model")
        return gt
    res.gtrace.notes += res.notes
    return res.gtrace


def recorded_framework(raw: Path) -> str:
    """The framework the ranks of a recording directory recorded (their ``meta.json``)."""
    for f in sorted(raw.glob(RANK_META_GLOB)):
        m = read_json(f)
        if isinstance(m, dict) and isinstance(m.get(MetaKey.FRAMEWORK), str):
            return m[MetaKey.FRAMEWORK]
    return FRAMEWORK_PYTORCH



def _name_source(gt: GTrace, source: str) -> GTrace:
    """Name the user's directories, not the temporary copies the importers read, as the source."""
    gt.source = source
    meta = gt.manifest.meta if isinstance(gt.manifest.meta, dict) else {}
    meta["source"] = source
    meta.pop("files", None)  # paths of the temporary copies
    gt.manifest.meta = meta
    return gt

def collect(raw: Path, *, progress: bool | None = None, source: str | None = None) -> GTrace:
    """Import a recording directory as a GTrace (dispatching on the recorded framework).

    PyTorch ranks write ``rank<r>.json.gz`` (Kineto) + ``rank<r>.meta.json``; other
    frameworks have their own collector module. ``source`` is what the trace names as where
    it came from (default: ``raw``), for a caller that merged the user's directories first.
    """
    return _name_source(_collect(raw, progress), source or str(raw))


def _collect(raw: Path, progress: bool | None) -> GTrace:
    framework = recorded_framework(raw)
    if framework == FRAMEWORK_TENSORFLOW:
        from dpro.importers.tensorflow.convert import collect_tf

        return collect_tf(raw, progress=progress)
    if framework == FRAMEWORK_MXNET:
        from dpro.importers.mxnet.convert import collect_mxnet

        return collect_mxnet(raw, progress=progress)
    if not rank_files(raw):
        raise DproInputError(raw, f"no rank traces were recorded ({RANK_TRACE_GLOB})")
    with tempfile.TemporaryDirectory(prefix="dpro-collect-") as tmp:
        for f in rank_files(raw):
            _copy_regular(f, Path(tmp) / f.name)  # only the traces: the importer reads every *.json*
        gt = import_kineto(Path(tmp), progress=progress)
    metas, meta_files = {}, {}
    for f in sorted(raw.glob(RANK_META_GLOB)):
        m = read_json(f)
        if isinstance(m, dict) and isinstance(m.get(MetaKey.RANK), int):
            metas[m[MetaKey.RANK]] = m
            meta_files[m[MetaKey.RANK]] = f
    for nt in gt.nodes.values():
        if nt.info.rank in metas:
            m, f = metas[nt.info.rank], meta_files[nt.info.rank]
            try:
                _enrich(nt, m)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
                raise DproInputError(f, f"unexpected rank meta data ({type(e).__name__}: {str(e)[:120]})") from None
        if (raw / rank_trace_name(nt.info.rank)).is_file():  # allocations -> ops (docs/memory.md)
            attach_allocations(nt, raw / rank_trace_name(nt.info.rank))
    _light_steps(gt, raw, metas)  # CUDA-light ranks: their light steps replace the structure step
    _cpu_light_steps(gt, raw, metas)  # CPU-light ranks: likewise, timed by their hooks
    # shallow ranks (DPRO_SHALLOW_RANKS): their later steps are rank 0's
    if (unfilled := fill_shallow_steps(gt, metas)) and not gt.manifest.steps:
        raise DproInputError(raw, f"{unfilled[0]}; no step is left that every rank recorded: profile again "
                                  f"with DPRO_SHALLOW_RANKS=0")
    if metas:
        any_meta = next(iter(metas.values()))
        gt.manifest.library = str(any_meta.get(MetaKey.LIBRARY) or gt.manifest.library)
        ws = any_meta.get(MetaKey.WORLD_SIZE) or 0
        if not isinstance(ws, int) or isinstance(ws, bool) or not 0 <= ws <= MAX_WORLD_SIZE:
            raise DproInputError(meta_files[next(iter(metas))], f"world_size {str(ws)[:30]} is out of range (1 to {MAX_WORLD_SIZE})")
        gt.manifest.world_size = max(gt.manifest.world_size, ws)
    if os.path.lexists(raw / TIMELINE_NAME):  # a Horovod job: its collectives are in rank 0's timeline
        if problem := regular_file_problem(raw / TIMELINE_NAME):  # said, never skipped silently
            raise DproInputError(raw / TIMELINE_NAME, problem)
        apply_horovod_timeline(gt, raw / TIMELINE_NAME, raw, metas)
    nccl = raw / NCCL_DIR
    if nccl.is_dir() and any(nccl.glob(NCCL_TRACE_GLOB)):  # dpro's NCCL plugin was loaded
        gt = _apply_nccl_chunks(gt, raw, nccl)
    gt.manifest.meta["recorder"] = "dpro"
    gt.manifest.meta.pop("files", None)
    present = {nt.info.rank for nt in gt.nodes.values()}
    missing = [r for r in range(min(gt.manifest.world_size, MAX_WORLD_SIZE)) if r not in present]
    if missing:
        gt.notes.append(f"ranks {missing} recorded nothing (crashed, or never reached the profiling window)")
    return gt
