"""The market input (features.market): at each of a job's rows, what other series' candles at the same time say
about the market's volatility, which HAR on the job's own candles cannot see (../shared/docs/forecasting.md, "the
information HAR lacks": +0.017 QLIKE on the range).

The column market_range at row t is the median, over the reference series that have a candle at exactly t's open
time, of that candle's ln(ln(high / low)) - the log range floored at the series' smallest positive range, as HAR's
- minus the series' own mean of it. Floor and mean are each series' own, fitted on its candles at the job's train
rows (the first window.split.train of the rows the job keeps, as make_windows splits them), stored with the job
(Preprocessing.market) for predict. Candles are matched on their exact open time: a reference candle of a later
time never enters a row, nor one of an earlier time (no forward filling).

The rows a job keeps: from the first to the last row at whose time some reference series has a candle (a reference
series with none among the job's rows, or none among its train rows, is left out). The job fails, in one line
naming how many rows overlap and with which series, where fewer than half of its rows are kept, or where some row
inside them has no reference candle at all: never a column of zeros or gaps. A job's references are read through
the same data source and cache as its own candles (load_candles); the column is added after the feature cache, so
a cached frame never holds a stale one.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import JobError
from . import load_candles
from .settings import MARKET_COLUMN

if TYPE_CHECKING:
    from .settings import RunSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reference:
    """A reference series as a job uses it: its symbol, the smallest positive log range and the mean of
    ln(max(log range, floor)) of its candles at the job's train rows."""
    symbol: str
    floor: float
    mean: float

    def to_dict(self) -> dict:
        return {"symbol": self.symbol, "floor": self.floor, "mean": self.mean}

    @classmethod
    def from_dict(cls, values: dict) -> Reference:
        return cls(str(values["symbol"]), float(values["floor"]), float(values["mean"]))


def load_references(cfg: RunSettings, symbol: str, timeframe: str) -> dict[str, pd.DataFrame]:
    """The candles of a job's reference series (features.market), from the run's data source and cache. A listed
    series that cannot be read fails the job (its JobError names the file); with `symbols: run`, a symbol whose
    candles cannot be read is left out (its own job fails, naming them)."""
    market = cfg.features.market
    references = {}
    for reference in market.references(cfg.data.symbols, symbol):
        try:
            references[reference] = load_candles(cfg, reference, timeframe)
        except JobError as exc:
            if market.symbols != "run":
                raise JobError(f"market reference {reference}: {exc}") from None
            log.info("%s_%s: market reference %s left out: %s", symbol, timeframe, reference, exc)
    return references


def add_market(frame: pd.DataFrame, references: dict[str, pd.DataFrame],
               train: float) -> tuple[pd.DataFrame, tuple[Reference, ...]]:
    """A job's feature rows -> the rows it keeps with the column market_range, and its references fitted on the
    first `train` share of those rows (module doc). JobError where too few rows overlap."""
    ranges = _aligned(frame.index, references)
    overlap = {symbol: int(np.isfinite(r).sum()) for symbol, r in ranges.items()}
    used = [symbol for symbol, rows in overlap.items() if rows]
    while True:
        first, last = _span(ranges, used)
        train_end = first + round((last + 1 - first) * train)
        fitted = [symbol for symbol in used if (ranges[symbol][first:train_end] > 0).any()]
        if fitted == used:
            break
        used = fitted
    kept = last + 1 - first if used else 0
    if kept < len(frame) / 2:
        raise JobError(f"{_where(frame)}: the market input has {kept} of the job's {len(frame)} rows at times where "
                       f"a reference series has a candle ({_counts(overlap)}); it needs at least half: list "
                       "series of the same period under features.market.symbols")
    levels = tuple(_fit(symbol, ranges[symbol][first:train_end]) for symbol in used)
    return _joined(frame.iloc[first:last + 1], {s: ranges[s][first:last + 1] for s in used}, levels), levels


def apply_market(frame: pd.DataFrame, references: dict[str, pd.DataFrame],
                 levels: tuple[Reference, ...]) -> pd.DataFrame:
    """predict: the candles' feature rows with the column market_range, from the references' candles and the levels
    fitted when the job trained; the rows from the first to the last one a reference candle covers (a forecast
    follows the last candle whose market input is known: the caller says so where later candles are left out).
    JobError where no row is covered."""
    missing = [level.symbol for level in levels if level.symbol not in references]
    if missing:
        raise JobError(f"{_where(frame)}: the market input needs the candles of {', '.join(missing)}")
    references = {level.symbol: references[level.symbol] for level in levels}
    ranges = _aligned(frame.index, references)
    first, last = _span(ranges, list(ranges))
    if last < first:
        lasts = ", ".join(f"{s} {c.index[-1]:%Y-%m-%d %H:%M}" if len(c) else f"{s} none"
                          for s, c in references.items())
        raise JobError(f"{_where(frame)}: the market input has no candle of a reference series at the times of these "
                       f"candles (the last {frame.index[-1]:%Y-%m-%d %H:%M} UTC); their last candles: {lasts}")
    return _joined(frame.iloc[first:last + 1], {s: r[first:last + 1] for s, r in ranges.items()}, levels)


def _aligned(index: pd.DatetimeIndex, references: dict[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """symbol -> ln(high / low) of its candle at each of `index`'s times exactly; NaN where it has none."""
    return {symbol: pd.Series(np.log(c["high"].to_numpy(np.float64) / c["low"].to_numpy(np.float64)), index=c.index)
            .reindex(index).to_numpy() for symbol, c in references.items()}


def _span(ranges: dict[str, np.ndarray], symbols: list[str]) -> tuple[int, int]:
    """The first and last row where one of `symbols` has a candle; (0, -1) where none has."""
    covered = np.zeros(len(next(iter(ranges.values()), [])), bool)
    for symbol in symbols:
        covered |= np.isfinite(ranges[symbol])
    rows = np.flatnonzero(covered)
    return (int(rows[0]), int(rows[-1])) if len(rows) else (0, -1)


def _fit(symbol: str, train_ranges: np.ndarray) -> Reference:
    present = train_ranges[np.isfinite(train_ranges)]
    floor = float(present[present > 0].min())
    return Reference(symbol, floor, float(np.log(np.maximum(present, floor)).mean()))


def _joined(frame: pd.DataFrame, ranges: dict[str, np.ndarray], levels: tuple[Reference, ...]) -> pd.DataFrame:
    """`frame` with market_range appended: per row, the median of the references' demeaned ln log range (module
    doc). JobError naming the first row no reference candle covers."""
    demeaned = np.stack([np.log(np.maximum(ranges[level.symbol], level.floor)) - level.mean for level in levels])
    covered = np.isfinite(demeaned).any(axis=0)
    if not covered.all():
        holes = np.flatnonzero(~covered)
        raise JobError(f"{_where(frame)}: no reference series of the market input ({', '.join(ranges)}) has a candle "
                       f"at {frame.index[holes[0]]:%Y-%m-%d %H:%M} UTC ({len(holes)} of the {len(frame)} rows from "
                       f"{frame.index[0]:%Y-%m-%d %H:%M} on)")
    joined = frame.assign(**{MARKET_COLUMN: np.nanmedian(demeaned, axis=0)})
    joined.attrs = dict(frame.attrs)
    return joined


def _counts(overlap: dict[str, int]) -> str:
    """How many of the job's rows each reference series has a candle at, e.g. "ETHUSDT 812, SOLUSDT 40; none from
    2 other series"."""
    some = ", ".join(f"{symbol} {rows}" for symbol, rows in sorted(overlap.items(), key=lambda item: -item[1]) if rows)
    none = sum(1 for rows in overlap.values() if not rows)
    if not some:
        return f"none from its {none} reference series"
    return some + (f"; none from {none} other series" if none else "")


def _where(frame: pd.DataFrame) -> str:
    return frame.attrs.get("source", "candles")
