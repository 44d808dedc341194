"""dpro.executor: the mappers give the results of a plain loop; --ray without Ray is one line."""

from __future__ import annotations

import functools
import operator
import os
import time
import subprocess
import sys
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.executor import ProcessPool, RayMapper, mapper_for, serial

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def test_serial_is_lazy_and_pool_keeps_order():
    calls = []
    it = serial(lambda x: calls.append(x) or x, [1, 2, 3])
    assert calls == [] and next(iter(it)) == 1 and calls == [1]
    fn = functools.partial(operator.sub, 100)
    assert list(ProcessPool(2)(fn, range(9))) == [100 - i for i in range(9)]
    assert list(ProcessPool(2)(fn, [])) == []


def _fail_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def _with_pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


def test_forked_pool_runs_items_here_too_and_raises_in_item_order():
    """Forked (no other thread here): one worker plus this process, which takes items from
    the end; the results come in item order and the first failing item's error is raised."""
    from dpro.executor import start_method

    assert start_method() == "fork" or sys.platform != "linux"
    fn = functools.partial(operator.mul, 3)
    assert list(ProcessPool(2)(fn, range(20))) == [3 * i for i in range(20)]
    done = list(ProcessPool(2)(_with_pid, range(6)))
    assert [x for x, _ in done] == list(range(6))
    assert done[-1][1] == os.getpid() and done[0][1] != os.getpid()  # the last item here, the first in the worker
    it = ProcessPool(2)(_fail_odd, [0, 2, 5, 4, 7])
    assert next(it) == 0 and next(it) == 2
    with pytest.raises(ValueError, match="odd 5"):
        next(it)


def _sleep_first(i: int) -> int:
    if i == 0:
        time.sleep(1.0)
    return i


def test_forked_pool_runs_meanwhile_once_while_the_worker_runs():
    """``meanwhile`` runs once, in this process, once the worker has started (it takes
    item 0, slow); the results are unchanged. The Kineto import's pool loads numpy there."""
    from dpro.importers.kineto.pool import default_mapper

    calls: list[int] = []
    pool = ProcessPool(2, meanwhile=lambda: calls.append(os.getpid()))
    assert list(pool(_sleep_first, range(4))) == [0, 1, 2, 3]
    assert calls == [os.getpid()]
    mapper = default_mapper([2**20] * 8)
    assert isinstance(mapper, ProcessPool) and mapper.meanwhile is not None


def test_mapper_for():
    assert mapper_for(None) is serial and mapper_for(None, 1) is serial
    assert mapper_for(None, 4) == ProcessPool(4)


def test_optimizer_search_in_a_pool_same_as_serial():
    from dpro.job import open_job

    job = open_job(EXAMPLE, progress=False, cache=False)

    def found(res):  # noqa: ANN001, ANN202
        return [(r.start, r.strategy.key(), r.iteration_us, r.evaluations, r.converged) for r in res.results]

    assert found(job.optimize(budget_s=600, mapper=ProcessPool(2))) == found(job.optimize(budget_s=600))


def test_without_ray_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(DproInputError, match="needs Ray"):
        list(RayMapper("auto")(abs, [1]))
    code = ("import sys; sys.modules['ray'] = None; from dpro.cli import main; "
            f"sys.argv = ['dpro', 'optimize', {str(EXAMPLE)!r}, '--ray', 'auto', '--json']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DPRO_CACHE_DIR": str(tmp_path)})
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == ["dpro: error: --ray needs Ray: pip install 'dpro[ray]'"]


def _slow_last_here(x: int) -> tuple[int, int]:
    if x == 5:
        time.sleep(1.0)
    return x, os.getpid()


def _die_on_zero(x: int) -> int:
    if x == 0:
        os._exit(3)
    return x


def test_forked_worker_takes_the_items_itself_and_a_dead_worker_is_raised():
    """The forked worker takes the next item on its own (a shared span, no round trip
    through this process): while this process runs the last item (slow), the worker runs
    all the others. A worker that dies raises BrokenProcessPool, no hang; stopping early
    leaves nothing running."""
    from concurrent.futures.process import BrokenProcessPool

    done = list(ProcessPool(2)(_slow_last_here, range(6)))
    assert [x for x, _ in done] == list(range(6))
    assert done[5][1] == os.getpid() and all(pid != os.getpid() for _, pid in done[:5])
    with pytest.raises(BrokenProcessPool):
        list(ProcessPool(2)(_die_on_zero, range(4)))
    it = ProcessPool(2)(functools.partial(operator.mul, 2), range(50))
    assert next(it) == 0
    it.close()
