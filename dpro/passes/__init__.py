"""Graph passes: the changes `dpro optimize` searches over (see :mod:`dpro.passes.base`)."""

from dpro.passes.base import Candidate, GraphPass, PassContext, register

__all__ = ["Candidate", "GraphPass", "PassContext", "register"]
