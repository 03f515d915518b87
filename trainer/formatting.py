"""Numbers as people read them, the same in the terminal (report/console.py), the HTML report and the model cards."""
from __future__ import annotations

import math


def number(value: object, spec: str, missing: str = "-") -> str:
    """`format(value, spec)`; `missing` where there is no number (None, NaN, infinite), e.g. the skill when
    persistence is exact (its MAE 0); anything else (text, a flag, a float given an integer spec) as str()."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    try:
        return format(value, spec)
    except ValueError:
        return str(value)


NO_DIRECTION = "—"  # the direction accuracy of a close that forecasts no direction (direction())


def direction(accuracy: float | None, shrink: float, spec: str = ".3f", missing: str = "-") -> str:
    """A close's direction accuracy; NO_DIRECTION where the close was shrunk to exactly "no change" (shrink 0):
    a forecast that is always the last close says no direction, and the share of moves it "got right" would be
    the share of flat closes - beside the majority rate it reads as always wrong."""
    return NO_DIRECTION if shrink == 0 else number(accuracy, spec, missing)
