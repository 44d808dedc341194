"""Horovod inside a recorded job (PyTorch or TensorFlow binding): :mod:`.runtime` starts and
stops Horovod's timeline for the profiling window and reads the job's fusion settings;
:mod:`.writer` keeps Horovod's timeline writer thread off the job's CPUs. The timeline is
read offline by :mod:`dpro.importers.horovod`.
"""
