"""An MXNet parameter-server recording of `dpro profile` -> gTrace (scheme ``ps``).

The workers' ``rank<r>.json.gz`` (``mx.profiler``) + ``rank<r>.meta.json`` and the servers'
``server<i>.kv.json``, written by :mod:`dpro.profiler.mxnet`: :mod:`.read` checks and reads
them, :mod:`.convert` builds the gTrace (:func:`collect_mxnet`), :mod:`.memory` attributes
each worker's storage counter to its ops.
"""

from dpro.importers.mxnet.convert import collect_mxnet
from dpro.importers.mxnet.memory import attach_counter
from dpro.importers.mxnet.read import ServerRaw, WorkerRaw, read_server, read_worker

__all__ = ["ServerRaw", "WorkerRaw", "attach_counter", "collect_mxnet", "read_server", "read_worker"]
