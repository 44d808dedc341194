"""What dpro shows people: terminal summaries (:mod:`.terminal`) and the self-contained
HTML report of ``dpro report`` (:mod:`.html`, docs/report.md)."""

from dpro.report.terminal import print_replay

__all__ = ["print_replay"]
