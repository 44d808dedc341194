"""Message traces of dpro's ps-lite patch (``native/pslite_patch``) -> a gTrace.

The patch writes one JSON-lines file per process (``pslite.<role>.<host>.<pid>.jsonl``,
format in docs/pslite.md): a header line, then one line per message the process's Van
sent or received.  This package reads them (``read.py``: :func:`read_trace_file`,
:func:`read_trace_dir`) and builds a gTrace (``convert.py``: :func:`to_gtrace`):

* **Exchanges.** ps-lite answers every data request: a worker's push (pull) request to a
  server gets a push (pull) response carrying the same (app, customer, timestamp).  An
  exchange is (worker id, server id, app, customer, timestamp, push); it has four
  records: request sent (worker), request received (server), response sent (server),
  response received (worker), joined by the message id ``mid``.
* **Slots and steps.** A worker's exchanges with one server for one key list (and app,
  customer) form a slot, the unit of an op.  Step n of a slot is its n-th pull, with
  the last push sent after the previous pull and before it (the push that pull reads);
  a slot that never pulls counts its pushes.  Other pushes (e.g. initialisation pushes
  before the first round) belong to no step.  The trace's steps are 0 .. m-1, m the
  smallest step count of any slot (extra rounds of some slots are left out, with a note).
* **Ops.** Every message is two COMM ops paired by ``txn``: the send on its sender and
  the receive on its receiver.  Following the gTrace convention (docs/alignment.md),
  worker -> server messages are ``PUSH_REQ`` (send) -> ``PUSH_RES`` (receive) and
  server -> worker messages ``PULL_REQ`` (send) -> ``PULL_RES`` (receive); the op name
  says which ps-lite message it is (``push_request``, ``push_response``,
  ``pull_request``, ``pull_response``).  A send's event lasts from the call into the Van
  to the Van's return (zeromq's Van first waits for its socket lock, then queues the
  message); a receive's event lasts from the end of its sender's send to its arrival at
  the receiving Van (the message's flight, exact when both run on one host; across hosts
  it assumes synchronised clocks).
* **Local DFG edges.** Worker: its sends in program order (as in the first step); each
  request -> its response; a push response -> the pull request of the same slot when,
  in every step, that pull was sent after the push response arrived (the program
  waited).  Server: each request -> its response; and, when in every step every
  worker's push (pull) response for a key was sent only after every worker's push of
  that key arrived (synchronous aggregation), every worker's push -> each of those
  responses.
* **Devices.** A worker's sends run on ``app`` (the thread that calls ZPush/ZPull); a
  server's sends on ``to:<worker>:<tensor>``.
  A server answers on one thread, but the time a response waited for that thread is
  already in its measured gap, so responses are not queued on one device again.
  Receives from one peer share a device ``from:<peer>`` (one connection delivers in
  order) and are chained in arrival order where that order held in every step, so a
  receive's own time is its arrival after the previous one (not the whole flight again).
* **Step windows**, by the workers' timestamps (one host: one clock), so that every
  node's measured iteration is the workers' view: a worker's step runs from its first
  request to its last response; a server's step starts at the first request it got in
  that step and lasts the mean, over workers, of the span (first request to last
  response) of that worker's exchanges with it.  (Workers of a synchronous PS run their
  steps together; the asynchronous test programs let them drift apart, and a union of
  their windows would measure the drift.)

Control (ADD_NODE, BARRIER, ...) and SimpleApp messages are read and validated but not
turned into ops; nor is the scheduler (no data messages).
"""

from dpro.importers.pslite.convert import Exchange, exchanges, import_pslite, to_gtrace
from dpro.importers.pslite.read import (
                                        DATA_KINDS,
                                        FORMAT_NAME,
                                        FORMAT_VERSION,
                                        ProcessTrace,
                                        Record,
                                        read_trace_dir,
                                        read_trace_file,
)

__all__ = [
    "DATA_KINDS", "FORMAT_NAME", "FORMAT_VERSION", "Exchange", "ProcessTrace", "Record", "exchanges", "import_pslite", "read_trace_dir", "read_trace_file", "to_gtrace",
]
