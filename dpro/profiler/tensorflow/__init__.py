"""The TensorFlow 2 recorder, run inside the training job: :mod:`.backend` (the TF profiler and
the executed graphs, converted in the rank by :mod:`dpro.importers.xplane`) and
:mod:`.compile_probe` (the model's gradients timed with and without XLA, with
``--measure-compile``). Nothing here is imported before ``dpro.Recorder`` is given a Keras model.
"""
