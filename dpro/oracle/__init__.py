"""The analytical parallelism oracle (ParaDL, HPDC'21) on a prepared Job: docs/oracle.md."""

from __future__ import annotations

from dpro.oracle.formulas import STRATEGIES, Prediction
from dpro.oracle.oracle import OracleResult, run_oracle

__all__ = ["STRATEGIES", "OracleResult", "Prediction", "run_oracle"]
