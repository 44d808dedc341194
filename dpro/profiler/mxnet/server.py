"""MXNet parameter-server nodes under `dpro profile`: each server's update times.

:func:`run_ps_node` is what ``examples/mxnet/launch_local.py`` runs for the scheduler and
the servers: MXNet's own server loop, with the optimizer's updater wrapped. In ``dist_sync``
with the update on the kvstore (Gluon's default for ``dist_*``), the server calls the
updater for a key once every worker's push of it arrived; the wrapper
(:class:`ServerRecorder`) times it (call, merged gradient ready, new weights ready), per key
and per call. The server writes ``server<i>.kv.json`` into ``DPRO_TRACE_DIR`` when it exits.
The workers are recorded by :mod:`dpro.profiler.mxnet.backend`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.contracts.recording import (
    ENV_DISABLE,
    ENV_HOST,
    ENV_STEPS,
    ENV_TRACE_DIR,
    ENV_WARMUP,
    FRAMEWORK_MXNET,
    ServerKey,
    env_flag,
    server_file_name,
)
from dpro.profiler.mxnet.backend import itemsize, now_us

log = logging.getLogger(__name__)


@dataclass
class ServerRecorder:
    """Times every updater call of one PS server (all calls; the collector picks steps)."""

    out_dir: Path | None
    calls: dict[int, int] = field(default_factory=dict)
    records: list[list[float]] = field(default_factory=list)
    rank: int = -1

    def wrap(self, updater: Any) -> Any:
        """``updater`` timed: each call's wait for the merged gradient, the update, its bytes."""
        def timed(key: int, merged: Any, stored: Any) -> None:
            t0 = now_us()
            merged.wait_to_read()
            t1 = now_us()
            updater(key, merged, stored)
            stored.wait_to_read()
            t2 = now_us()
            i = self.calls.get(key, 0)
            self.calls[key] = i + 1
            self.records.append([int(key), i, t0, t1, t2, int(stored.size) * itemsize(stored.dtype)])

        return timed

    def write(self, rank: int, num_workers: int) -> None:
        """Write this server's timed updates (``server<rank>.kv.json``) to the trace directory."""
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            ServerKey.FRAMEWORK: FRAMEWORK_MXNET, ServerKey.ROLE: "server", ServerKey.RANK: rank,
            ServerKey.NUM_WORKERS: num_workers,
            ServerKey.HOST: os.environ.get(ENV_HOST) or socket.gethostname(), ServerKey.PID: os.getpid(),
            ServerKey.WARMUP: int(os.environ.get(ENV_WARMUP, 0) or 0),
            ServerKey.STEPS: int(os.environ.get(ENV_STEPS, 0) or 0),
            ServerKey.COLUMNS: ["key", "call", "ts_call", "ts_merged", "ts_end", "bytes"],
            ServerKey.UPDATES: self.records,
        }
        (self.out_dir / server_file_name(rank)).write_text(json.dumps(doc))


def run_ps_node() -> None:
    """Run this process as the PS scheduler or server (``DMLC_ROLE``), with update timing.

    ``import mxnet`` on a server/scheduler normally runs MXNet's server loop right away;
    here the role is hidden during the import and MXNet's own server loop and controller
    run, with the updater they install wrapped for timing. dpro does not decode the
    controller's commands itself (the optimizer arrives in MXNet's own encoding).
    """
    role = os.environ.get("DMLC_ROLE", "")
    if role not in ("server", "scheduler"):
        raise SystemExit(f"run_ps_node: DMLC_ROLE must be server or scheduler, not {role!r}")
    os.environ["DMLC_ROLE"] = "worker"
    try:
        import mxnet as mx
        from mxnet.kvstore.kvstore_server import KVStoreServer
    finally:
        os.environ["DMLC_ROLE"] = role
    enabled = bool(os.environ.get(ENV_TRACE_DIR)) and not env_flag(ENV_DISABLE)
    rec = ServerRecorder(Path(os.environ[ENV_TRACE_DIR]) if enabled else None)
    kv = mx.kv.create("dist")

    class _Server(KVStoreServer):
        """MXNet's server: its controller sets the updater; each one it sets is timed."""

        def __init__(self, kvstore: Any) -> None:
            super().__init__(kvstore)
            self.init_logginig = True  # (sic, MXNet's name) keep MXNet from making the root logger DEBUG
            set_updater = kvstore._set_updater
            kvstore._set_updater = lambda updater: set_updater(rec.wrap(updater))

        def _controller(self):  # type: ignore[no-untyped-def]
            mxnet_ctl = super()._controller()

            def ctl(cmd_id: int, cmd_body: bytes, arg: Any) -> None:
                if cmd_id == 0:  # the optimizer (kController): its updater is about to be set
                    rec.rank = int(self.kvstore.rank)  # only while the server runs
                mxnet_ctl(cmd_id, cmd_body, arg)
            return ctl

    _Server(kv).run()
    if role == "server" and enabled:
        if rec.rank < 0:
            log.warning("dpro: this server never received an optimizer (update_on_kvstore off?): no server timing")
            return
        rec.write(rec.rank, int(os.environ.get("DMLC_NUM_WORKER", "0")))
