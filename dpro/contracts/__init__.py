"""Contracts between the parts of dpro that write a file or an environment and the parts that
read it: names, suffixes and keys, defined once and imported by both sides.

Modules here import nothing from dpro above :mod:`dpro.errors` and :mod:`dpro.jsonio`.
"""
