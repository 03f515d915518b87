"""The baselines' names (trainer.evaluation.baselines says what each one forecasts), as metrics.json keeps them.
A module of its own: what only names a baseline (the records, and through them the run ledger) loads without
pandas - each of the processes that race for a run's jobs imports the ledger."""
from __future__ import annotations

from enum import Enum


class Baseline(str, Enum):
    """The point forecasts' names (trainer.evaluation.baselines' docstring), as metrics.json keeps them."""
    NO_CHANGE = "no_change"
    PERSISTENCE = "persistence"
    EWMA = "ewma"
    HAR_TOD = "har_tod"
    HAR_TOD_RMS = "har_tod_rms"
    HAR_TOD_LEVEL = "har_tod_level"
    HAR_TOD_LEVEL_RMS = "har_tod_level_rms"
    HARX = "harx"
    HARX_RMS = "harx_rms"
    HARX_LEVEL = "harx_level"
    HARX_LEVEL_RMS = "harx_level_rms"

    def __str__(self) -> str:
        return self.value
