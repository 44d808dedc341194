"""Graph passes: the public plug-in interface of `dpro optimize`.

Write a pass against these names (see :mod:`dpro.optimizer.passes.base`), mark it with
:func:`register`, and load it with ``dpro optimize --load-pass MODULE``, an entry point in
the ``dpro.passes`` group, or ``dpro.open(path).optimize(passes=[...])``.
:func:`default_registry` lists the built-in, entry-point and named modules' passes
(``default_registry(["my_passes"]).select(["op_fusion"])``). The built-in passes live in
:mod:`dpro.optimizer.passes`; :mod:`dpro.passes.mixed_precision` is one written as a user
pass.
"""

from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext, register
from dpro.optimizer.passes.registry import PassRegistry, default_registry

__all__ = ["Candidate", "GraphPass", "PassContext", "PassRegistry", "default_registry", "register"]
