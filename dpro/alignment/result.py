"""What :func:`dpro.alignment.align` found."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AlignResult:
    """Per-node clock offsets and how they were obtained.

    ``offsets_us[n]`` is θ_n: add it to every timestamp of node ``n`` to put the node on
    the reference node's clock (``apply_offsets`` does that).  θ of the reference is 0.
    """

    offsets_us: dict[str, float]
    reference: str | None
    #: objective value at the solution (ms^2, weighted; see AlignOptions)
    objective: float | None = None
    #: the terms of the objective at the solution, unweighted (ms^2)
    terms: dict[str, float] = field(default_factory=dict)
    solver: str = "none"
    #: optimal / optimal_inaccurate / trivial / fallback / ...
    status: str = "trivial"
    #: convex-concave iterations run (0: the convex problem only)
    iterations: int = 0
    #: size of the last convex problem solved
    variables: int = 0
    constraints: int = 0
    #: observations used: receive instances, collective instances, node pairs with a dependency
    recv_instances: int = 0
    collective_instances: int = 0
    dependency_pairs: int = 0
    #: feasible interval of each θ_n allowed by the dependencies alone (µs, relative to the
    #: reference of its component); None where a side is unbounded
    bounds_us: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    time_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """As ``dpro align --json`` prints it (µs)."""
        return {
            "offsets_us": self.offsets_us,
            "reference": self.reference,
            "objective": self.objective,
            "terms": self.terms,
            "solver": self.solver,
            "status": self.status,
            "iterations": self.iterations,
            "variables": self.variables,
            "constraints": self.constraints,
            "recv_instances": self.recv_instances,
            "collective_instances": self.collective_instances,
            "dependency_pairs": self.dependency_pairs,
            "bounds_us": {k: list(v) for k, v in self.bounds_us.items()},
            "time_s": self.time_s,
            "notes": self.notes,
        }
