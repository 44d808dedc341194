"""Read the strategy files `dpro optimize -o DIR` wrote, for the training script.

.. code-block:: python

    from dpro.optimizer.apply import ddp_kwargs, horovod_groups, horovod_env
    ddp = DDP(model, **ddp_kwargs("strategy/"))                     # bucket_cap_mb
    os.environ.update(horovod_env("strategy/")); hvd.init()        # fusion threshold, cycle
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   groups=horovod_groups("strategy/", model.named_parameters()))
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpro.errors import DproInputError
from dpro.jsonio import read_json


def _load(path: str | Path, name: str) -> dict:
    p = Path(path)
    f = p / name if p.is_dir() else p
    d = read_json(f)
    if not isinstance(d, dict):
        raise DproInputError(f, "expected a JSON object")
    return d


def ddp_kwargs(path: str | Path) -> dict[str, float]:
    """``DistributedDataParallel`` keyword arguments from ``ddp.json`` (a file or its directory)."""
    d = _load(path, "ddp.json")
    cap = d.get("bucket_cap_mb")
    if not isinstance(cap, (int, float)) or isinstance(cap, bool) or cap <= 0:
        raise DproInputError(Path(path), "ddp.json: 'bucket_cap_mb' must be a positive number")
    return {"bucket_cap_mb": float(cap)}


def horovod_env(path: str | Path) -> dict[str, str]:
    """``HOROVOD_FUSION_THRESHOLD`` / ``HOROVOD_CYCLE_TIME`` from ``horovod.json`` (set before ``hvd.init()``)."""
    d = _load(path, "horovod.json")
    out = {}
    for k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"):
        v = d.get(k)
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise DproInputError(Path(path), f"horovod.json: '{k}' must be a non-negative number")
            out[k] = str(v)
    return out


def horovod_groups(path: str | Path, named_parameters: Iterable[tuple[str, Any]]) -> list[list[Any]]:
    """The parameter groups of ``horovod.json`` as lists of the model's parameters.

    Parameters the file does not name (e.g. frozen ones) are left to Horovod's default.
    """
    d = _load(path, "horovod.json")
    groups = d.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(n, str) for n in g) for g in groups):
        raise DproInputError(Path(path), "horovod.json: 'groups' must be a list of lists of parameter names")
    params = dict(named_parameters)
    unknown = [n for g in groups for n in g if n not in params]
    if unknown:
        raise DproInputError(Path(path), f"horovod.json names parameters the model does not have: {', '.join(unknown[:5])}")
    return [[params[n] for n in g] for g in groups if g]
