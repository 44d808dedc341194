"""Per-link cost of one ring step, t(bytes) = alpha + beta * bytes, fitted from the run.

A ring AllReduce of B bytes over N ranks is 2(N-1) steps, each moving B/N bytes over
every link at once, so a collective that all ranks enter together lasts
``2(N-1) * (alpha + beta * B/N)``.  From the trace we take, for every collective
instance (transaction id and step), its *service time*: the latest end over the ranks
minus the moment the last rank was ready for it (its issue, and the end of the previous
collective on that rank's communication queue).  We fit alpha, beta >= 0 by least squares
on the per-transaction medians (docs/replayer.md has the derivation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LinkCost:
    """alpha in µs per ring step, beta in µs per byte."""

    alpha: float
    beta: float
    samples: int = 0
    #: relative RMS error of the fit on its own samples
    fit_error: float = 0.0

    def step_us(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


def ring_steps(n: int) -> int:
    """Number of ring steps of an AllReduce over n ranks."""
    return 2 * (n - 1)


def fit_link_cost(samples: list[tuple[int, int, float]]) -> LinkCost | None:
    """Fit from (bytes, ranks, service µs) samples; None when nothing usable."""
    rows = [(b, n, t) for b, n, t in samples if n > 1 and t > 0 and b > 0]
    if not rows:
        return None
    k = np.array([ring_steps(n) for _, n, _ in rows], dtype=float)
    x = np.array([b / n for b, n, _ in rows], dtype=float)
    y = np.array([t for _, _, t in rows], dtype=float)
    alpha, beta = 0.0, 0.0
    A = np.stack([k, k * x], axis=1)
    if len(set(x.tolist())) > 1:
        (alpha, beta), *_ = np.linalg.lstsq(A, y, rcond=None)
    if len(set(x.tolist())) <= 1 or alpha < 0 or beta < 0:
        # one size only, or a negative term: fall back to bandwidth only (then latency only)
        kx = k * x
        beta = float(kx @ y / (kx @ kx)) if kx @ kx > 0 else 0.0
        alpha = 0.0
        if beta <= 0:
            alpha, beta = float(np.mean(y / k)), 0.0
    pred = k * (alpha + beta * x)
    err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    return LinkCost(float(alpha), float(beta), len(rows), err)
