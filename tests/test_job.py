"""The prepared job (dpro.open -> Job): one pipeline run per analysis, the API gives what
the CLI prints, plain rows for pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import dpro
from dpro.errors import DproInputError

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"
RECORDED = REPO / "tests" / "data" / "golden" / "recordings" / "ddp_mlp" / "raw"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The real DDP recording (dpro's recorder, with its measured overhead) as a gTrace."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.recording import collect

    out = tmp_path_factory.mktemp("job") / "ddp"
    return write_gtrace(collect(RECORDED), out)


def _count(monkeypatch, module: str, name: str) -> list[int]:
    import importlib

    mod = importlib.import_module(module)
    fn = getattr(mod, name)
    calls = [0]

    def counted(*a, **k):
        calls[0] += 1
        return fn(*a, **k)

    monkeypatch.setattr(mod, name, counted)
    return calls


def test_replay_json_is_the_cli_output(run_cli) -> None:
    code, out, _ = run_cli("replay", BUNDLED, "--json")
    assert code == 0
    cli, api = orjson.loads(out), orjson.loads(orjson.dumps(dpro.open(BUNDLED).replay().to_json(),
                                                            option=orjson.OPT_SERIALIZE_NUMPY))
    for d in (cli, api):
        d["clock_alignment"].pop("time_s")  # the solver's wall time
    assert cli == api


def test_one_pipeline_run_for_replay_and_optimize(recorded: Path, monkeypatch) -> None:
    """Aligned once, op statistics once per node, the replay reused by the optimizer; the
    prediction without the recorder's overhead is one more simulation, not a second pipeline."""
    align = _count(monkeypatch, "dpro.alignment.align", "align")
    stats = _count(monkeypatch, "dpro.graph.stats", "node_stats")
    steps = _count(monkeypatch, "dpro.graph.stats", "typical_steps")
    replays = _count(monkeypatch, "dpro.replayer.replay", "replay_on_one_clock")
    job = dpro.open(recorded)
    r = job.replay()
    assert r.profiling_overhead is not None and r.predicted_unprofiled_iteration_us is not None
    assert r.predicted_unprofiled_iteration_us < r.predicted_iteration_us
    assert job.replay() is r
    job.optimize(budget_s=10)
    assert align[0] == 1
    assert stats[0] == len(job.trace.nodes) == 2
    assert steps[0] == 1
    assert replays[0] == 2  # as profiled, and without the overhead


def test_rows_for_pandas() -> None:
    r = dpro.open(BUNDLED).replay()
    rows = r.breakdown_rows()
    assert [x["part"] for x in rows] == list(r.breakdown_us)
    assert sum(x["pct"] for x in rows) == pytest.approx(100.0 * sum(r.breakdown_us.values()) / r.predicted_iteration_us)
    cp = r.critical_path_rows()
    assert len(cp) == len(r.critical_path) > 0
    assert {"name", "cat", "device", "start_us", "dur_us"} <= set(cp[0])
    assert all(isinstance(v, (str, int, float, type(None))) for row in cp for v in row.values())


def test_open_without_alignment_keeps_the_recorded_clocks() -> None:
    job = dpro.open(BUNDLED, align=False)
    assert job.alignment is None and job.trace is job.profiled


def test_bad_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DproInputError, match="no such file or directory"):
        dpro.open(tmp_path / "nothing")


def test_import_dpro_does_no_work() -> None:
    code = ("import sys, dpro; heavy = [m for m in ('dpro.job', 'dpro.optimizer', 'dpro.replayer', 'numpy', 'torch') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
