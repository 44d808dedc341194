"""The PyTorch recorder, run inside the training job: :mod:`.backend` (torch.profiler, layer and
DDP-bucket annotations, the rank's meta.json), :mod:`.memory` (optimizers and static tensors
for memory estimation) and :mod:`.compile_probe` (blocks timed eagerly and under
``torch.compile`` with ``--measure-compile``). Nothing here is imported before
``dpro.Recorder`` is given a torch model.
"""
