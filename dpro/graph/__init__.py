"""The global data-flow graph: per-op statistics, communication model, builder."""
