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
