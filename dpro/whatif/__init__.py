"""What-if analysis (docs/whatif.md): Daydream's primitives on a job's global DFG, the
built-in what-ifs written with them, and scale-out (workers, servers, network, async PS).

    import dpro, dpro.whatif
    w = dpro.whatif.of(dpro.open("traces/"))   # a WhatIfGraph: select/scale/insert/remove/schedule/simulate
    w.select(lambda op: op.cat == "BW").scale(0.5)
    print(w.simulate().iteration_us)

Nothing is imported or computed at import time beyond these light modules.
"""

from dpro.whatif.graph import Op, Selection, WhatIfGraph, WhatIfResult
from dpro.whatif.registry import available, whatif
from dpro.whatif.view import of

__all__ = ["Op", "Selection", "WhatIfGraph", "WhatIfResult", "available", "of", "whatif"]
