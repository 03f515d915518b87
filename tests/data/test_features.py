"""Indicators against independent textbook computations on the real bundled candles, warm-up,
configured parameters, and collinearity detection."""
from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import pandas as pd
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from ta.volatility import AverageTrueRange

from tests.conftest import CANDLES_DIR, tiny_config_dict
from trainer.config import INDICATORS, FeaturesConfig, RunConfig
from trainer.data import read_candles_file
from trainer.data.features import collinear_columns, compute_features
from trainer.data.indicators import Candles, Indicator
from trainer.data.validate import OHLCV
from trainer.data.windows import make_windows
from trainer.errors import JobError

SERIES = ["BTCUSDT_1h", "DOGEUSDT_15m"]
V8_STABLE = FeaturesConfig(indicators=[{"name": name} for name in INDICATORS])  # every indicator, defaults


@pytest.fixture(scope="module", params=SERIES)
def candles(request) -> pd.DataFrame:
    symbol, timeframe = request.param.split("_")
    return read_candles_file(CANDLES_DIR / f"{request.param}.csv.gz", timeframe)


# ----------------------------------------------------------------------------- references (loops are fine here)
def wilder(values: np.ndarray, window: int, start: int) -> np.ndarray:
    """Wilder's smoothing seeded with the mean of values[start - window + 1 .. start]."""
    out = np.full(len(values), np.nan)
    out[start] = values[start - window + 1:start + 1].mean()
    for t in range(start + 1, len(values)):
        out[t] = (out[t - 1] * (window - 1) + values[t]) / window
    return out


def reference_rsi(close: np.ndarray, window: int) -> np.ndarray:
    change = np.concatenate([[np.nan], np.diff(close)])
    gain, loss = wilder(np.clip(change, 0, None), window, window), wilder(np.clip(-change, 0, None), window, window)
    return 100 - 100 / (1 + gain / loss)


def ema(values: np.ndarray, span: int) -> np.ndarray:
    """EMA with alpha 2 / (span + 1), started at the first defined value."""
    alpha, out = 2 / (span + 1), np.full(len(values), np.nan)
    first = int(np.argmax(~np.isnan(values)))
    out[first] = values[first]
    for t in range(first + 1, len(values)):
        out[t] = alpha * values[t] + (1 - alpha) * out[t - 1]
    return out


def rolling(values: np.ndarray, window: int, statistic) -> np.ndarray:
    out = np.full(len(values), np.nan)
    out[window - 1:] = statistic(sliding_window_view(values, window), axis=1)
    return out


def true_range(candles: pd.DataFrame) -> np.ndarray:
    high, low, close = (candles[c].to_numpy() for c in ("high", "low", "close"))
    previous = np.concatenate([[np.nan], close[:-1]])
    ranges = np.stack([high - low, np.abs(high - previous), np.abs(low - previous)])
    ranges[1:, 0] = 0.0  # the first bar has no previous close: its true range is high - low
    return ranges.max(axis=0)


def references(candles: pd.DataFrame) -> dict[str, np.ndarray]:
    open_, high, low = (candles[c].to_numpy() for c in ("open", "high", "low"))
    close, volume = candles["close"].to_numpy(), candles["volume"].to_numpy()
    mean, std = rolling(close, 20, np.mean), rolling(close, 20, np.std)  # np.std: population, ddof 0
    upper, lower = mean + 2 * std, mean - 2 * std
    macd = ema(close, 12) - ema(close, 26)
    macd[:25] = np.nan  # defined once the slow EMA has seen 26 closes
    shifted = np.concatenate([np.full(12, np.nan), close[:-12]])
    return {
        "rsi": reference_rsi(close, 14),
        "macd": macd,
        "signal": ema(macd, 9),
        "bb_upper": upper,
        "bb_lower": lower,
        "bb_width_pct": (upper - lower) / mean,
        "bb_position": np.clip((close - lower) / (upper - lower), 0, 1),
        "volatility": std / mean,
        "atr": wilder(true_range(candles), 14, 13),
        "roc": (close - shifted) / shifted * 100,
        "volume_norm": volume / rolling(volume, 20, np.mean),
        "volume_surprise": np.log(volume) - rolling(np.log(volume), per_day(candles), np.mean),  # no zero volume
        "log_range": np.log(high / low),
        "parkinson": np.sqrt(rolling(np.log(high / low) ** 2, 20, np.mean) / (4 * np.log(2))),
        "garman_klass": np.sqrt(rolling(0.5 * np.log(high / low) ** 2 - (2 * np.log(2) - 1)
                                        * np.log(close / open_) ** 2, 20, np.mean)),
        **cyclic(candles.index),
        **har_regressors(candles),
    }


def har_regressors(candles: pd.DataFrame) -> dict[str, np.ndarray]:
    """Means of ln(high / low) over the last day and week of rows, and, row by row, over the rows so far whose
    time of day is the next row's."""
    log_range = np.log(candles["high"].to_numpy() / candles["low"].to_numpy())
    day = per_day(candles)
    clock = candles.index.strftime("%H:%M")
    following = (candles.index + (candles.index[1] - candles.index[0])).strftime("%H:%M")
    next_slot = np.full(len(candles), np.nan)
    for row in range(len(candles)):
        same = log_range[:row + 1][clock[:row + 1] == following[row]]
        next_slot[row] = same.mean() if len(same) else np.nan
    return {"range_day": rolling(log_range, day, np.mean), "range_week": rolling(log_range, 7 * day, np.mean),
            "range_time_of_day": next_slot}


def per_day(candles: pd.DataFrame) -> int:
    return round(pd.Timedelta(days=1) / (candles.index[1] - candles.index[0]))


def cyclic(times: pd.DatetimeIndex) -> dict[str, np.ndarray]:
    """From the timestamps' text (HH:MM and the weekday's name), not from pandas' fields."""
    hours = np.array([int(t[:2]) + int(t[3:5]) / 60 for t in times.strftime("%H:%M")])
    days = np.array([["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].index(d) for d in times.strftime("%a")])
    day, week = 2 * np.pi * hours / 24, 2 * np.pi * (days + hours / 24) / 7
    return {"time_of_day_sin": np.sin(day), "time_of_day_cos": np.cos(day),
            "day_of_week_sin": np.sin(week), "day_of_week_cos": np.cos(week)}


# ----------------------------------------------------------------------------- tests
def test_every_indicator_matches_an_independent_computation(candles):
    features = compute_features(candles, V8_STABLE)
    expected = pd.DataFrame(references(candles), index=candles.index).loc[features.index]
    # RSI: ta seeds its smoothing at the first bar, the textbook after `window` bars; the difference
    # decays as (13/14)^n and is below 1e-8 after 300 bars.
    burn_in = features.index[300:]
    for name in INDICATORS:
        rows = burn_in if name == "rsi" else features.index
        np.testing.assert_allclose(features.loc[rows, name], expected.loc[rows, name], rtol=1e-9, atol=1e-8,
                                   err_msg=name)


def test_no_indicator_reads_a_later_candle(candles):
    """Shift the future: every candle after row t changed (prices scaled, volumes scaled or zero), and no
    indicator's value at row t or before moves."""
    features = compute_features(candles, V8_STABLE)
    t = len(candles) - 200
    later = candles.copy()
    rng = np.random.default_rng(3)
    later.iloc[t + 1:, :4] *= rng.uniform(0.5, 2.0, (len(candles) - t - 1, 1))
    later.iloc[t + 1:, 4] *= rng.choice([0.0, 0.3, 5.0], len(candles) - t - 1)
    shifted = compute_features(later, V8_STABLE)
    until = features.index <= candles.index[t]
    pd.testing.assert_frame_equal(shifted[until], features[until])
    assert not np.allclose(shifted.loc[~until, "volume_surprise"], features.loc[~until, "volume_surprise"])


def test_volume_surprise_of_no_trading_is_finite():
    """A zero volume counts as the smallest positive volume so far: finite, and as low as that volume."""
    index = pd.date_range("2024-01-01", periods=72, freq="1h", tz="UTC", name="timestamp")
    volume = np.r_[0.0, np.full(30, 4.0), 2.0, np.zeros(40)]
    close = np.linspace(100, 110, 72)
    candles = pd.DataFrame({"open": close, "high": close * 1.01, "low": close * 0.99, "close": close,
                            "volume": volume}, index=index)
    surprise = compute_features(candles, FeaturesConfig(indicators=[{"name": "volume_surprise"}]))["volume_surprise"]
    assert surprise.index[0] == index[24]  # a day of candles from the first positive volume
    assert np.isfinite(surprise).all()
    assert surprise.iloc[-1] == pytest.approx(0.0)  # a day of zeros counted as 2.0 each: no surprise
    assert surprise[index[40]] < 0  # zeros counted as 2.0 after a day of mostly 4.0


def test_time_features_are_cyclic_and_ranges_never_negative(candles):
    spec = FeaturesConfig(indicators=[{"name": n} for n in ("time_of_day_sin", "time_of_day_cos", "day_of_week_sin",
                                                            "day_of_week_cos", "garman_klass", "log_range")])
    features = compute_features(candles, spec)
    day = features[["time_of_day_sin", "time_of_day_cos"]].to_numpy()
    week = features[["day_of_week_sin", "day_of_week_cos"]].to_numpy()
    np.testing.assert_allclose((day**2).sum(axis=1), 1.0)  # on the unit circle: 23:45 is next to 00:00
    step = pd.Timedelta(features.index[1] - features.index[0])
    one_day, one_week = pd.Timedelta(days=1) // step, pd.Timedelta(days=7) // step
    continuous = features.index[one_week:] - features.index[:-one_week] == pd.Timedelta(days=7)
    np.testing.assert_allclose(day[one_week:][continuous], day[:-one_week][continuous], atol=1e-12)
    np.testing.assert_allclose(week[one_week:][continuous], week[:-one_week][continuous], atol=1e-12)
    assert not np.allclose(week[one_day:one_day + 10], week[:10])  # a day later is another day of the week
    assert (features["garman_klass"] >= 0).all() and (features["log_range"] >= 0).all()


def test_vectorized_atr_equals_ta_average_true_range(candles):
    features = compute_features(candles, FeaturesConfig(indicators=[{"name": "atr", "window": 10}]))
    ta_atr = AverageTrueRange(candles["high"], candles["low"], candles["close"], window=10).average_true_range()
    np.testing.assert_allclose(features["atr"], ta_atr.loc[features.index], rtol=1e-12)
    assert features.index[0] == candles.index[9]  # ta's zeros before its first value are warm-up


def test_warm_up_rows_are_dropped_and_nothing_else(candles):
    features = compute_features(candles, V8_STABLE)
    assert list(features.columns) == [*OHLCV, *INDICATORS]  # no duplicated or missing column
    # The longest warm-up: range_week needs a week of candles.
    week = round(pd.Timedelta(days=7) / (candles.index[1] - candles.index[0]))
    assert features.index[0] == candles.index[week - 1]
    assert features.index.equals(candles.index[week - 1:])
    assert np.isfinite(features.to_numpy()).all()
    pd.testing.assert_frame_equal(features[list(OHLCV)], candles.iloc[week - 1:])
    # Without the day- and week-long ones (volume_surprise too), signal's: 26 closes for the slow EMA, then 9 MACD
    # values.
    without = FeaturesConfig(indicators=[{"name": n} for n in INDICATORS
                                          if not n.startswith("range_") and n != "volume_surprise"])
    assert compute_features(candles, without).index[0] == candles.index[26 + 9 - 2]
    assert features.attrs == candles.attrs


def test_parameters_come_from_the_config(candles):
    spec = FeaturesConfig(indicators=[{"name": "rsi", "window": 7}, {"name": "roc", "window": 3},
                                      {"name": "bb_upper", "window": 10, "std": 3.0}])
    features = compute_features(candles, spec)
    close = candles["close"].to_numpy()
    expected_upper = rolling(close, 10, np.mean) + 3 * rolling(close, 10, np.std)
    expected_roc = np.concatenate([np.full(3, np.nan), (close[3:] - close[:-3]) / close[:-3] * 100])
    expected = pd.DataFrame({"rsi": reference_rsi(close, 7), "roc": expected_roc, "bb_upper": expected_upper},
                            index=candles.index).loc[features.index]
    assert features.index[0] == candles.index[9]
    np.testing.assert_allclose(features["roc"], expected["roc"], rtol=1e-9)
    np.testing.assert_allclose(features["bb_upper"], expected["bb_upper"], rtol=1e-9)
    np.testing.assert_allclose(features["rsi"].iloc[300:], expected["rsi"].iloc[300:], atol=1e-8)


def test_flat_windows_have_defined_position_and_volume_ratio():
    index = pd.date_range("2024-01-01", periods=80, freq="1h", tz="UTC", name="timestamp")
    close = np.r_[np.linspace(100, 120, 40), np.full(40, 120.0)]  # 40 flat bars: the bands collapse
    volume = np.r_[np.linspace(5, 9, 40), np.zeros(40)]  # and no trading at all
    candles = pd.DataFrame({"open": close, "high": close, "low": close, "close": close, "volume": volume},
                           index=index)
    features = compute_features(candles, FeaturesConfig(indicators=[
        {"name": "bb_position"}, {"name": "volume_norm"}, {"name": "volatility"}]))
    flat = features.index >= index[60]
    assert (features.loc[flat, "bb_position"] == 0.5).all()
    assert (features.loc[flat, "volume_norm"] == 1.0).all()
    assert (features.loc[flat, "volatility"] == 0.0).all()
    assert features["bb_position"].between(0, 1).all()


def test_too_few_candles_for_the_warm_up_is_a_job_error(candles):
    with pytest.raises(JobError, match="30 candles are too few for the indicators to warm up"):
        compute_features(candles.iloc[:30], V8_STABLE)


def test_collinear_columns_finds_volatility_and_bb_width_only(candles):
    features = compute_features(candles, V8_STABLE)
    pairs = collinear_columns(features, list(features.columns))
    assert [(a, b) for a, b, _ in pairs] == [("bb_width_pct", "volatility")]
    assert pairs[0][2] == pytest.approx(1.0, abs=1e-9)
    # Price levels (open vs close, bb_upper vs close) share a trend but are not collinear.
    assert collinear_columns(features, ["open", "close", "bb_upper", "bb_lower"]) == []


@pytest.fixture
def typical_price():
    """A new indicator, added as a user would: this one class, nothing else."""
    class TypicalPrice(Indicator):
        """(high + low + close) / 3: a price, so framed like one."""
        framing: ClassVar[str] = "level"
        name: Literal["typical_price"]

        def compute(self, candles: Candles) -> np.ndarray:
            return ((candles.high + candles.low + candles.close) / 3).to_numpy()

    yield TypicalPrice
    del Indicator.kinds["typical_price"]


def test_a_new_indicator_is_one_class(tmp_path, typical_price):
    indicators = [{"name": "typical_price"}, *tiny_config_dict(tmp_path)["features"]["indicators"]]
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, features={"indicators": indicators}))
    frame = compute_features(read_candles_file(CANDLES_DIR / "BTCUSDT_1h.csv.gz", "1h"), cfg.features)
    np.testing.assert_allclose(frame["typical_price"], frame[["high", "low", "close"]].mean(axis=1), rtol=1e-12)
    windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, {"ohlc": (3, 4), "bb": (3, 2)})
    framing = windows.preprocessing.framing
    assert framing.level[framing.columns.index("typical_price")] == 1.0  # log of its ratio to the last close
