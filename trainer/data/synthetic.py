"""Seeded synthetic candles for demos and tests: always labelled synthetic, never a substitute.

Log returns are fat-tailed (Student t, 4 degrees of freedom) with a slowly wandering volatility
(an AR(1) log-volatility, so calm and turbulent stretches cluster like real markets). Each candle
opens at the previous close; wicks extend beyond the body; volume rises with the size of the move.
The same (seed, symbol, timeframe, rows) always gives the same candles.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from .validate import timeframe_delta

# The last candle closes here whatever the day: results from a seed never depend on the clock.
END = pd.Timestamp("2024-06-01", tz="UTC")
DAILY_VOLATILITY = (0.02, 0.05)  # range of typical daily moves, drawn per series
# Log-volatility AR(1): with these, |return| autocorrelations (lag 1 about 0.25, lag 50 about 0.09) and
# kurtosis (20-60) resemble the real 15m series in ../shared/data/ohlcv (0.27-0.34, 0.08-0.14, 18-110).
LOG_VOL_PERSISTENCE = 0.98
LOG_VOL_STD = 0.7


def synthetic_candles(symbol: str, timeframe: str, seed: int, rows: int) -> pd.DataFrame:
    rng = np.random.default_rng([seed, _stable_int(symbol), _stable_int(timeframe)])
    step = timeframe_delta(timeframe)
    bar_sigma = rng.uniform(*DAILY_VOLATILITY) * np.sqrt(step / pd.Timedelta(days=1))
    sigma = bar_sigma * np.exp(_ar1(rng.standard_normal(rows), LOG_VOL_PERSISTENCE, LOG_VOL_STD))
    shocks = rng.standard_t(4, rows) / np.sqrt(2.0)  # unit variance: a t(4) has variance 2
    returns = sigma * shocks

    start = 10 ** rng.uniform(-1, 4.5)
    close = start * np.exp(np.cumsum(returns))
    open_ = np.concatenate([[start], close[:-1]])
    upper_wick, lower_wick = 0.6 * sigma * np.abs(rng.standard_normal((2, rows)))
    volume = 10 ** rng.uniform(2, 6) * np.exp(0.4 * rng.standard_normal(rows)) * (1 + np.abs(shocks))
    index = pd.date_range(end=END - step, periods=rows, freq=step, name="timestamp").as_unit("ns")
    return pd.DataFrame({
        "open": open_,
        "high": np.maximum(open_, close) * np.exp(upper_wick),
        "low": np.minimum(open_, close) * np.exp(-lower_wick),
        "close": close,
        "volume": volume,
    }, index=index)


def _ar1(noise: np.ndarray, persistence: float, std: float) -> np.ndarray:
    """x[t] = persistence * x[t-1] + innovation[t], stationary with the given std, from the first
    value on. An exponentially weighted mean (adjust=False) is exactly this recursion, vectorized."""
    alpha = 1.0 - persistence
    innovation_std = std * np.sqrt(1.0 - persistence ** 2) / alpha  # ewm scales innovations by alpha
    scaled = noise * innovation_std
    scaled[0] = noise[0] * std  # start in the stationary distribution
    return pd.Series(scaled).ewm(alpha=alpha, adjust=False).mean().to_numpy()


def _stable_int(text: str) -> int:
    """A per-name seed component that, unlike hash(), is the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
