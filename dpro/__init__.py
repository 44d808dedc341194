"""dpro: profile, replay and optimize distributed DNN training.

The package does no work at import time; import the submodules you need
(`dpro.gtrace`, `dpro.importers.kineto`, `dpro.graph`, `dpro.replayer`).
"""

__version__ = "0.1.0"
