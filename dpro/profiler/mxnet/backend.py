"""MXNet 1.x (Gluon) recording of a worker via ``mx.profiler``.

:class:`MXNetBackend`, chosen by ``dpro.Recorder`` for a Gluon block, records:

* op times from ``mx.profiler`` (Chrome JSON, absolute µs on the epoch clock). The window
  runs the job as the user does, with MXNet's operator bulking: a bulked segment of the
  cached graph is one ``ImperativeBulk`` event, and a worker's pushes leave when its
  segment ends, as unprofiled. With ``DPRO_MXNET_UNBULK=1`` (``dpro profile
  --mxnet-unbulk``) the recorder re-hybridizes the block with ``forward_bulk_size=0,
  backward_bulk_size=0`` when the window starts, so every op is its own event (per-op
  detail: layers, op classes), and gives the user's flags back after it;
* the hybridized symbol (``tojson()`` of the block's cached graph) for layer names and
  which backward op produces which parameter's gradient;
* the kvstore keys: ``KVStore.push/pull/pushpull`` are wrapped while the window runs, to
  learn every key's parameter name, shape and bytes (the wrapper only records, then calls
  the original);
* step markers (wall clock, the same epoch µs clock), with ``mx.nd.waitall()`` at the end
  of every profiled step so that a step's asynchronous work stays inside its marker;
* memory (:mod:`dpro.profiler.mxnet.memory`): the profiler also runs with
  ``profile_memory=True`` (the CPU storage counter), the ``gluon.Trainer`` objects that step
  in the window are noted, and the static arrays (parameters, gradients, worker-side
  optimizer state, BatchNorm statistics) go to ``rank<r>.meta.json["memory"]``.

The parameter servers are recorded by :mod:`dpro.profiler.mxnet.server`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.contracts.recording import (
    ENV_MXNET_UNBULK,
    FRAMEWORK_MXNET,
    MetaKey,
    env_flag,
    rank_meta_name,
    rank_trace_name,
)
from dpro.profiler.config import RecordConfig
from dpro.profiler.mxnet.memory import TrainerWatch, static_facts

log = logging.getLogger(__name__)

DEFAULT_BIGARRAY_BOUND = 1_000_000


def now_us() -> float:
    """Epoch µs: the clock mx.profiler stamps its events with."""
    return time.time_ns() / 1000.0


@dataclass
class _KeyInfo:
    key: int
    name: str
    bytes: int
    shape: list[int]
    dtype: str
    calls: list[str] = field(default_factory=list)


class MXNetBackend:
    """Records a window of steps of a Gluon training job on one worker."""

    def __init__(self, model: Any, config: RecordConfig) -> None:
        import mxnet as mx

        if not isinstance(model, mx.gluon.Block):
            raise TypeError(f"dpro.Recorder: expected an mxnet.gluon.Block, got {type(model).__name__}")
        self.mx = mx
        self.model = model
        self.config = config
        self.steps: list[tuple[int, float, float]] = []
        self.keys: dict[int, _KeyInfo] = {}
        self._kv: Any = None
        self._orig: dict[str, Any] = {}
        self._tmp: Path | None = None
        #: where this rank's meta.json went (the recorder adds the steps after the window)
        self.meta_path: Path | None = None
        #: the block's hybridize flags while the window runs unbulked (restored after it)
        self._user_flags: dict | None = None
        #: how the window runs the job differently from the user's steps (meta ``window_changes_job``)
        self.window_change: str | None = None
        self._trainers = TrainerWatch()
        self._pre_static = 0
        self._counting_early = False
        self._count_memory()

    def _count_memory(self) -> None:
        """Start MXNet's storage counter now (profiler on, memory only), before the first
        forward: the warm-up's lasting allocations (deferred parameters, the engine's
        temporary workspace, kvstore buffers) are then counted too (:mod:`dpro.importers.mxnet.memory`)."""
        mx = self.mx
        try:
            self._pre_static = int(static_facts(self.model, [])["static_bytes"])
            self.config.out_dir.mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=".mxprof-", dir=self.config.out_dir))
            mx.profiler.set_config(profile_symbolic=False, profile_imperative=False, profile_memory=True,
                                   profile_api=False, aggregate_stats=False,
                                   filename=str(self._tmp / "profile.json"))
            mx.profiler.set_state("run")
            self._counting_early = True
        except Exception as e:  # noqa: BLE001 - recording must not break training
            log.warning("dpro: cannot start MXNet's storage counter early: %s", e)

    def _unbulk(self) -> None:
        """With ``DPRO_MXNET_UNBULK=1`` (``dpro profile --mxnet-unbulk``): re-hybridize with
        operator bulking off (keeping the user's flags), so each op of the cached graph is
        its own profiler event.  Done when the window starts, not before: the warm-up runs
        bulked, at the unprofiled pace the overhead is measured against
        (dpro.graph.overhead); the window's first step rebuilds the graph.

        By default the window keeps bulking: it runs the job as the user does (its pushes
        leave when a bulked segment ends; overhead ~1 % where unbulking cost 2.5-4 %,
        docs/fidelity.md), and a bulked segment is one op."""
        if not env_flag(ENV_MXNET_UNBULK):
            return
        model = self.model
        if isinstance(model, self.mx.gluon.HybridBlock) and getattr(model, "_active", False):
            self._user_flags = dict(getattr(model, "_flags", []))
            model.hybridize(True, **{**self._user_flags, "forward_bulk_size": 0, "backward_bulk_size": 0})
            self.window_change = "MXNet operator bulking off in the window"

    def _rebulk(self) -> None:
        """Give the block back the user's hybridize flags once the window is over (the
        steps after it run at the unprofiled pace again; the next step rebuilds the graph)."""
        if self._user_flags is not None:
            flags, self._user_flags = self._user_flags, None
            try:
                self.model.hybridize(True, **flags)
            except Exception as e:  # noqa: BLE001 - recording must not break training
                log.warning("dpro: could not restore the block's hybridize flags: %s", e)

    # -- kvstore hook -------------------------------------------------------------------
    def _param_by_handle(self) -> dict[int, Any]:
        out = {}
        for p in self.model.collect_params().values():
            try:
                for g in p.list_grad():
                    out[g.handle.value] = p
                for d in p.list_data():
                    out.setdefault(d.handle.value, p)
            except Exception:  # noqa: BLE001 - e.g. grad_req 'null' or deferred init
                continue
        return out

    def _note(self, kind: str, kv: Any, key: Any, value: Any) -> None:
        self._kv = kv
        keys = key if isinstance(key, (list, tuple)) else [key]
        vals = value if isinstance(value, (list, tuple)) else [value]
        if len(keys) > 1 and len(vals) == len(keys):
            pairs = list(zip(keys, vals))
        else:
            pairs = [(keys[0], vals)]
        by_handle = None
        for k, v in pairs:
            if not isinstance(k, int):
                continue
            arr = v[0] if isinstance(v, (list, tuple)) else v
            info = self.keys.get(k)
            if info is None:
                by_handle = by_handle or self._param_by_handle()
                p = by_handle.get(arr.handle.value)
                nbytes = int(arr.size) * itemsize(arr.dtype)
                info = self.keys[k] = _KeyInfo(k, p.name if p is not None else f"key{k}", nbytes,
                                               [int(x) for x in arr.shape], str(_dtype_name(arr.dtype)))
            if kind not in info.calls:
                info.calls.append(kind)

    def _hook(self) -> None:
        KV = self.mx.kvstore.KVStore
        backend = self
        for meth in ("push", "pull", "pushpull"):
            orig = getattr(KV, meth)
            self._orig[meth] = orig

            def wrapped(kv: Any, key: Any, *args: Any, _orig: Any = orig, _m: str = meth, **kwargs: Any) -> Any:
                try:
                    val = args[0] if args else kwargs.get("value", kwargs.get("out"))
                    if val is not None:
                        backend._note(_m, kv, key, val)
                except Exception as e:  # noqa: BLE001 - recording must not break training
                    log.debug("dpro: kvstore hook: %s", e)
                return _orig(kv, key, *args, **kwargs)

            setattr(KV, meth, wrapped)

    def _unhook(self) -> None:
        KV = self.mx.kvstore.KVStore
        for meth, orig in self._orig.items():
            setattr(KV, meth, orig)
        self._orig.clear()

    # -- Backend protocol ---------------------------------------------------------------
    def start(self) -> None:
        """Turn MXNet's profiler on for the window (op bulking off only when asked)."""
        mx = self.mx
        self.config.out_dir.mkdir(parents=True, exist_ok=True)
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=".mxprof-", dir=self.config.out_dir))
        mx.nd.waitall()
        self._unbulk()
        self._hook()
        self._trainers.start()
        mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, profile_memory=True,
                               profile_api=False, aggregate_stats=False,
                               filename=str(self._tmp / "profile.json"))
        mx.profiler.set_state("run")

    def step_begin(self, step: int) -> object:
        return now_us()

    def step_end(self, step: int, token: object) -> None:
        self.mx.nd.waitall()
        t0 = float(token)  # type: ignore[arg-type]
        self.steps.append((step, t0, now_us() - t0))

    def abort(self) -> None:
        self._unhook()
        self._trainers.stop()
        self._rebulk()
        try:
            self.mx.profiler.set_state("stop")
        except Exception:  # noqa: BLE001
            pass

    def _symbol_json(self) -> dict | None:
        cg = getattr(self.model, "_cached_graph", None)
        if cg and len(cg) == 2:
            try:
                return json.loads(cg[1].tojson())
            except Exception as e:  # noqa: BLE001
                log.warning("dpro: cannot read the hybridized graph: %s", e)
        else:
            log.warning("dpro: the model is not hybridized: no symbol (layers come from op order only)")
        return None

    def _memory_facts(self) -> dict | None:
        try:
            facts = static_facts(self.model, self._trainers.trainers)
            facts["counter_started"] = "recorder" if self._counting_early else "window"
            facts["static_before_counter"] = self._pre_static
            return facts
        except Exception as e:  # noqa: BLE001 - recording must not break training
            log.warning("dpro: cannot read the static arrays for memory estimation: %s", e)
            return None

    def stop_and_write(self) -> None:
        """Stop the profiler and write this rank's raw files (profile, meta, memory)."""
        mx = self.mx
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        self._unhook()
        self._trainers.stop()
        assert self._tmp is not None
        mx.profiler.dump(finished=True)
        prof = self._tmp / "profile.json"
        kv = self._kv
        rank = int(kv.rank) if kv is not None else int(os.environ.get("DMLC_WORKER_ID", 0))
        out = self.config.out_dir
        with open(prof, "rb") as f, gzip.open(out / rank_trace_name(rank), "wb") as g:
            g.write(_with_header(f.read()))
        prof.unlink()
        self._tmp.rmdir()
        meta = {
            MetaKey.FRAMEWORK: FRAMEWORK_MXNET,
            MetaKey.FRAMEWORK_VERSION: mx.__version__,
            MetaKey.RANK: rank,
            MetaKey.WORLD_SIZE: int(kv.num_workers) if kv is not None else 1,
            MetaKey.KVSTORE: str(kv.type) if kv is not None else None,
            MetaKey.NUM_SERVERS: int(os.environ.get("DMLC_NUM_SERVER", "0")),
            MetaKey.BIGARRAY_BOUND: int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", DEFAULT_BIGARRAY_BOUND)),
            MetaKey.HOST: self.config.host,
            MetaKey.PID: os.getpid(),
            MetaKey.STEPS: [{"step": s, "ts": t, "dur": d} for s, t, d in self.steps],
            MetaKey.KEYS: [vars(k) for k in sorted(self.keys.values(), key=lambda k: k.key)],
            MetaKey.PARAMS: [p.name for p in self.model.collect_params().values()],
            MetaKey.SYMBOL: self._symbol_json(),
            MetaKey.MEMORY: self._memory_facts(),
            # the recorder's wall time of every step call, warm-up included (dpro.graph.overhead)
            MetaKey.STEP_WALL_US: list(getattr(self, "step_wall_us", [])),
            # how the window ran the job differently (the overhead then counts both ways)
            MetaKey.WINDOW_CHANGES_JOB: self.window_change,
        }
        self.meta_path = out / rank_meta_name(rank)
        self.meta_path.write_text(json.dumps(meta))
        log.info("dpro: wrote rank %d's MXNet trace to %s", rank, out)
        self._rebulk()


def _with_header(doc: bytes) -> bytes:
    """mx.profiler's dump writes the ``{"traceEvents": [`` header on its first dump only
    (``profile_dump_count_``); in some of our 4-worker runs the one dump we ask for came out
    without it (starting with the ``,`` between events). Put the header back."""
    head = doc.lstrip()
    if head.startswith(b","):
        log.warning("dpro: mx.profiler's dump had no header; added it")
        return b'{\n    "traceEvents": [\n' + head[1:]
    return doc


def itemsize(dtype: Any) -> int:
    """Bytes per element of a NumPy / MXNet dtype."""
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def _dtype_name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name
