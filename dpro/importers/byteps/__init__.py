"""Import BytePS communication traces into gTrace (format notes: docs/byteps.md).

BytePS (``BYTEPS_TRACE_ON=1``) writes one ``<BYTEPS_TRACE_DIR>/<local_rank>/comm.json`` per
GPU process: per tensor one ``tid: "total"`` event per synchronisation, and per
partition (``tid`` = the partition's key) one event per stage (``QueueType``) it went
through.  A ps-lite server built with server profiling writes ``server_profile.json``
(push/pull requests per key and sender, ``B``/``E`` pairs).  Optional BytePS DEBUG logs
(``*.log``) give tensor and partition sizes.

Layout read here: ``DIR/<local_rank>/comm.json`` (one machine), or
``DIR/<machine>/<local_rank>/comm.json`` (one sub-directory per worker machine, worker id
= the trailing number of its name, else the sorted order); server profiles anywhere as
``server*.json`` (their keys tell which server wrote them).
"""

from dpro.importers.byteps.convert import import_byteps
from dpro.importers.byteps.read import STAGES, RankComm, ServerProfile, discover, read_comm_json, read_server_profile

__all__ = ["STAGES", "RankComm", "ServerProfile", "discover", "import_byteps", "read_comm_json", "read_server_profile"]
