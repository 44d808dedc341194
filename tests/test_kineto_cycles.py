"""Steps aligned with the reference step never close a cycle in a rank's DFG.

A blocking sync takes its place in the reference step's timeline at its end
(dpro/importers/kineto/convert.py), so the edge from a sync to the GPU op it waited for,
which a step aligned with the reference can give, goes backwards and is left out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "hta_extra" / "negative_queue_rank0"


def test_copy_launched_where_the_reference_waited_makes_no_cycle() -> None:
    """HTA's public trace of one rank of a 16-rank DLRM-like job (A100, NCCL), cut to steps
    550-552 (tests/data/hta_extra/README.md): in step 552, ``aten::to``'s piece 8 launches the
    pageable copy that piece 8 of the reference step 551, a stream sync, waited for."""
    from dpro.gtrace.validate import check_acyclic
    from dpro.importers.kineto import import_kineto
    from dpro.job import prepare
    from dpro.jsonio import read_options

    with read_options(allow_missing_ranks=True):  # rank 0 of 16
        gt = import_kineto(DATA)
        res = prepare(gt).replay()
    check_acyclic(gt)
    assert any("steps [552] differ in structure from step(s) [551]; aligned with step 551" in n for n in gt.notes)
    assert gt.manifest.steps == [551, 552]
    nt = gt.nodes["worker0"]
    # the reference step's sync still waits for the copy (the edge the fix keeps)
    waits = [(a, b) for a, b in nt.edges if a.startswith("Memcpy HtoD (Pageable") and b.startswith("aten::to[")]
    assert waits
    assert res.predicted_iteration_us == pytest.approx(res.measured_iteration_us, rel=0.05)
