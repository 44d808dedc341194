"""The graph-pass interface.

A pass proposes :class:`Candidate` changes to a strategy (usually near the critical path
of the current replay) and applies one, returning a new
:class:`~dpro.optimizer.strategy.Strategy`; the estimate of any changed op duration is
part of the strategy it returns (e.g. a fused op's duration). The search replays each
applied candidate and keeps it only if the iteration gets faster.

Writing a pass::

    import dpro.passes

    @dpro.passes.register
    class MyPass(dpro.passes.GraphPass):
        name = "my_pass"

        def candidates(self, ctx):        # ctx: dpro.passes.PassContext
            return [dpro.passes.Candidate(self.name, ("something",), "why", est_gain_us=10.0)]

        def apply(self, ctx, cand):
            return ctx.strategy           # a new Strategy

and give it to ``dpro optimize --pass mymodule`` (every registered pass in the module is
loaded), to :func:`dpro.optimizer.optimize` (``passes=[MyPass()]``), or publish it under the
``dpro.passes`` entry-point group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from dpro.optimizer.evaluate import Analysis
    from dpro.optimizer.job_model import JobModel
    from dpro.optimizer.strategy import Strategy


@dataclass(frozen=True, slots=True)
class Candidate:
    """A change a pass proposes."""

    pass_name: str
    #: what to change, in the pass's own terms (hashable)
    target: tuple
    #: the rule that proposed it and its numbers, for the user
    reason: str
    #: the pass's estimate of the time saved (µs); the search tries larger gains first
    est_gain_us: float = 0.0


@dataclass
class PassContext:
    """What a pass sees: the job, the current strategy and its replay."""

    model: "JobModel"
    strategy: "Strategy"
    analysis: "Analysis"


class GraphPass(ABC):
    """Base class of graph passes (see the module docstring)."""

    #: unique, short, used in reports and on the command line
    name: str = ""
    #: "memory" passes trade time for memory; "throughput" passes are searched by default
    kind: str = "throughput"

    @abstractmethod
    def candidates(self, ctx: PassContext) -> list[Candidate]:
        """Changes worth trying on ``ctx.strategy``."""

    @abstractmethod
    def apply(self, ctx: PassContext, cand: Candidate) -> "Strategy":
        """``ctx.strategy`` with ``cand`` applied (a new strategy)."""


P = TypeVar("P", bound=type)

#: attribute that marks a class as a dpro pass for discovery by module
MARK = "__dpro_pass__"


def register(cls: P) -> P:
    """Class decorator: mark ``cls`` as a dpro pass, found by :func:`passes_in_module`."""
    if not (isinstance(cls, type) and issubclass(cls, GraphPass)):
        raise TypeError("dpro.passes.register: decorate a subclass of dpro.passes.GraphPass")
    if not cls.name:
        raise TypeError(f"dpro.passes.register: {cls.__name__} needs a non-empty `name`")
    setattr(cls, MARK, True)
    return cls
