"""Scale-out of a real MXNet parameter-server recording (tests/data/golden/recordings/mxnet_ps_mlp:
2 workers, 2 servers, dist_sync, recorded on the development machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

REC = Path(__file__).resolve().parent / "data" / "golden" / "recordings" / "mxnet_ps_mlp" / "raw"


@pytest.fixture(scope="module")
def ps_job(tmp_path_factory):
    from click.testing import CliRunner

    import dpro
    from dpro.cli import cli

    out = tmp_path_factory.mktemp("ps") / "gtrace"
    r = CliRunner().invoke(cli, ["collect", str(REC), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return dpro.open(out)


def test_ps_scale_out_reproduces_the_profiled_cluster(ps_job):
    from dpro.whatif.scaleout import Cluster, predict

    res = predict(ps_job, [Cluster(n) for n in (1, 2, 4)])
    assert res.kind == "ps" and [p.servers for p in res.points] == [2, 2, 2]
    it = [p.iteration_us for p in res.points]
    # the profiled cluster (2 workers, 2 servers) within 10% of what the trace measured
    assert it[1] == pytest.approx(res.measured_iteration_us, rel=0.10)
    # more workers share each server's port: slower steps
    assert it[0] < it[1] < it[2]
    one_server = predict(ps_job, [Cluster(4, servers=1)]).points[0].iteration_us
    assert one_server > it[2]


def test_ps_async_throughput_grows_with_workers(ps_job):
    from dpro.whatif.scaleout import Cluster, predict

    res = predict(ps_job, [Cluster(n, asynchronous=True, steps=400) for n in (1, 2, 4)])
    thr = [p.throughput for p in res.points]
    assert thr[0] < thr[1] < thr[2]
    sync1 = predict(ps_job, [Cluster(1)]).points[0].throughput
    assert thr[0] == pytest.approx(sync1, rel=0.25)  # one worker: async is the sync loop


def test_servers_on_an_allreduce_profile_is_one_line():
    from click.testing import CliRunner

    from dpro.cli import cli

    ex = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"
    r = CliRunner().invoke(cli, ["whatif", str(ex), "--servers", "2"])
    assert r.exit_code == 2 and "parameter-server profile" in r.output
