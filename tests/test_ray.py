"""Ray as the executor (dpro.executor.RayMapper, ``--ray``): on a local Ray cluster of 2 CPUs,
the results are those of the local run. One cluster for the module (its start takes seconds)."""

from __future__ import annotations

import functools
import gzip
import json
import operator
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from golden import gtrace_digest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make setup installs it)")

from dpro.executor import RayMapper, mapper_for, serial, start_local  # noqa: E402
from dpro.errors import DproInputError  # noqa: E402
from dpro.importers.kineto import import_kineto  # noqa: E402
from dpro.job import open_job  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"
DLRM = REPO.parent / "shared" / "traces" / "corpus" / "param_dlrm_8rank"  # 8 ranks, where the corpus is


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster with 2 CPUs; its address (workers import this checkout's dpro)."""
    with pytest.MonkeyPatch.context() as mp:  # the cluster's workers inherit it
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        start_local(num_cpus=2)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


def _search(res) -> list:  # noqa: ANN001 - OptimizeResult
    """What a search found, less its wall time."""
    return [(r.start, r.strategy.key(), r.iteration_us, [s.to_json() for s in r.steps], r.evaluations, r.converged)
            for r in res.results]


def test_mapper_keeps_order(cluster):
    fn = functools.partial(operator.sub, 1000)  # workers import fn by name: not from this test module
    items = list(range(20))
    assert list(RayMapper("auto")(fn, items)) == list(serial(fn, items)) == [1000 - i for i in items]
    assert mapper_for("auto", 4) == RayMapper("auto")  # --ray wins over a pool


@pytest.mark.parametrize("path", [EXAMPLE, DLRM], ids=["bundled_2rank", "param_dlrm_8rank"])
def test_import_same_as_local(cluster, path):
    """The per-rank import as Ray tasks (one per rank file) gives the serial import."""
    if not path.exists():
        pytest.skip(f"not here: {path}")
    local = import_kineto(path, mapper=serial)
    on_ray = import_kineto(path, mapper=RayMapper("auto"))
    assert gtrace_digest(on_ray) == gtrace_digest(local)
    assert on_ray.manifest == local.manifest and on_ray.notes == local.notes


def test_task_error_is_the_one_line_error(cluster, tmp_path):
    d = tmp_path / "job"
    shutil.copytree(EXAMPLE, d)
    (d / "rank1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": "x"}]}'))
    with pytest.raises(DproInputError, match=r"rank1\.json\.gz: traceEvents\[0\]: 'ts' is missing or not a number"):
        import_kineto(d, mapper=RayMapper("auto"))


def test_optimizer_search_same_as_local(cluster):
    job = open_job(EXAMPLE, progress=False, cache=False)
    local = job.optimize(budget_s=600)
    on_ray = job.optimize(budget_s=600, mapper=RayMapper("auto"))
    assert sum(r.evaluations for r in local.results) > 3  # candidates were replayed
    assert _search(on_ray) == _search(local)
    assert on_ray.baselines == local.baselines


def test_cli_optimize_ray_address(cluster, tmp_path):
    """``dpro optimize --ray ADDRESS`` (import and search on the running cluster): the JSON
    of the local run."""
    env = dict(os.environ, DPRO_NO_CACHE="1")  # both runs import

    def run(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "dpro.cli", "optimize", str(EXAMPLE), "--json", "--budget", "600",
                              *extra], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        res.pop("time_s", None)
        for r in res.get("results", []):
            r.pop("time_s", None)
        return res

    assert run("--ray", cluster) == run()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_unreachable_address_is_one_line(address):
    """A wrong address fails at once with one line (Ray alone retries for minutes)."""
    out = subprocess.run([sys.executable, "-m", "dpro.cli", "validate", str(EXAMPLE), "--ray", address],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"dpro: error: --ray {address}: cannot connect to a Ray cluster there "
                                               "(Connection refused)"]
