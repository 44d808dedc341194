"""Importing a rank makes no reference cycles, so it runs with the cyclic garbage collector
off (``convert._gc_paused``: its collections took about half of the import's CPU time):
checked on the bundled two-rank job and on corpus sets with CUDA kernels and NCCL
collectives, Python frames and gloo (skipped when the corpus is absent)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from dpro.importers.kineto.convert import RankTask, import_rank
from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, trace_files

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("DPRO_SHARED", REPO.parent / "shared")) / "traces" / "corpus"
CASES = [REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp", CORPUS / "param_dlrm_8rank",
         CORPUS / "kineto_resnet50_profapi_nw4", CORPUS / "tl_mi300_ddp_resnet18"]


@pytest.mark.parametrize("folder", CASES, ids=lambda p: p.name)
def test_import_rank_makes_no_reference_cycles(folder: Path) -> None:
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    task = RankTask(trace_files(folder)[0], DEFAULT_RANK_PATTERN, 0)
    import_rank(task)  # first: the lazy imports and caches (they may make cycles, once)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        result = import_rank(task)
        assert gc.collect() == 0  # nothing unreachable was left for the collector
    finally:
        if was:
            gc.enable()
    assert result.node.events


def test_import_rank_restores_the_collector() -> None:
    task = RankTask(trace_files(CASES[0])[0], DEFAULT_RANK_PATTERN, 0)
    assert gc.isenabled()
    import_rank(task)
    assert gc.isenabled()
    gc.disable()
    try:
        import_rank(task)
        assert not gc.isenabled()
    finally:
        gc.enable()
