"""Build config for the compiled replay core (everything else is in pyproject.toml).

``dpro.replayer._core`` is a plain C extension (no numpy headers: arrays come in through the
buffer protocol, so one build serves numpy 1.x and 2.x). It is optional: if the compiler
fails, the install goes on and dpro uses its Python engine (``dpro replay`` says so).
"""

import sys

from setuptools import Extension, setup

# bit-identical to the Python reference: no fused multiply-add, no fast-math reassociation
ARGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("dpro.replayer._core", ["dpro/replayer/_core.c"], extra_compile_args=ARGS, optional=True),
    # the Kineto reader's per-event loop (dpro/importers/kineto/read.py falls back to Python without it)
    Extension("dpro.importers.kineto._collect", ["dpro/importers/kineto/_collect.c"], extra_compile_args=ARGS,
              optional=True),
    # one thread's CPU segments (dpro/importers/kineto/segments.py falls back to Python without it)
    Extension("dpro.importers.kineto._segments", ["dpro/importers/kineto/_segments.c"], extra_compile_args=ARGS,
              optional=True),
])
