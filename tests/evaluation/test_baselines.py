"""Baselines (trainer/evaluation/baselines.py): nothing from the future, fitted on the train split only, HAR recovers a
known process, quantiles ordered, HAR alone as predict uses it, the combination."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import CANDLES_DIR
from trainer.data import read_candles_file
from trainer.data.settings import WindowConfig
from trainer.data.windows import Windows, make_windows
from trainer.errors import JobError
from trainer.evaluation import baselines as bl
from trainer.heads import CANDLE, CandleHead

HORIZON = 3


def split(candles: pd.DataFrame, lookback: int = 24, horizon: int = HORIZON) -> Windows:
    """The job's samples as the project splits them (70 / 15 / 15 %)."""
    head = CandleHead(kind="candle", name="ohlc", columns=list(CANDLE))
    return make_windows(candles, WindowConfig(lookback=lookback, horizon=horizon), list(CANDLE), [head],
                        {"ohlc": (horizon, len(CANDLE))})


def fit(candles: pd.DataFrame, windows: Windows, timeframe: str = "1h") -> bl.Baselines:
    return bl.fit_baselines(candles, timeframe, windows.preprocessing.horizon, windows.train.first_target_rows,
                            windows.val.first_target_rows)


def every_forecast(fitted: bl.Baselines, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Every point, quantile and volatility forecast of the baselines for these samples, by name."""
    found = {}
    for kind, nested in (("point", fitted.forecast(rows)), ("quantiles", fitted.quantile_forecasts(rows))):
        found |= {f"{kind} {name} {q}": a for name, by_quantity in nested.items() for q, a in by_quantity.items()}
    return found | {f"volatility {name}": v for name, v in fitted.volatility(rows).items()}


def perturbed(candles: pd.DataFrame, start: int, seed: int = 3) -> pd.DataFrame:
    """The candles with every row from `start` on replaced: rows of that future shuffled and moved 30 % up."""
    out = candles.copy()
    rows = np.random.default_rng(seed).permutation(np.arange(start, len(candles)))
    out.iloc[start:, :4] = candles.iloc[rows, :4].to_numpy() * 1.3
    return out


@pytest.fixture(scope="module")
def candles() -> pd.DataFrame:
    return read_candles_file(CANDLES_DIR / "BTCUSDT_1h.csv.gz", "1h")


@pytest.mark.parametrize("where", ["first test sample", "middle of the test split"])
def test_forecasts_use_nothing_at_or_after_the_first_target_row(candles, where):
    windows = split(candles)
    test = windows.test.first_target_rows
    cut = test[0] if where == "first test sample" else test[len(test) // 2]
    before = fit(candles, windows)
    after = fit(perturbed(candles, cut), windows)

    # Samples whose first target row is the cut or earlier: their inputs end before it.
    known = test[test <= cut]
    assert not np.array_equal(before.actual(known)["range"], after.actual(known)["range"])  # their targets moved
    for name, forecast in every_forecast(before, known).items():
        np.testing.assert_array_equal(forecast, every_forecast(after, known)[name], err_msg=name)
    # Later samples see the new rows: every forecast that reads the past moves.
    later = test[test > cut + 2 * HORIZON]
    moved = {name for name, forecast in every_forecast(before, later).items()
             if not np.allclose(forecast, every_forecast(after, later)[name])}
    assert moved == {name for name in every_forecast(before, later) if "no_change" not in name and "static" not in name}


def test_fitted_on_the_train_split_only_and_chosen_on_validation(candles):
    windows = split(candles)
    train_end = windows.train.first_target_rows[-1] + HORIZON  # the first row after the train split
    val_end = windows.val.first_target_rows[-1] + HORIZON
    base = fit(candles, windows)
    fitted_on_train = ("floor", "har_coefficients", "time_of_day", "har_log_variance", "excursion_shares", "static")

    def same(a: bl.Baselines, b: bl.Baselines, fields: tuple[str, ...]) -> bool:
        def equal(x, y):
            return all(equal(x[k], y[k]) for k in x) if isinstance(x, dict) else np.array_equal(x, y)
        return all(equal(getattr(a, f), getattr(b, f)) for f in fields)

    assert same(base, fit(perturbed(candles, train_end), windows), fitted_on_train)
    # Test rows changed: the EWMA alphas and the scaled quantiles, chosen on validation, stay too.
    assert same(base, fit(perturbed(candles, val_end), windows), (*fitted_on_train, "ewma_alphas", "scaled"))
    # One train candle a bit wider moves the fit: the comparisons above could fail.
    wider = candles.copy()
    wider.iloc[train_end // 2, wider.columns.get_loc("high")] *= 1.01
    assert not same(base, fit(wider, windows), ("har_coefficients",))


def har_candles(last: float, day: float, week: float, time_of_day: float, rows: int = 40_000,
                seed: int = 5) -> pd.DataFrame:
    """Hourly candles whose log range is  -6 + d[t] + time_of_day x sin(2 pi hour / 24), with d a HAR process:
    d[t] = last d[t-1] + day (mean of d over the last 24) + week (over the last 168) + N(0, 0.3^2). The day and
    week means of the log range are those of d (a sine sums to 0 over whole days)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(0, 0.3, rows)
    for t in range(168, rows):
        d[t] += last * d[t - 1] + day * d[t - 24:t].mean() + week * d[t - 168:t].mean()
    log_range = -6 + d + time_of_day * np.sin(2 * np.pi * np.arange(rows) / 24)
    width = np.exp(log_range)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.5, rows) * width))
    index = pd.date_range("2024-01-01", periods=rows, freq="1h", tz="UTC", name="timestamp")
    return pd.DataFrame({"open": close, "high": close * np.exp(width / 2), "low": close * np.exp(-width / 2),
                         "close": close}, index=index)


# (last, day, week, time of day) -> the regression's coefficients of HAR_TERMS[1:]. With a time-of-day effect
# the last candle's term is 0: its range would carry the previous hour's effect, which the regression (on the
# target hour's mean) does not hold. The tolerances are 4 standard errors of the estimates at these sizes
# (OLS: last 0.006, day 0.016 / 0.03, week 0.02 / 0.055, time of day 0.008); without a time-of-day effect its
# mean per hour is noise, collinear with the intercept, and not checked.
@pytest.mark.parametrize("process, expected, tolerance", [
    ((0.4, 0.3, 0.2, 0.0), (0.4, 0.3, 0.2, None), (0.025, 0.065, 0.08, None)),
    ((0.0, 0.3, 0.2, 0.5), (0.0, 0.3, 0.2, 1.0), (0.025, 0.12, 0.22, 0.032)),
])
def test_har_recovers_the_coefficients_of_a_known_process(process, expected, tolerance):
    candles = har_candles(*process)
    fitted = fit(candles, split(candles, lookback=168, horizon=1))
    for term, got, want, within in zip(bl.HAR_TERMS[1:], fitted.har_coefficients[0, 1:], expected, tolerance):
        if want is not None:
            assert abs(got - want) < within, f"{term}: {got:.3f}, expected {want} +- {within}"


def test_quantiles_are_ordered_and_forecasts_exist_after_the_last_row(candles):
    windows = split(candles)
    fitted = fit(candles, windows)
    for name, by_quantity in fitted.quantile_forecasts(windows.test.first_target_rows).items():
        for q, quantiles in by_quantity.items():
            assert quantiles.shape == (len(bl.LEVELS), len(windows.test), HORIZON)
            assert (np.diff(quantiles, axis=0) > 0).all(), f"{name} {q}"
    after_last = every_forecast(fitted, np.array([len(candles)]))  # what `predict` shows
    assert all(np.isfinite(forecast).all() for forecast in after_last.values())
    # The excursions' HAR forecasts are shares of the range's, below it.
    har = fitted.forecast(windows.test.first_target_rows)[bl.Baseline.HAR_TOD]
    assert (har["high"] < har["range"]).all() and (har["low"] < har["range"]).all()


def test_har_alone_forecasts_after_any_candles_as_fitted_and_round_trips_through_json(candles):
    """What `predict` uses (har.json): from the candles up to an origin - a week of them is enough - the same
    forecast as the fitted baselines' at that origin, through to_dict / from_dict."""
    windows = split(candles)
    fitted = fit(candles, windows)
    har = bl.Har.from_dict(json.loads(json.dumps(fitted.har_tod.to_dict())))
    for row in windows.test.first_target_rows[[0, 37, -1]]:
        week_before = candles.iloc[row - 200:row]  # rows up to the origin row - 1: more than a week
        forecast = har.forecast(week_before)
        expected = fitted.forecast(np.array([row]))
        for quantity in ("range", "high", "low"):
            np.testing.assert_allclose(forecast[quantity], expected[bl.Baseline.HAR_TOD][quantity][0], rtol=1e-9,
                                       err_msg=quantity)
        np.testing.assert_allclose(forecast["range_rms"], expected[bl.Baseline.HAR_TOD_RMS]["range"][0], rtol=1e-9)
        volatility = fitted.volatility(np.array([row]))
        np.testing.assert_allclose(forecast["volatility"]["har"], volatility["har"][0], rtol=1e-9)
        # The EWMA starts over at the week's first candle: its start-up weight, 0.94^168 = 3e-5, is all that differs.
        for name in ("ewma", "har_ewma"):
            np.testing.assert_allclose(forecast["volatility"][name], volatility[name][0], rtol=1e-4, err_msg=name)


def test_a_har_heads_input_uses_nothing_at_or_after_the_target_and_predict_sees_the_same(candles):
    """What a HAR head reads beside each window (Baselines.har_inputs, at its origin): HAR's high, low and
    root-mean-square range, from rows up to the origin only; and predict (Har.inputs after the candles up to the
    origin) computes the same."""
    windows = split(candles)
    test = windows.test.first_target_rows
    cut = test[len(test) // 2]
    before = fit(candles, windows).har_inputs()
    after = fit(perturbed(candles, cut), windows).har_inputs()
    assert before.shape == (len(candles), HORIZON, 3) and np.all(before > 0)
    np.testing.assert_array_equal(before[:cut], after[:cut])  # origins before the first changed row: unmoved
    assert not np.allclose(before[cut:], after[cut:])  # the origins that see the new rows move
    fitted = fit(candles, windows)
    np.testing.assert_allclose(before[:, :, 2],
                               fitted.forecast(np.arange(1, len(candles) + 1))[bl.Baseline.HAR_TOD_RMS]["range"])
    har = bl.Har.from_dict(json.loads(json.dumps(fitted.har_tod.to_dict())))
    for origin in test[[0, -1]] - 1:
        np.testing.assert_allclose(har.inputs(candles.iloc[:origin + 1]), before[[origin]], rtol=1e-9)


def test_a_combination_weighs_each_forecast_by_what_it_adds_on_validation():
    rng = np.random.default_rng(3)
    actual = rng.gamma(2.0, 0.005, (20_000, 2))
    baseline = actual + rng.normal(0, 0.004, actual.shape)
    assert bl.combination_weights([actual, baseline], actual)[0].tolist() == [1.0, 1.0]  # the truth needs no baseline
    unrelated = 4 * rng.permutation(actual)  # unrelated to the actual values, and far too large
    assert bl.combination_weights([unrelated, baseline], actual).tolist() == [[0.0, 0.0], [1.0, 1.0]]
    # Two forecasts as good as each other with independent errors: each weighs about a half.
    other = actual + rng.normal(0, 0.004, actual.shape)
    assert np.allclose(bl.combination_weights([other, baseline], actual), 0.5, atol=0.1)
    # Three: the useless one gets nothing, the two good ones about a half each; the weights sum to 1 at every step
    weights = bl.combination_weights([unrelated, other, baseline], actual)
    assert weights[0].tolist() == [0.0, 0.0] and np.allclose(weights[1:], 0.5, atol=0.1)
    np.testing.assert_allclose(weights.sum(axis=0), 1.0)


def test_candles_with_a_timestamp_column_and_bad_candles(candles):
    windows = split(candles)
    rows = windows.test.first_target_rows
    as_column = fit(candles.reset_index(), windows)
    np.testing.assert_array_equal(as_column.forecast(rows)[bl.Baseline.HAR_TOD]["range"],
                                  fit(candles, windows).forecast(rows)[bl.Baseline.HAR_TOD]["range"])
    with pytest.raises(JobError, match="no times"):
        fit(candles.reset_index(drop=True), windows)
    broken = candles.copy()
    broken.iloc[100, broken.columns.get_loc("low")] = 0.0
    with pytest.raises(JobError, match=r"low is 0 at 2.*prices must be positive"):
        fit(broken, windows)


def test_harx_adds_the_networks_extra_inputs_to_har_linearly_fitted_on_train(candles):
    """HAR-X is HAR + time of day with the inputs the network reads beyond HAR's terms (a volume surprise, the
    market's range) as regressors, fitted on the train split: an input that knows the next candle's range makes it
    far better than HAR on the test split, one of noise leaves it at HAR's level; without such columns there is no
    HAR-X. Like HAR, it uses nothing at or after a sample's first target row."""
    windows = split(candles)
    test = windows.test.first_target_rows
    log_range = np.log(np.log(candles["high"] / candles["low"]).clip(lower=1e-6))
    rng = np.random.default_rng(0)

    def mae(fitted: bl.Baselines, name: bl.Baseline) -> float:
        return float(np.mean(np.abs(fitted.forecast(test)[name]["range"][:, 0] - fitted.actual(test)["range"][:, 0])))

    assert bl.Baseline.HARX not in fit(candles, windows).points
    informed = fit(candles.assign(volume_surprise=log_range.shift(-1).fillna(0) + rng.normal(0, 0.3, len(candles))),
                   windows)
    assert 1 - mae(informed, bl.Baseline.HARX) / mae(informed, bl.Baseline.HAR_TOD) > 0.15
    noise = fit(candles.assign(volume_surprise=rng.normal(size=len(candles)),
                               market_range=rng.normal(size=len(candles))), windows)
    assert abs(1 - mae(noise, bl.Baseline.HARX) / mae(noise, bl.Baseline.HAR_TOD)) < 0.01
    for name in (bl.Baseline.HARX, bl.Baseline.HARX_RMS, bl.Baseline.HARX_LEVEL, bl.Baseline.HARX_LEVEL_RMS):
        assert all(np.isfinite(v[test]).all() for v in noise.points[name].values())
    # causal: changing the inputs from the first test sample's targets on changes no forecast made before them
    cut = test[len(test) // 2]
    later = candles.assign(volume_surprise=rng.normal(size=len(candles)), market_range=rng.normal(size=len(candles)))
    later.iloc[cut:, -2:] = 99.0
    changed = fit(later, windows)
    unchanged = fit(later.assign(**{c: later[c].where(np.arange(len(later)) < cut, -99.0)
                                    for c in ("volume_surprise", "market_range")}), windows)
    before = test[test <= cut]
    np.testing.assert_array_equal(changed.forecast(before)[bl.Baseline.HARX]["range"],
                                  unchanged.forecast(before)[bl.Baseline.HARX]["range"])


def test_a_stored_fit_reads_back_bit_for_bit_harx_and_all(candles, tmp_path):
    """cached_baselines: the second call reads the first's fit from the cache, every array equal, HAR-X's inputs and
    its Har (what predict forecasts with) included; other inputs make another entry."""
    windows = split(candles)
    rng = np.random.default_rng(1)
    frame = candles.assign(volume_surprise=rng.normal(size=len(candles)))
    rows = windows.train.first_target_rows, windows.val.first_target_rows
    first = bl.cached_baselines(tmp_path, frame, "1h", HORIZON, *rows)
    again = bl.cached_baselines(tmp_path, frame, "1h", HORIZON, *rows)
    assert len(list((tmp_path / "baselines").iterdir())) == 1
    flat, back = first.to_arrays(), again.to_arrays()
    assert flat.keys() == back.keys() and all(np.array_equal(flat[k], back[k], equal_nan=True) for k in flat)
    assert again.harx_inputs == ("volume_surprise",)
    assert again.harx.to_dict() == bl.Har.from_dict(json.loads(json.dumps(first.harx.to_dict()))).to_dict()
    assert again.harx.to_dict()["terms"][-1] == "volume_surprise"
    np.testing.assert_allclose(again.harx.forecast(frame)["range"],
                               first.forecast(np.array([len(frame)]))[bl.Baseline.HARX]["range"][0], rtol=1e-9)
    bl.cached_baselines(tmp_path, frame.assign(volume_surprise=0.0), "1h", HORIZON, *rows)
    assert len(list((tmp_path / "baselines").iterdir())) == 2


def test_baselines_held_from_the_validation_split_on_forecast_its_samples_and_the_tests_as_before(candles):
    """Baselines.since, what a job's evaluation is handed (a third of its rows): at the validation and test samples
    (and after the last row) every forecast and actual value is the whole fit's, bit for bit; a sample before it is
    refused, not read from another row."""
    windows = split(candles)
    fitted = fit(candles, windows)
    held = fitted.since(windows.val.first_target_rows[0])
    for rows in (windows.val.first_target_rows, windows.test.first_target_rows, np.array([len(candles)])):
        whole, part = every_forecast(fitted, rows), every_forecast(held, rows)
        assert whole.keys() == part.keys()
        for name, values in whole.items():
            np.testing.assert_array_equal(part[name], values, err_msg=name)
        for quantity, values in fitted.actual(rows).items():
            np.testing.assert_array_equal(held.actual(rows)[quantity], values)
    with pytest.raises(ValueError, match="none at"):
        held.forecast(windows.train.first_target_rows[-1:])
