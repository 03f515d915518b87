"""Candles -> feature frame: the indicators of ../shared/docs/families.md, vectorized, cached on disk.

Each indicator comes from `ta` where its implementation is vectorized (RSI, MACD, Bollinger bands,
ROC). ta's AverageTrueRange runs a Python loop over rows, so ATR is computed here with the same
Wilder smoothing through an exponentially weighted mean. Standard deviations are population ones
(ddof=0), as in ta's BollingerBands, so `volatility` is exactly bb_width_pct / 4 for equal windows
(V7 has both: collinear_columns() reports such pairs).

Warm-up rows, where an indicator is not yet defined, are dropped, never filled. The cache key is the
sha256 of the candles' bytes, the indicator spec, the ta/pandas/numpy versions and this file's
source, so an entry is never stale.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
from ta.momentum import ROCIndicator, RSIIndicator
from ta.trend import MACD
from ta.volatility import BollingerBands

from .config import (
    OHLCV,
    Atr,
    BbLower,
    BbPosition,
    BbUpper,
    BbWidthPct,
    FeaturesConfig,
    GarmanKlass,
    Macd,
    MacdSignal,
    Parkinson,
    Roc,
    Rsi,
    RunConfig,
    Volatility,
    VolumeNorm,
)
from .data import load_candles, store
from .errors import JobError
from .files import remove_abandoned_temp_files
from .jobs import Job

# What an entry depends on besides the candles and the spec: this code, the entry format and the libraries.
FEATURE_VERSION = store.make_key(
    Path(__file__).read_bytes(), store.code_digest(store), *(version(package) for package in ("ta", "pandas", "numpy"))
)


def compute_features(candles: pd.DataFrame, features: FeaturesConfig) -> pd.DataFrame:
    """OHLCV + one column per configured indicator (named indicator.name), warm-up rows dropped."""
    indicators = _Indicators(candles)
    names = [*OHLCV, *(spec.name for spec in features.indicators)]
    values = np.stack([*(candles[column].to_numpy(np.float64) for column in OHLCV),
                       *(getattr(indicators, spec.name)(spec) for spec in features.indicators)])  # columns x rows
    where = candles.attrs.get("source", "candles")
    defined = ~np.isnan(values).any(axis=0)
    if not defined.any():
        raise JobError(f"{where}: {values.shape[1]} candles are too few for the indicators to warm up")
    first = int(np.argmax(defined))
    values, index = np.ascontiguousarray(values[:, first:]), candles.index[first:]
    not_finite = ~np.isfinite(values)
    if not_finite.any():
        col, row = np.argwhere(not_finite)[0]
        jump = implausible_jump(candles)
        raise JobError(f"{where}: feature {names[col]} is undefined at {index[row]:%Y-%m-%d %H:%M} UTC "
                       f"({int(not_finite.any(axis=0).sum())} rows after the warm-up)"
                       + (f"; the candles are implausible: {jump}" if jump else ""))
    frame = store.frame_of_columns(values, names, index)
    frame.attrs = dict(candles.attrs)
    return frame


def load_features(candles: pd.DataFrame, features: FeaturesConfig, cache_dir: Path) -> tuple[pd.DataFrame, bool]:
    """compute_features, cached under cache_dir / "features"; the bool says whether it was a cache hit."""
    spec = json.dumps([indicator.model_dump(mode="json") for indicator in features.indicators], sort_keys=True)
    key = store.make_key(store.frame_digest(candles, OHLCV), spec, FEATURE_VERSION)
    directory = Path(cache_dir) / "features"
    frame = store.load(directory, key)
    if frame is not None:
        frame.attrs = dict(candles.attrs)
        return frame, True
    frame = compute_features(candles, features)
    store.save(directory, key, frame)
    return frame, False


def collinear_columns(frame: pd.DataFrame, columns: list[str],
                      threshold: float = 0.9999) -> list[tuple[str, str, float]]:
    """Pairs of columns that are (near-)exact linear functions of each other, with their correlation.

    Measured on bar-to-bar changes: a price-level series correlates at 0.9999 with any other one
    (open with close, bb_upper with close) through the shared trend alone, while changes correlate
    that well only when one column really is a * other + b."""
    changes = np.diff(frame[columns].to_numpy(np.float64), axis=0)
    # A constant column has no correlation; absurd candles overflow (their job fails, naming them).
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        corr = np.corrcoef(changes, rowvar=False)
    upper_i, upper_j = np.triu_indices(len(columns), k=1)
    return [(columns[i], columns[j], float(corr[i, j]))
            for i, j in zip(upper_i, upper_j) if abs(corr[i, j]) >= threshold]


# A bar-to-bar change of a price by this factor or more, either way, is taken for bad data, not a market move.
IMPLAUSIBLE_JUMP = 100.0


def implausible_jump(frame: pd.DataFrame) -> str | None:
    """The largest bar-to-bar change of a candle price (open, high, low, close) in `frame`, described, when it is a
    factor of IMPLAUSIBLE_JUMP or more: what to name when numbers computed from these candles overflow or
    training on them diverges. None when every change is plausible."""
    prices = frame[list(OHLCV[:4])].to_numpy(np.float64)  # validated: finite and positive
    change = np.abs(np.diff(np.log(prices), axis=0))
    if change.size == 0 or not change.max() >= np.log(IMPLAUSIBLE_JUMP):
        return None
    row, col = np.unravel_index(np.argmax(change), change.shape)
    return (f"{OHLCV[col]} goes from {prices[row, col]:.6g} to {prices[row + 1, col]:.6g} at "
            f"{frame.index[row + 1]:%Y-%m-%d %H:%M} UTC")


@dataclass(frozen=True)
class FeatureOutcome:
    """One job of `cryptotrain features`: its features ready (from the cache or computed), or why not."""
    job: Job
    hit: bool = False  # a cache hit, else computed (or failed)
    rows: int = 0
    columns: int = 0
    source: str = ""  # where the candles came from (their attrs["source"])
    error: str | None = None  # the job failed: why

    @property
    def failed(self) -> bool:
        return self.error is not None


def precompute(cfg: RunConfig, jobs: list[Job],
               on_job: Callable[[FeatureOutcome], None] | None = None) -> list[FeatureOutcome]:
    """`cryptotrain features`: compute and cache every job's features; a job that fails is reported in its
    outcome and the others go on. `on_job` is called with each job's outcome as soon as it is known."""
    remove_abandoned_temp_files(cfg.cache_path)  # what writes cut short by a kill left
    outcomes = []
    for job in jobs:
        try:
            candles = load_candles(cfg, job.symbol, job.timeframe)
            frame, hit = load_features(candles, cfg.features, cfg.cache_path)
        except JobError as exc:
            outcome = FeatureOutcome(job, error=str(exc))
        else:
            outcome = FeatureOutcome(job, hit, len(frame), len(frame.columns), candles.attrs["source"])
        outcomes.append(outcome)
        if on_job is not None:
            on_job(outcome)
    return outcomes


class _Indicators:
    """One method per indicator name, over one candle frame, each returning a float64 array aligned
    with the candles. Results shared by several indicators (Bollinger bands, MACD) are computed once
    per parameter set."""

    def __init__(self, candles: pd.DataFrame):
        # Bare series (default index, no attrs): pandas would deep-copy the frame's attrs into every
        # intermediate result, and compute_features puts the timestamps back anyway.
        self.open, self.high, self.low, self.close, self.volume = (
            pd.Series(candles[column].to_numpy(np.float64)) for column in OHLCV
        )
        self.times = candles.index
        self._bands: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._macds: dict[tuple[int, int, int], MACD] = {}

    def rsi(self, spec: Rsi) -> np.ndarray:
        return RSIIndicator(self.close, window=spec.window).rsi().to_numpy()

    def macd(self, spec: Macd) -> np.ndarray:
        return self._macd(spec.fast, spec.slow, MacdSignal.model_fields["signal"].default).macd().to_numpy()

    def signal(self, spec: MacdSignal) -> np.ndarray:
        return self._macd(spec.fast, spec.slow, spec.signal).macd_signal().to_numpy()

    def bb_upper(self, spec: BbUpper) -> np.ndarray:
        return self._bollinger(spec)[2]

    def bb_lower(self, spec: BbLower) -> np.ndarray:
        return self._bollinger(spec)[0]

    def bb_width_pct(self, spec: BbWidthPct) -> np.ndarray:
        """(upper - lower) / middle, a fraction as the old scripts had it (ta's wband is x100)."""
        lower, middle, upper = self._bollinger(spec)
        return (upper - lower) / middle

    def bb_position(self, spec: BbPosition) -> np.ndarray:
        """(close - lower) / (upper - lower) in [0, 1]; 0.5 where the bands collapse (a flat
        window: close is then the middle band itself)."""
        lower, _, upper = self._bollinger(spec)
        width = upper - lower
        with np.errstate(divide="ignore", invalid="ignore"):
            position = np.clip((self.close.to_numpy() - lower) / width, 0.0, 1.0)
        return np.where(width == 0, 0.5, position)

    def volatility(self, spec: Volatility) -> np.ndarray:
        """Rolling std / SMA of close; ddof=0 like ta's Bollinger bands."""
        rolling = self.close.rolling(spec.window)
        return rolling.std(ddof=0).to_numpy() / rolling.mean().to_numpy()

    def atr(self, spec: Atr) -> np.ndarray:
        """ta's AverageTrueRange without its row loop: the mean true range of the first `window`
        bars, then Wilder's smoothing atr[t] = atr[t-1] + (tr[t] - atr[t-1]) / window."""
        window = spec.window
        high, low, previous_close = self.high.to_numpy(), self.low.to_numpy(), self.close.shift(1).to_numpy()
        # fmax skips the NaN previous close of the first bar, as ta's DataFrame.max(axis=1) does.
        true_range = np.fmax(high - low, np.fmax(np.abs(high - previous_close), np.abs(low - previous_close)))
        seeded = np.full(len(true_range), np.nan)
        if len(true_range) >= window:
            seeded[window - 1] = true_range[:window].mean()
            seeded[window:] = true_range[window:]
        return pd.Series(seeded).ewm(alpha=1.0 / window, adjust=False).mean().to_numpy()

    def roc(self, spec: Roc) -> np.ndarray:
        return ROCIndicator(self.close, window=spec.window).roc().to_numpy()

    def volume_norm(self, spec: VolumeNorm) -> np.ndarray:
        """volume / SMA(volume); 1 where the average is 0 (a silent window: volume equals its average)."""
        average = self.volume.rolling(spec.window).mean().to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(average == 0, 1.0, self.volume.to_numpy() / average)

    def log_range(self, spec: object) -> np.ndarray:
        return np.log(self.high.to_numpy() / self.low.to_numpy())

    def parkinson(self, spec: Parkinson) -> np.ndarray:
        squared = pd.Series(self.log_range(spec) ** 2)
        return np.sqrt(squared.rolling(spec.window).mean().to_numpy() / (4 * np.log(2)))

    def garman_klass(self, spec: GarmanKlass) -> np.ndarray:
        """Clipped at 0: a candle whose body is long beside its range can make a window's mean negative."""
        body = np.log(self.close.to_numpy() / self.open.to_numpy())
        per_candle = pd.Series(0.5 * self.log_range(spec) ** 2 - (2 * np.log(2) - 1) * body**2)
        return np.sqrt(np.maximum(per_candle.rolling(spec.window).mean().to_numpy(), 0.0))

    def range_day(self, spec: object) -> np.ndarray:
        return self._mean_log_range(pd.Timedelta(days=1))

    def range_week(self, spec: object) -> np.ndarray:
        return self._mean_log_range(pd.Timedelta(days=7))

    def range_time_of_day(self, spec: object) -> np.ndarray:
        """The mean ln range of the candles so far (this one included) at the next candle's time of day: the
        next candle's slot is this row's slot + 1 (mod the slots of a day); a slot not seen yet is NaN, so the
        first day is warm-up."""
        spacing = self._spacing()
        slots = max(1, round(pd.Timedelta(days=1) / spacing))
        slot = (self._seconds_of_day() // spacing.total_seconds()).astype(np.int64) % slots
        log_range = self.log_range(spec)
        # running sums per slot, read at each row for the next slot
        onehot = np.zeros((len(slot), slots))
        onehot[np.arange(len(slot)), slot] = 1.0
        counts, sums = np.cumsum(onehot, axis=0), np.cumsum(onehot * log_range[:, None], axis=0)
        following = (slot + 1) % slots
        rows = np.arange(len(slot))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts[rows, following] > 0, sums[rows, following] / counts[rows, following], np.nan)

    def _mean_log_range(self, span: pd.Timedelta) -> np.ndarray:
        window = max(1, round(span / self._spacing()))
        return pd.Series(self.log_range(None)).rolling(window).mean().to_numpy()

    def _spacing(self) -> pd.Timedelta:
        """The candles' usual spacing (their timeframe): the median time between rows."""
        return (self.times[1:] - self.times[:-1]).median() if len(self.times) > 1 else pd.Timedelta(hours=1)

    def time_of_day_sin(self, spec: object) -> np.ndarray:
        return np.sin(self._angle(self._seconds_of_day(), 86400))

    def time_of_day_cos(self, spec: object) -> np.ndarray:
        return np.cos(self._angle(self._seconds_of_day(), 86400))

    def day_of_week_sin(self, spec: object) -> np.ndarray:
        return np.sin(self._angle(self._seconds_of_week(), 7 * 86400))

    def day_of_week_cos(self, spec: object) -> np.ndarray:
        return np.cos(self._angle(self._seconds_of_week(), 7 * 86400))

    def _seconds_of_day(self) -> np.ndarray:
        return (self.times.hour * 3600 + self.times.minute * 60 + self.times.second).to_numpy(np.float64)

    def _seconds_of_week(self) -> np.ndarray:
        """From Monday 00:00 UTC."""
        return self.times.dayofweek.to_numpy(np.float64) * 86400 + self._seconds_of_day()

    @staticmethod
    def _angle(seconds: np.ndarray, period: float) -> np.ndarray:
        return 2 * np.pi * seconds / period

    def _bollinger(self, spec: BbUpper | BbLower | BbWidthPct | BbPosition) -> tuple[np.ndarray, ...]:
        """(lower, middle, upper) bands."""
        key = (spec.window, spec.std)
        if key not in self._bands:
            bands = BollingerBands(self.close, window=spec.window, window_dev=spec.std)
            self._bands[key] = tuple(series.to_numpy() for series in (
                bands.bollinger_lband(), bands.bollinger_mavg(), bands.bollinger_hband()))
        return self._bands[key]

    def _macd(self, fast: int, slow: int, signal: int) -> MACD:
        """The macd line does not depend on `signal`; passing the default lets macd and signal share."""
        key = (fast, slow, signal)
        if key not in self._macds:
            self._macds[key] = MACD(self.close, window_slow=slow, window_fast=fast, window_sign=signal)
        return self._macds[key]
