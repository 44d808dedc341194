"""Measure what XLA buys a TensorFlow model: its forward + backward as a ``tf.function``,
and the same function with ``jit_compile=True``.

Opt-in, as for PyTorch (``dpro profile --measure-compile`` or ``DPRO_MEASURE_COMPILE=1``;
:mod:`dpro.profiler.pytorch.compile_probe`). From the recorder's creation, the model's
``call`` is wrapped to keep the static shape and dtype of its first input (seen when the
step function is traced, before the window); after the window, inputs of that signature
(normal floats, zero ids) go through the model with ``training=True`` and the gradients
of the outputs' sum are taken, once as a graph and once compiled by XLA, interleaved,
:data:`REPEATS` times each, medians. The non-trainable variables (batch-norm statistics) are restored afterwards;
the gradients are not applied.

Written to ``rank<r>.meta.json["compile"]``: ``{"": {"class", "eager_us", "compiled_us",
"compiler": "xla", "compiled_median_us"}}``: ``eager_us`` is the graph's median and
``compiled_us`` that × the median ratio of the adjacent pairs (the model only: on TensorFlow dpro's op fusion is XLA of the whole
gradient computation, :func:`dpro.optimizer.optimize.xla_strategy`).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

log = logging.getLogger(__name__)

#: timed calls of each (interleaved): a model's step is milliseconds on a CPU, and one rank's
#: XLA / graph ratio moved 0.85-1.31 between runs of 7
REPEATS = 31


class XlaProbe:
    """Keeps the model's input signature; times its gradients with and without XLA."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.spec: tuple[tuple[int, ...], Any] | None = None

    def start(self) -> None:
        """Wrap ``model.call`` to see the first input's static shape (at trace time)."""
        orig = self.model.call

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.spec is None and args and hasattr(args[0], "shape") and hasattr(args[0], "dtype"):
                shape = tuple(args[0].shape)
                if all(isinstance(d, int) for d in shape):
                    self.spec = (shape, args[0].dtype)
            return orig(*args, **kwargs)

        self.model.call = call

    def measure(self) -> dict[str, dict]:
        """``{"": {...}}`` as in the module docstring; ``{}`` when it cannot be measured."""
        import tensorflow as tf

        if self.spec is None:
            log.warning("dpro: the model's input shape was not seen (fully known) in the window: XLA not measured")
            return {}
        shape, dtype = self.spec
        x = tf.random.normal(shape, dtype=dtype) if dtype.is_floating else tf.zeros(shape, dtype=dtype)
        model = self.model
        keep = [(v, tf.identity(v)) for v in model.non_trainable_variables]

        def grads(x: Any) -> Any:
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in tf.nest.flatten(out)])
            return loss, tape.gradient(loss, model.trainable_variables)

        graph, xla = tf.function(grads), tf.function(grads, jit_compile=True)
        try:
            for f in (graph, xla, graph, xla):  # trace and compile, warm up
                f(x)[0].numpy()
            times: dict[str, list[float]] = {"eager_us": [], "compiled_us": []}
            for _ in range(REPEATS):
                for key, f in (("eager_us", graph), ("compiled_us", xla)):
                    t0 = time.perf_counter()
                    f(x)[0].numpy()
                    times[key].append((time.perf_counter() - t0) * 1e6)
        except Exception as e:  # noqa: BLE001 - a model XLA cannot compile is reported, not fatal
            log.warning("dpro: the model was not measured under XLA: %s", e)
            return {}
        finally:
            for v, val in keep:
                v.assign(val)
        # the ratio of each adjacent pair: this VM runs in fast and slow phases lasting
        # seconds, which a pair shares and a ratio of two medians does not cancel
        eager = statistics.median(times["eager_us"])
        ratio = statistics.median(c / e for e, c in zip(times["eager_us"], times["compiled_us"]))
        return {"": {"class": type(model).__name__, "compiler": "xla", "eager_us": eager, "compiled_us": eager * ratio,
                     "compiled_median_us": statistics.median(times["compiled_us"])}}
