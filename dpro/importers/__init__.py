"""Importers: traces -> gTrace.

Other tools' traces: torch.profiler (:mod:`.kineto`), BytePS (:mod:`.byteps`), ps-lite
(:mod:`.pslite`), dpro's NCCL plugin (:mod:`.nccl`), TF's xplane (:mod:`.xplane`). The raw
recordings of `dpro profile`: :mod:`.recording` (the entry point, PyTorch ranks),
:mod:`.tensorflow`, :mod:`.mxnet`, :mod:`.horovod` (rank 0's Horovod timeline). Importers are
plain functions (the `dpro import` commands are in :mod:`dpro.cli_imports`) and import
nothing from :mod:`dpro.profiler`.
"""
