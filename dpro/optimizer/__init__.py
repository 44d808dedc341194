"""`dpro optimize`: from the replayed critical path to a faster strategy (docs/optimizer.md)."""


def optimize(*args, **kwargs):  # noqa: ANN002, ANN003 - thin lazy re-export
    """See :func:`dpro.optimizer.optimize.optimize`."""
    from dpro.optimizer.optimize import optimize as _optimize

    return _optimize(*args, **kwargs)
