"""Replay a global DFG: per-device Kahn simulation, critical path, breakdown, timeline."""
