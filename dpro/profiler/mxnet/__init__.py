"""The MXNet 1.x recorder, run inside the training job: :mod:`.backend` records a Gluon
worker (``mx.profiler``, kvstore keys, the hybridized symbol), :mod:`.memory` its static
arrays and trainers for memory estimation, and :mod:`.server` times each parameter server's
updates (:func:`dpro.profiler.mxnet.server.run_ps_node`). Nothing here is imported before
``dpro.Recorder`` is given a Gluon block or a server is started.
"""
