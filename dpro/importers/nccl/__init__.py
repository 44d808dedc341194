"""Traces of dpro's NCCL profiler plugin (``native/nccl_patch``) -> fine-grained gTrace ops.

The plugin writes one JSON-lines file per rank (format: ``native/nccl_patch/README.md``):
every collective NCCL ran on each communicator (sequence number, size, algorithm,
protocol, channels), every proxy send/receive op per channel, and every network step
(chunk) of those ops with its size and timestamps (CLOCK_REALTIME, ns).  This package

* reads them (:func:`read_plugin_file`, :func:`read_plugin_dir`);
* turns one collective, seen on all ranks, into chunk ops (:func:`collective_chunks`):
  a ``SEND`` per network step on the sender and a ``RECV`` per step on the receiver with
  the same transaction id, ``<collective txn>/c<channel>/<src>><dst>/s<step>`` (``#<k>``
  appended for the k-th (k>0) op between the same two ranks on one channel), so rank
  r's send of step i on channel c pairs with rank p's receive of step i on channel c
  from r.  NCCL numbers the steps of a proxy op from 0 on both sides, so this pairs
  exactly, for rings, trees and anything else that goes through the proxy;
* replaces, in a gTrace imported from Kineto, each rank's coarse NCCL collective by
  ``IN`` -> chunk ops -> ``OUT`` with the measured chunk times
  (:func:`replace_collectives`), so that the replayer uses them instead of its
  alpha + beta * bytes ring expansion.

Linkage, plugin collective <-> framework collective (per rank, on one communicator,
by default the one spanning the whole job): the gTrace numbers the collectives of a
step ``<coll>.<k>`` in issue order; the plugin knows NCCL's per-communicator,
per-function sequence number, which is the same on every rank for one collective.
Step ``s``'s collectives of function f, in order, are the plugin's collectives of f
assigned to step ``s``, in sequence-number order, where a plugin collective belongs to

1. the step whose ``dpro_nccl_trace_mark_step(s)`` (called by the training loop at the
   start of step s) last precedes its enqueue time, when the file has step marks; else
2. the step whose window on the node's clock holds its enqueue time, given
   ``time_offset_us`` (plugin µs + offset = the node's clock; for Kineto traces
   ``-baseTimeNanoseconds / 1000``, see :func:`kineto_time_offsets`); else
3. ``seq_base``: the sequence number of f's first collective in the first profiled step,
   the steps being consecutive with the same collectives each.

Counts must agree per step, and the sequence numbers linked to one (txn, step) must be
equal on all ranks; anything that does not fit keeps the coarse op (with a note).

Chunk times on the node's clock: plugin time + ``time_offset_us`` when given, else an
offset estimated per rank as the median, over linked collectives, of (kernel end - end of
the last received chunk), i.e. assuming the NCCL kernel ends right after consuming the
last chunk it receives (its last sends may complete on the network after it ended).

What a chunk op's event is (so that dpro.graph.stats charges the right time):
``SEND`` runs from the moment the proxy posts the step to the network (``SendWait``)
to its completion; ``RECV`` from the data's arrival (``RecvFlushWait``) to its being
visible to the GPU (``RecvGPUWait``).  The time before a SEND (waiting for the GPU to
produce the chunk, i.e. the reduction of the chunk just received) is its host gap.

Local dependencies inside a replaced collective on one rank: IN -> first chunk op of each
(channel, direction, peer) queue; the steps of a queue in order; the last -> OUT; and the
data dependencies NCCL's algorithms imply, where both ends are network steps of this rank:

* RING AllReduce / AllGather / ReduceScatter: send i <- recv i - S unless step i starts a
  ring loop's first ring step (own data): S = network steps per ring step = 2 for the
  SIMPLE protocol (NCCL's chunkSteps / sliceSteps), 1 for LL / LL128; a loop has
  2(N-1) ring steps (AllReduce) or N-1 (AllGather, ReduceScatter);
* RING Broadcast / Reduce (a pipeline): send i <- recv i;
* TREE: per channel, a peer is this rank's parent when this rank's send of step 0 to it
  starts before its receive of step 0 from it arrives (up the tree first, then down);
  send to the parent i <- recv from each child i; send to a child i <- recv from the
  parent i, or at the root <- recv from each child i;
* anything else (NVLS, CollNet, PAT, a ring whose other hop on this rank is intra-node and
  so invisible to the proxy): queue order only.
"""

from dpro.importers.nccl.chunks import Chunk, PairedCollective, chunk_txn, collective_chunks, data_dependencies
from dpro.importers.nccl.read import PluginFile, RankView, read_plugin_dir, read_plugin_file, select_comm
from dpro.importers.nccl.replace import ReplaceResult, kineto_time_offsets, replace_collectives

__all__ = [
    "Chunk", "PairedCollective", "PluginFile", "RankView", "ReplaceResult", "chunk_txn", "collective_chunks",
    "data_dependencies", "kineto_time_offsets", "read_plugin_dir", "read_plugin_file", "replace_collectives",
    "select_comm",
]
