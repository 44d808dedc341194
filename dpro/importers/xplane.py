"""TensorFlow profiler output (``*.xplane.pb``, an ``XSpace`` protobuf) -> host events.

``tf.profiler.experimental`` writes one ``XSpace`` per host and session. What we read (TF
2.x, checked on 2.21):

* plane ``/host:CPU``: one *line* per thread (``python``, ``tf_Compute/<id>``,
  ``tf_inter_op/...``); each event is ``XLine.timestamp_ns + offset_ps / 1000`` ns and
  names its metadata. Executor ops are named ``<node name>:<op type>`` (the graph node's
  name, its type in ``display_name``); ``TraceMe`` annotations (``tf.profiler.experimental
  .Trace``) keep their name and carry their keyword arguments as stats (``step_num``...).
* plane ``Task Environment``: stat ``profile_start_time`` (Unix-epoch ns). TF normalises
  host timestamps to the session's start, so an event's Unix-epoch time is
  ``profile_start_time + line.timestamp_ns + offset_ps / 1000`` ns. If that stat is
  missing the timestamps are taken as absolute already (older TF versions).

The protobuf classes come from TensorFlow (``tensorflow.tsl.profiler.protobuf.xplane_pb2``,
checked with TF 2.21) or, failing that, from the other module paths in ``_PB_MODULES``
(standalone TSL / XProf packages, not checked here). Only this module needs them: the
TF recorder converts in the rank, so importing a recording (JSON) needs no TensorFlow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.errors import DproInputError

log = logging.getLogger(__name__)

HOST_PLANE = "/host:CPU"
TASK_PLANE = "Task Environment"
START_STAT = "profile_start_time"

_PB_MODULES = (
    "tensorflow.tsl.profiler.protobuf.xplane_pb2",
    "tsl.profiler.protobuf.xplane_pb2",
    "xprof.protobuf.xplane_pb2",
    "tensorboard_plugin_profile.protobuf.xplane_pb2",
)


@dataclass(slots=True)
class HostEvent:
    """One host event: times in Unix-epoch µs."""

    name: str
    #: the op type for executor ops (``display_name``), else ""
    op_type: str
    thread: str
    ts: float
    dur: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def node(self) -> str | None:
        """The graph node's name for an executor op event (``<node>:<type>``), else None."""
        if self.op_type and self.name.endswith(":" + self.op_type):
            return self.name[: -len(self.op_type) - 1]
        return None


def _xplane_pb2() -> Any:
    import importlib

    for mod in _PB_MODULES:
        try:
            return importlib.import_module(mod)
        except ImportError:
            continue
    raise ImportError("reading .xplane.pb needs TensorFlow or xprof (for the XSpace protobuf classes)")


def _stat_value(s: Any, names: dict[int, str]) -> Any:
    kind = s.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return names.get(s.ref_value)
    if kind == "bytes_value":
        return None
    return getattr(s, kind)


def read_xspace(path: str | Path, *, stats: bool = True) -> list[HostEvent]:
    """Every event of the host plane of ``path``, in Unix-epoch µs, sorted by start."""
    path = Path(path)
    pb2 = _xplane_pb2()
    xs = pb2.XSpace()
    try:
        xs.ParseFromString(path.read_bytes())
    except OSError as e:
        raise DproInputError(path, f"cannot read: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise DproInputError(path, f"not an XSpace protobuf ({type(e).__name__}: {e})") from None
    start_ns = 0
    for pl in xs.planes:
        if pl.name == TASK_PLANE:
            names = {k: v.name for k, v in pl.stat_metadata.items()}
            for s in pl.stats:
                if names.get(s.metadata_id) == START_STAT:
                    start_ns = int(_stat_value(s, names) or 0)
    hosts = [pl for pl in xs.planes if pl.name == HOST_PLANE]
    if not hosts:
        raise DproInputError(path, f"no {HOST_PLANE} plane (planes: {[pl.name for pl in xs.planes]})")
    out: list[HostEvent] = []
    for pl in hosts:
        stat_names = {k: v.name for k, v in pl.stat_metadata.items()}
        for ln in pl.lines:
            thread = ln.display_name or ln.name or str(ln.id)
            base_ns = start_ns + ln.timestamp_ns
            for ev in ln.events:
                md = pl.event_metadata.get(ev.metadata_id)
                name = md.name if md is not None else f"<metadata {ev.metadata_id}>"
                st = {}
                if stats:
                    for s in ev.stats:
                        st[stat_names.get(s.metadata_id, str(s.metadata_id))] = _stat_value(s, stat_names)
                out.append(HostEvent(
                    name=name,
                    op_type=md.display_name if md is not None else "",
                    thread=thread,
                    ts=(base_ns + ev.offset_ps / 1000.0) / 1000.0,
                    dur=ev.duration_ps / 1e6,
                    stats=st,
                ))
    out.sort(key=lambda e: (e.ts, -e.dur))
    return out
