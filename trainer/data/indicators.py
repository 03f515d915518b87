"""The indicators a family can list under features.indicators: each one a class that knows its parameters,
how to compute itself from a candle frame, and how windows frame its column (../shared/docs/families.md).

One entry per output column; the entry's `name` is both the indicator kind and the column name (names as the
old scripts used them). A new indicator is one class here: a subclass of Indicator with `name` a Literal, its
parameters as fields, `compute` and, for a price or a price difference, `framing`.

Each indicator comes from `ta` where its implementation is vectorized (RSI, MACD, Bollinger bands, ROC).
ta's AverageTrueRange runs a Python loop over rows, so ATR is computed here with the same Wilder smoothing
through an exponentially weighted mean. Standard deviations are population ones (ddof=0), as in ta's
BollingerBands, so `volatility` is exactly bb_width_pct / 4 for equal windows (V7 has both:
features.collinear_columns reports such pairs).
"""
from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field
from ta.momentum import ROCIndicator, RSIIndicator
from ta.trend import MACD
from ta.volatility import BollingerBands

from ..specs import Kind
from .validate import OHLCV

DAY = pd.Timedelta(days=1)


class Candles:
    """One candle frame's columns as float64 series, its times, and what several indicators share, computed
    once per parameter set (Bollinger bands, MACD)."""

    def __init__(self, frame: pd.DataFrame):
        # Bare series (default index, no attrs): pandas would deep-copy the frame's attrs into every
        # intermediate result, and compute_features puts the timestamps back anyway.
        self.open, self.high, self.low, self.close, self.volume = (
            pd.Series(frame[column].to_numpy(np.float64)) for column in OHLCV
        )
        self.times = frame.index
        self._bands: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._macds: dict[tuple[int, int, int], MACD] = {}

    def bollinger(self, window: int, std: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower, middle, upper) bands."""
        key = (window, std)
        if key not in self._bands:
            bands = BollingerBands(self.close, window=window, window_dev=std)
            self._bands[key] = tuple(series.to_numpy() for series in (
                bands.bollinger_lband(), bands.bollinger_mavg(), bands.bollinger_hband()))
        return self._bands[key]

    def macd(self, fast: int, slow: int, signal: int) -> MACD:
        """The macd line does not depend on `signal`; passing the default lets macd and signal share."""
        key = (fast, slow, signal)
        if key not in self._macds:
            self._macds[key] = MACD(self.close, window_slow=slow, window_fast=fast, window_sign=signal)
        return self._macds[key]

    def log_range(self) -> np.ndarray:
        return np.log(self.high.to_numpy() / self.low.to_numpy())

    def mean_log_range(self, span: pd.Timedelta) -> np.ndarray:
        return self.trailing_mean(self.log_range(), span)

    def trailing_mean(self, values: np.ndarray, span: pd.Timedelta) -> np.ndarray:
        """The mean of `values` over the last `span` of rows (in candles of the series' spacing), the row itself
        included; NaN until there are that many."""
        window = max(1, round(span / self.spacing()))
        return pd.Series(values).rolling(window).mean().to_numpy()

    def spacing(self) -> pd.Timedelta:
        """The candles' usual spacing (their timeframe): the median time between rows."""
        return (self.times[1:] - self.times[:-1]).median() if len(self.times) > 1 else pd.Timedelta(hours=1)

    def seconds_of_day(self) -> np.ndarray:
        return (self.times.hour * 3600 + self.times.minute * 60 + self.times.second).to_numpy(np.float64)

    def seconds_of_week(self) -> np.ndarray:
        """From Monday 00:00 UTC."""
        return self.times.day_of_week.to_numpy(np.float64) * 86400 + self.seconds_of_day()


class Indicator(Kind):
    """One feature column computed from the candles. `framing`, with window.relative_to set: "level" for a
    price (log of its ratio to the last close), "difference" for a difference of prices (divided by the last
    close), "unitless" for the rest (as it is)."""
    tag: ClassVar[str] = "name"
    framing: ClassVar[Literal["level", "difference", "unitless"]] = "unitless"
    name: str

    def compute(self, candles: Candles) -> np.ndarray:
        """A float64 array aligned with the candles; NaN in the warm-up rows."""
        raise NotImplementedError(f"indicator {self.name} has no compute()")


class Rsi(Indicator):
    name: Literal["rsi"]
    window: int = Field(14, gt=1)

    def compute(self, candles: Candles) -> np.ndarray:
        return RSIIndicator(candles.close, window=self.window).rsi().to_numpy()


class Macd(Indicator):
    framing: ClassVar[str] = "difference"
    name: Literal["macd"]
    fast: int = Field(12, gt=0)
    slow: int = Field(26, gt=0)

    def compute(self, candles: Candles) -> np.ndarray:
        return candles.macd(self.fast, self.slow, MacdSignal.model_fields["signal"].default).macd().to_numpy()


class MacdSignal(Indicator):
    framing: ClassVar[str] = "difference"
    name: Literal["signal"]
    fast: int = Field(12, gt=0)
    slow: int = Field(26, gt=0)
    signal: int = Field(9, gt=0)

    def compute(self, candles: Candles) -> np.ndarray:
        return candles.macd(self.fast, self.slow, self.signal).macd_signal().to_numpy()


class _Bollinger(Indicator):
    window: int = Field(20, gt=1)
    std: float = Field(2.0, gt=0)

    def bands(self, candles: Candles) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return candles.bollinger(self.window, self.std)


class BbUpper(_Bollinger):
    framing: ClassVar[str] = "level"
    name: Literal["bb_upper"]

    def compute(self, candles: Candles) -> np.ndarray:
        return self.bands(candles)[2]


class BbLower(_Bollinger):
    framing: ClassVar[str] = "level"
    name: Literal["bb_lower"]

    def compute(self, candles: Candles) -> np.ndarray:
        return self.bands(candles)[0]


class BbWidthPct(_Bollinger):
    """(upper - lower) / middle, a fraction as the old scripts had it (ta's wband is x100)."""
    name: Literal["bb_width_pct"]

    def compute(self, candles: Candles) -> np.ndarray:
        lower, middle, upper = self.bands(candles)
        return (upper - lower) / middle


class BbPosition(_Bollinger):
    """(close - lower) / (upper - lower) in [0, 1]; 0.5 where the bands collapse (a flat window: close is then
    the middle band itself)."""
    name: Literal["bb_position"]

    def compute(self, candles: Candles) -> np.ndarray:
        lower, _, upper = self.bands(candles)
        width = upper - lower
        with np.errstate(divide="ignore", invalid="ignore"):
            position = np.clip((candles.close.to_numpy() - lower) / width, 0.0, 1.0)
        return np.where(width == 0, 0.5, position)


class Volatility(Indicator):
    """Rolling std / SMA of close; ddof=0 like ta's Bollinger bands."""
    name: Literal["volatility"]
    window: int = Field(20, gt=1)

    def compute(self, candles: Candles) -> np.ndarray:
        rolling = candles.close.rolling(self.window)
        return rolling.std(ddof=0).to_numpy() / rolling.mean().to_numpy()


class Atr(Indicator):
    """ta's AverageTrueRange without its row loop: the mean true range of the first `window` bars, then
    Wilder's smoothing atr[t] = atr[t-1] + (tr[t] - atr[t-1]) / window."""
    framing: ClassVar[str] = "difference"
    name: Literal["atr"]
    window: int = Field(14, gt=1)

    def compute(self, candles: Candles) -> np.ndarray:
        window = self.window
        high, low, previous_close = candles.high.to_numpy(), candles.low.to_numpy(), candles.close.shift(1).to_numpy()
        # fmax skips the NaN previous close of the first bar, as ta's DataFrame.max(axis=1) does.
        true_range = np.fmax(high - low, np.fmax(np.abs(high - previous_close), np.abs(low - previous_close)))
        seeded = np.full(len(true_range), np.nan)
        if len(true_range) >= window:
            seeded[window - 1] = true_range[:window].mean()
            seeded[window:] = true_range[window:]
        return pd.Series(seeded).ewm(alpha=1.0 / window, adjust=False).mean().to_numpy()


class Roc(Indicator):
    name: Literal["roc"]
    window: int = Field(12, gt=0)

    def compute(self, candles: Candles) -> np.ndarray:
        return ROCIndicator(candles.close, window=self.window).roc().to_numpy()


class VolumeNorm(Indicator):
    """volume / SMA(volume); 1 where the average is 0 (a silent window: volume equals its average)."""
    name: Literal["volume_norm"]
    window: int = Field(20, gt=1)

    def compute(self, candles: Candles) -> np.ndarray:
        average = candles.volume.rolling(self.window).mean().to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(average == 0, 1.0, candles.volume.to_numpy() / average)


class VolumeSurprise(Indicator):
    """ln(volume) minus its mean over the last day of candles, this one included (a day in candles of the
    series' spacing, as range_day): how unusual this candle's trading is, which HAR's ranges do not see
    (../shared/docs/forecasting.md "the information HAR lacks"). A zero volume counts as the smallest positive
    volume so far (never ln 0); before the first positive volume the row is warm-up."""
    name: Literal["volume_surprise"]

    def compute(self, candles: Candles) -> np.ndarray:
        volume = candles.volume.to_numpy()
        smallest = pd.Series(np.where(volume > 0, volume, np.nan)).cummin().ffill().to_numpy()  # so far
        log_volume = np.log(np.maximum(volume, smallest))  # NaN while no volume was positive yet
        return log_volume - candles.trailing_mean(log_volume, DAY)


# The size of candles: what volatility clustering makes predictable (docs/model-quality.md, "The baselines").
class LogRange(Indicator):
    """ln(high / low) of the candle itself."""
    name: Literal["log_range"]

    def compute(self, candles: Candles) -> np.ndarray:
        return candles.log_range()


class Parkinson(Indicator):
    """Parkinson's range-based volatility over `window` candles: sqrt(mean(ln(high / low)^2) / (4 ln 2))."""
    name: Literal["parkinson"]
    window: int = Field(20, gt=0)

    def compute(self, candles: Candles) -> np.ndarray:
        squared = pd.Series(candles.log_range() ** 2)
        return np.sqrt(squared.rolling(self.window).mean().to_numpy() / (4 * np.log(2)))


class GarmanKlass(Indicator):
    """Garman-Klass volatility over `window` candles: sqrt(mean(ln(high / low)^2 / 2 - (2 ln 2 - 1)
    ln(close / open)^2)); clipped at 0: a candle whose body is long beside its range can make a window's mean
    negative."""
    name: Literal["garman_klass"]
    window: int = Field(20, gt=0)

    def compute(self, candles: Candles) -> np.ndarray:
        body = np.log(candles.close.to_numpy() / candles.open.to_numpy())
        per_candle = pd.Series(0.5 * candles.log_range() ** 2 - (2 * np.log(2) - 1) * body**2)
        return np.sqrt(np.maximum(per_candle.rolling(self.window).mean().to_numpy(), 0.0))


# HAR's regressors (Corsi 2009), computed from the candles up to each row (nothing to fit): the mean ln range
# over the last day and the last week (in candles of the series' spacing), and the mean ln range so far of the
# candles at the next candle's time of day.
class RangeDay(Indicator):
    name: Literal["range_day"]

    def compute(self, candles: Candles) -> np.ndarray:
        return candles.mean_log_range(DAY)


class RangeWeek(Indicator):
    name: Literal["range_week"]

    def compute(self, candles: Candles) -> np.ndarray:
        return candles.mean_log_range(7 * DAY)


class RangeTimeOfDay(Indicator):
    """The mean ln range of the candles so far (this one included) at the next candle's time of day: the next
    candle's slot is this row's slot + 1 (mod the slots of a day); a slot not seen yet is NaN, so the first day
    is warm-up."""
    name: Literal["range_time_of_day"]

    def compute(self, candles: Candles) -> np.ndarray:
        spacing = candles.spacing()
        slots = max(1, round(DAY / spacing))
        slot = (candles.seconds_of_day() // spacing.total_seconds()).astype(np.int64) % slots
        log_range = candles.log_range()
        # running sums per slot, read at each row for the next slot
        onehot = np.zeros((len(slot), slots))
        onehot[np.arange(len(slot)), slot] = 1.0
        counts, sums = np.cumsum(onehot, axis=0), np.cumsum(onehot * log_range[:, None], axis=0)
        following = (slot + 1) % slots
        rows = np.arange(len(slot))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts[rows, following] > 0, sums[rows, following] / counts[rows, following], np.nan)


# When a candle is: the daily and weekly rhythm of volatility, cyclic (sin and cos: 23:00 is next to 00:00).
class _Cyclic(Indicator):
    """The sine or cosine of the candle's time within a day (or, with `week`, a week from Monday 00:00 UTC)."""
    week: ClassVar[bool] = False
    cosine: ClassVar[bool] = False

    def compute(self, candles: Candles) -> np.ndarray:
        seconds, period = (candles.seconds_of_week(), 7 * 86400) if self.week else (candles.seconds_of_day(), 86400)
        angle = 2 * np.pi * seconds / period
        return np.cos(angle) if self.cosine else np.sin(angle)


class TimeOfDaySin(_Cyclic):
    name: Literal["time_of_day_sin"]


class TimeOfDayCos(_Cyclic):
    cosine: ClassVar[bool] = True
    name: Literal["time_of_day_cos"]


class DayOfWeekSin(_Cyclic):
    week: ClassVar[bool] = True
    name: Literal["day_of_week_sin"]


class DayOfWeekCos(_Cyclic):
    week: ClassVar[bool] = True
    cosine: ClassVar[bool] = True
    name: Literal["day_of_week_cos"]
