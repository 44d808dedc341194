"""Options of clock alignment (docs/alignment.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlignOptions:
    """Weights, solver and limits of :func:`dpro.alignment.align`.

    The objective is ``a1*O1 + a1_coll*O1c + a2*O2 + a3*O3 + tie*T`` (every term a mean
    of squared deviations in ms^2, so the weights are comparable):

    * O1 — variance, across steps, of each receive family's duration measured from the
      moment its data could start to flow (a RECV clipped by its SEND's start);
    * O1c — the same for coarse collectives: variance, across steps, of a collective's
      length from its latest aligned start to its mean end.  Off by default: it is
      minimised by making one rank "always last" (docs/alignment.md, identifiability);
    * O2 — variance of the offsets of the nodes of one physical machine;
    * O3 — spread of the aligned end times of each instance of a coarse collective
      (every rank of a ring/tree collective finishes at about the same moment): the
      coarse-collective analogue of O1 that identifies offsets;
    * T  — a tiny tie-break: the squared slack of the tightest dependency of every pair of
      nodes, which picks the middle of the interval the dependencies allow when nothing
      else identifies an offset (NTP's symmetric-delay choice).
    """

    #: weight of O1 (receive duration variance across steps)
    a1: float = 1.0
    #: weight of O1c (collective length variance across steps); see above
    a1_coll: float = 0.0
    #: weight of O2 (offsets of nodes on the same host); large: one host, one clock
    a2: float = 1e5
    #: weight of O3 (end spread of coarse collectives)
    a3: float = 1.0
    #: weight of the tie-break T (keep it tiny: it only decides flat directions)
    tie: float = 1e-4
    #: the node whose clock is the reference (θ = 0); default: the lowest-rank worker
    reference: str | None = None
    #: align even when every node reports the same host (one clock: θ = 0 is exact)
    force: bool = False
    #: dependencies may be violated by this much (timestamp rounding), µs
    tolerance_us: float = 1.0
    #: CVXPY solver: CLARABEL (default), OSQP, SCS, ... (a QP solver)
    solver: str = "CLARABEL"
    #: wall-clock budget of all solver calls together, seconds
    time_limit_s: float = 30.0
    #: convex-concave (majorize-minimize) iterations at most
    max_iters: int = 20
    #: stop when the objective improves by less than this (relative)
    rel_tol: float = 1e-7
    #: penalty per ms of violated dependency when the dependencies contradict each other
    elastic_penalty: float = 1e4

    def validate(self) -> None:
        for k in ("a1", "a1_coll", "a2", "a3", "tie", "tolerance_us", "elastic_penalty"):
            v = getattr(self, k)
            if not (v >= 0):
                raise ValueError(f"AlignOptions.{k} must be >= 0 (got {v})")
        if not (self.time_limit_s > 0):
            raise ValueError("AlignOptions.time_limit_s must be > 0")
        if self.max_iters < 0:
            raise ValueError("AlignOptions.max_iters must be >= 0")
