"""Synthetic candles: deterministic per (seed, symbol, timeframe), valid, market-like, labelled."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tests.conftest import tiny_config_dict
from trainer.config import RunConfig
from trainer.data import load_candles
from trainer.data.validate import OHLCV, validate


def synthetic_cfg(tmp_path, seed: int = 7, rows: int = 3000, max_rows: int | None = None) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["data"].update(source="synthetic", synthetic={"seed": seed, "rows": rows}, max_rows=max_rows)
    return RunConfig.model_validate(raw)


def test_synthetic_candles_are_labelled_and_deterministic(tmp_path):
    cfg = synthetic_cfg(tmp_path)
    candles = load_candles(cfg, "BTCUSDT", "15m")
    assert candles.attrs == {"source": "synthetic(seed=7)", "synthetic": True, "gaps": 0}
    assert len(candles) == 3000 and list(candles.columns) == list(OHLCV)
    assert (np.diff(candles.index.asi8) == pd.Timedelta("15min").value).all()
    assert str(candles.index.tz) == "UTC" and candles.index.name == "timestamp"
    pd.testing.assert_frame_equal(load_candles(cfg, "BTCUSDT", "15m"), candles)

    others = [load_candles(synthetic_cfg(tmp_path, seed=8), "BTCUSDT", "15m"),
              load_candles(cfg, "ETHUSDT", "15m"), load_candles(cfg, "BTCUSDT", "1h")]
    for other in others:
        assert not np.allclose(other["close"].to_numpy()[:100], candles["close"].to_numpy()[:100])


def test_synthetic_candles_pass_validation_and_max_rows_keeps_the_latest(tmp_path):
    candles = load_candles(synthetic_cfg(tmp_path), "ETHUSDT", "1h")
    checked = validate(candles.index.to_numpy(), {c: candles[c].to_numpy() for c in OHLCV}, "1h", "synthetic")
    pd.testing.assert_frame_equal(checked, candles, check_freq=False)
    latest = load_candles(synthetic_cfg(tmp_path, max_rows=500), "ETHUSDT", "1h")
    pd.testing.assert_frame_equal(latest, candles.iloc[-500:])


def test_synthetic_returns_look_like_a_market(tmp_path):
    candles = load_candles(synthetic_cfg(tmp_path, rows=20_000), "SOLUSDT", "15m")
    returns = np.diff(np.log(candles["close"].to_numpy()))
    standardised = (returns - returns.mean()) / returns.std()
    # Real 15m series in ../shared: kurtosis 18-110, |return| lag-1 autocorrelation 0.27-0.34,
    # volume / |return| correlation 0.4-0.7, return lag-1 autocorrelation near 0.
    assert (standardised ** 4).mean() > 8.0  # fat tails: a normal distribution has kurtosis 3
    size = np.abs(returns)
    assert np.corrcoef(size[:-1], size[1:])[0, 1] > 0.15  # volatility clustering
    assert abs(np.corrcoef(returns[:-1], returns[1:])[0, 1]) < 0.05  # no free lunch in the sign
    assert np.corrcoef(candles["volume"].to_numpy()[1:], size)[0, 1] > 0.2
    np.testing.assert_array_equal(candles["open"].to_numpy()[1:], candles["close"].to_numpy()[:-1])
