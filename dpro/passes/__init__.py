"""Graph passes: the public plug-in interface of `dpro optimize`.

Write a pass against these names (see :mod:`dpro.optimizer.passes.base`), mark it with
:func:`register`, and load it with ``dpro optimize --load-pass MODULE``, an entry point in the
``dpro.passes`` group, or ``dpro.optimizer.optimize(gt, passes=[...])``. The built-in passes
live in :mod:`dpro.optimizer.passes`; :mod:`dpro.passes.mixed_precision` is one written as a
user pass.
"""

from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext, register

__all__ = ["Candidate", "GraphPass", "PassContext", "register"]
