"""Raw rows -> clean candles: UTC timestamps, sorted, duplicates dropped, every row checked.

A row that cannot be a candle is an error naming the file, the row (1-based data row, header not
counted) and what is wrong; nothing is repaired silently. Only exact duplicate rows are dropped.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import JobError
from .store import frame_of_columns

OHLCV = ("open", "high", "low", "close", "volume")  # the columns of every candle frame

_TIMEFRAME_UNITS = {"m": "min", "h": "h", "d": "D"}


def timeframe_delta(timeframe: str) -> pd.Timedelta:
    """'15m' -> 15 minutes (the names are Binance's kline intervals)."""
    return pd.Timedelta(int(timeframe[:-1]), unit=_TIMEFRAME_UNITS[timeframe[-1]])


def validate(times: np.ndarray, columns: dict[str, np.ndarray], timeframe: str, where: str) -> pd.DataFrame:
    """A file's time column and OHLCV columns (any dtype, in file order) -> the candle frame:
    tz-aware UTC DatetimeIndex "timestamp" (ns), sorted and unique, float64 OHLCV columns."""
    if len(times) == 0:
        raise JobError(f"{where}: no candles in the file")
    rows = np.arange(1, len(times) + 1)  # data row numbers as the user sees them in the file
    stamps = _utc_nanoseconds(times, rows, where)
    values = np.stack([_numbers(columns[column]) for column in OHLCV])  # columns x rows
    _check_values(values, columns, stamps, rows, where)
    if (np.diff(stamps) <= 0).any():
        order = np.argsort(stamps, kind="stable")
        stamps, values, rows = _drop_exact_duplicates(stamps[order], values[:, order], rows[order], where)
    _check_spacing(stamps, rows, timeframe, where)
    index = pd.DatetimeIndex(stamps.view("datetime64[ns]"), name="timestamp").tz_localize("UTC")
    return frame_of_columns(values, list(OHLCV), index)


def count_gaps(index: pd.DatetimeIndex, timeframe: str) -> int:
    """Missing candles between the first and the last one (index sorted, on the timeframe's grid)."""
    if len(index) < 2:
        return 0
    span = (index[-1] - index[0]) // timeframe_delta(timeframe)
    return int(span + 1 - len(index))


def _utc_nanoseconds(times: np.ndarray, rows: np.ndarray, where: str) -> np.ndarray:
    """Datetimes (naive ones are UTC, as exchanges write them), epoch numbers or ISO strings ->
    int64 nanoseconds since the epoch, UTC."""
    if np.issubdtype(times.dtype, np.datetime64):
        parsed = pd.DatetimeIndex(times)
    elif np.issubdtype(times.dtype, np.number):
        parsed = pd.to_datetime(times, unit=_epoch_unit(times), errors="coerce")
    else:  # cache=False: pandas' cache of repeated strings only slows down unique timestamps
        parsed = pd.to_datetime(times, utc=True, format="ISO8601", errors="coerce", cache=False)
    bad = np.flatnonzero(parsed.isna())
    if bad.size:
        raise JobError(f"{where}: row {rows[bad[0]]}: timestamp {_shown(times[bad[0]])} is not a date "
                       f"({bad.size} bad timestamps in all)")
    # pandas parses years like -1 or 9999 at a coarser unit; nanoseconds hold only 1677-09-21 .. 2262-04-11.
    outside = np.flatnonzero(np.asarray((parsed < pd.Timestamp.min.tz_localize(parsed.tz))
                                        | (parsed > pd.Timestamp.max.tz_localize(parsed.tz))))
    if outside.size:
        raise JobError(f"{where}: row {rows[outside[0]]}: timestamp {_shown(times[outside[0]])} is out of range "
                       f"(years 1678 to 2261) ({outside.size} such timestamps in all)")
    return parsed.as_unit("ns").asi8


def _numbers(column: np.ndarray) -> np.ndarray:
    """float64; anything that is not a number becomes NaN, for _check_values to report."""
    if np.issubdtype(column.dtype, np.number):
        return column.astype(np.float64)
    return pd.to_numeric(column, errors="coerce").astype(np.float64)


def _epoch_unit(times: np.ndarray) -> str:
    """Epoch seconds, milliseconds (Binance's open_time), microseconds or nanoseconds, by magnitude."""
    largest = np.nanmax(np.abs(times.astype(np.float64)), initial=0.0)
    for unit, limit in (("s", 1e11), ("ms", 1e14), ("us", 1e17)):
        if largest < limit:
            return unit
    return "ns"


def _check_values(values: np.ndarray, columns: dict[str, np.ndarray], stamps: np.ndarray,
                  rows: np.ndarray, where: str) -> None:
    """Prices finite and positive, volume finite and not negative, high and low enclosing the body."""
    o, h, low, c, v = values
    checks = [  # (column, rows where it is wrong, what is wrong), reported in this order
        *((column, ~(np.isfinite(x) & (x > 0)), "is not a positive number") for column, x in zip(OHLCV[:4], values)),
        ("volume", ~(np.isfinite(v) & (v >= 0)), "is negative or not a number"),
        ("high", h < np.maximum(o, c), "is below max(open, close)"),
        ("low", low > np.minimum(o, c), "is above min(open, close)"),
    ]
    bad = np.logical_or.reduce([wrong for _, wrong, _ in checks])
    if bad.any():
        i = int(np.argmax(bad))
        column, what = next((column, what) for column, wrong, what in checks if wrong[i])
        row = " ".join(f"{name}={_shown(columns[name][i])}" for name in OHLCV)
        raise JobError(f"{where}: row {rows[i]} ({_when(stamps[i])}): {column} {what} [{row}] "
                       f"({int(bad.sum())} bad rows in all)")


def _drop_exact_duplicates(stamps: np.ndarray, values: np.ndarray, rows: np.ndarray,
                           where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted rows -> without rows equal to their predecessor; an equal time with other values is an error."""
    same_time = np.concatenate([[False], stamps[1:] == stamps[:-1]])
    same_values = np.concatenate([[False], (values[:, 1:] == values[:, :-1]).all(axis=0)])
    clash = np.flatnonzero(same_time & ~same_values)
    if clash.size:
        i = clash[0]
        raise JobError(f"{where}: rows {rows[i - 1]} and {rows[i]} both open at {_when(stamps[i])} "
                       "with different values")
    keep = ~same_time
    return stamps[keep], values[:, keep], rows[keep]


def _check_spacing(stamps: np.ndarray, rows: np.ndarray, timeframe: str, where: str) -> None:
    """Consecutive candles must lie a whole number of timeframes apart (more than one = a gap)."""
    step = timeframe_delta(timeframe).value
    spacing = np.diff(stamps)
    off_grid = np.flatnonzero(spacing % step != 0)
    if off_grid.size:
        i = off_grid[0]
        raise JobError(f"{where}: rows {rows[i]} and {rows[i + 1]} open {pd.Timedelta(int(spacing[i]))} apart, "
                       f"not a whole number of {timeframe} candles: is this really {timeframe} data?")
    typical = int(np.median(spacing)) if spacing.size else step
    if typical != step:
        raise JobError(f"{where}: candles are typically {pd.Timedelta(typical)} apart, not {timeframe}: "
                       f"is this really {timeframe} data?")


def _when(stamp_ns: int) -> str:
    return f"{pd.Timestamp(int(stamp_ns)):%Y-%m-%d %H:%M} UTC"


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)
