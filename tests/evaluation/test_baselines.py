"""Baselines (trainer/evaluation/baselines.py): nothing from the future, fitted on the train split only, HAR recovers a
known process, a conformal interval covers its nominal rate, quantiles ordered, the scores."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from tests.conftest import CANDLES_DIR
from trainer.data import read_candles_file
from trainer.data.settings import CANDLE, HeadConfig, WindowConfig
from trainer.data.windows import Windows, make_windows
from trainer.errors import JobError
from trainer.evaluation import baselines as bl

HORIZON = 3


def split(candles: pd.DataFrame, lookback: int = 24, horizon: int = HORIZON) -> Windows:
    """The job's samples as the project splits them (70 / 15 / 15 %)."""
    head = HeadConfig(name="ohlc", columns=list(CANDLE), candle=True)
    return make_windows(candles, WindowConfig(lookback=lookback, horizon=horizon), list(CANDLE), [head],
                        {"ohlc": (horizon, len(CANDLE))})


def fit(candles: pd.DataFrame, windows: Windows, timeframe: str = "1h") -> bl.Baselines:
    return bl.fit_baselines(candles, timeframe, windows.preprocessing.horizon, windows.train.first_target_rows,
                            windows.val.first_target_rows)


def every_forecast(fitted: bl.Baselines, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Every point, quantile and volatility forecast of the baselines for these samples, by name."""
    found = {}
    for kind, nested in (("point", fitted.forecast(rows)), ("quantiles", fitted.quantiles(rows))):
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


def test_conformal_interval_covers_its_nominal_rate_overall_and_by_volatility_tercile():
    rng = np.random.default_rng(11)
    n_cal, n_test, nominal, centre = 20_000, 30_000, 0.8, 0.2

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:  # heteroscedastic, heavy-tailed: centre + sigma x t(5)
        sigma = np.exp(rng.normal(0, 0.6, n))
        return centre + sigma * rng.standard_t(5, n), sigma

    (cal, cal_sigma), (test, test_sigma) = draw(n_cal), draw(n_test)

    def tolerance(n: int) -> float:
        """4 sd of the coverage of n test samples: binomial given the calibration, whose own error is Beta."""
        return 4 * math.sqrt(nominal * (1 - nominal) * (1 / n_cal + 1 / n))

    forecasts = {"point": lambda sigma: (centre, centre),
                 "quantile pair, too narrow (CQR)": lambda sigma: (centre - 0.3 * sigma, centre + 0.3 * sigma)}
    for name, forecast in forecasts.items():
        conformal = bl.calibrate(*forecast(cal_sigma), cal, cal_sigma, nominal)
        covered = bl.coverage(*conformal.interval(*forecast(test_sigma), test_sigma), test, test_sigma)
        assert abs(covered.overall - nominal) < tolerance(n_test), (name, covered)
        for share in covered.terciles:
            assert abs(share - nominal) < tolerance(n_test // 3), (name, covered)

    # Not normalised: the same rate overall, but too wide when calm and too narrow when wild.
    plain = bl.calibrate(centre, centre, cal, 1.0, nominal)
    covered = bl.coverage(*plain.interval(centre, centre, 1.0), test, test_sigma)
    assert abs(covered.overall - nominal) < tolerance(n_test)
    low_vol, _, high_vol = covered.terciles
    assert low_vol > nominal + 0.1 and high_vol < nominal - 0.1, covered


def test_adaptive_conformal_keeps_its_coverage_where_the_volatility_jumps_and_split_does_not():
    """The returns' volatility doubles mid-test while the forecast of it does not: split conformal's margin, fixed
    on calibration, covers half the time after the jump; adaptive conformal's level rises until it covers 80 %
    again, and over the whole test split it covers within Gibbs & Candes' bound (max(alpha, 1 - alpha) + gamma)
    / (gamma T) of 80 %, at step 1 and at step 2 (whose outcomes it learns a row later)."""
    rng = np.random.default_rng(5)
    n_cal, n_test, nominal, gamma = 2000, 6000, 0.8, 0.005

    def draw(n: int, jump: int) -> tuple[np.ndarray, np.ndarray]:  # returns (n, 2 steps), their forecast sigma (n, 2)
        sigma = np.exp(rng.normal(0, 0.5, n))
        true_sigma = sigma * np.where(np.arange(n) >= jump, 2.0, 1.0)
        return true_sigma[:, None] * rng.standard_normal((n, 2)), np.repeat(sigma[:, None], 2, axis=1)

    (cal, cal_sigma), (test, sigma) = draw(n_cal, n_cal), draw(n_test, n_test // 2)
    after = slice(n_test // 2, None)

    def covered(bounds: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return (test >= bounds[0]) & (test <= bounds[1])

    conformal = bl.calibrate(0.0, 0.0, cal, cal_sigma, nominal)
    split = covered(conformal.interval(0.0, 0.0, sigma))
    assert (split[after].mean(axis=0) < 0.55).all() and (split.mean(axis=0) < 0.7).all(), split.mean(axis=0)

    adaptive = bl.adapt(bl.conformity(0.0, 0.0, cal, cal_sigma), bl.conformity(0.0, 0.0, test, sigma),
                        np.arange(n_test) + 10_000, nominal, gamma)
    inside = covered(adaptive.interval(0.0, 0.0, sigma))
    bound = (nominal + gamma) / (gamma * n_test)
    assert (abs(inside.mean(axis=0) - nominal) < bound).all(), inside.mean(axis=0)
    assert (inside[after].mean(axis=0) > 0.77).all(), inside[after].mean(axis=0)
    assert (adaptive.level > 0.85).all() and (adaptive.end_margin > 1.5 * conformal.margin).all()


def test_the_adaptive_level_moves_after_each_outcome_once_it_is_known():
    """Each miss raises the coverage level by gamma x 0.8 and each hit lowers it by gamma x 0.2, from the moment
    the outcome is known: a step-1 outcome at the next origin, a step-2 outcome an origin later. The margin is the
    level's rank among the scores known; where the level passes the largest one it stays there, finite."""
    calibration = np.repeat(np.linspace(0, 1, 101)[:, None], 2, axis=1)  # 101 scores, 0.01 apart
    scores = np.repeat(np.r_[np.full(10, 5.0), np.zeros(30)][:, None], 2, axis=1)  # 10 misses, then 30 hits
    rows = np.arange(len(scores)) + 500
    adaptive = bl.adapt(calibration, scores, rows, 0.8, 0.005)
    assert adaptive.level == pytest.approx([0.8 + 0.005 * (10 * 0.8 - 30 * 0.2)] * 2)
    margin = adaptive.margin
    # the first: rank ceil(102 x 0.8) = 82 of the calibration's scores; at step 1 the second knows one miss more
    assert margin[0] == pytest.approx([0.81, 0.81]) and margin[1, 0] == pytest.approx(0.82)  # ceil(103 x 0.804)
    assert margin[1, 1] == margin[0, 1] < margin[2, 1]  # at step 2 the first miss is known an origin later
    assert (np.diff(margin[:11], axis=0) >= 0).all() and (np.diff(margin[12:], axis=0) <= 0).all()

    clipped = bl.adapt(calibration, scores, rows, 0.8, 0.1)  # the level passes 1 after three misses
    assert np.isfinite(clipped.margin).all() and clipped.margin[4, 0] == 5.0  # the largest score known


def test_quantiles_are_ordered_and_forecasts_exist_after_the_last_row(candles):
    windows = split(candles)
    fitted = fit(candles, windows)
    for name, by_quantity in fitted.quantiles(windows.test.first_target_rows).items():
        for q, quantiles in by_quantity.items():
            assert quantiles.shape == (len(bl.LEVELS), len(windows.test), HORIZON)
            assert (np.diff(quantiles, axis=0) > 0).all(), f"{name} {q}"
    after_last = every_forecast(fitted, np.array([len(candles)]))  # what `predict` shows
    assert all(np.isfinite(forecast).all() for forecast in after_last.values())
    # The excursions' HAR forecasts are shares of the range's, below it.
    har = fitted.forecast(windows.test.first_target_rows)["har_tod"]
    assert (har["high"] < har["range"]).all() and (har["low"] < har["range"]).all()


def test_har_alone_forecasts_after_any_candles_as_fitted_and_round_trips_through_json(candles):
    """What `predict` uses (har.json): from the candles up to an origin - a week of them is enough - the same
    forecast as the fitted baselines' at that origin, through to_dict / from_dict."""
    windows = split(candles)
    fitted = fit(candles, windows)
    har = bl.Har.from_dict(json.loads(json.dumps(fitted.har.to_dict())))
    for row in windows.test.first_target_rows[[0, 37, -1]]:
        week_before = candles.iloc[row - 200:row]  # rows up to the origin row - 1: more than a week
        forecast = har.forecast(week_before)
        expected = fitted.forecast(np.array([row]))["har_tod"]
        for quantity in ("range", "high", "low"):
            np.testing.assert_allclose(forecast[quantity], expected[quantity][0], rtol=1e-9, err_msg=quantity)
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
    np.testing.assert_allclose(before[:, :, 2], fitted.forecast(np.arange(1, len(candles) + 1))["har_tod_rms"]["range"])
    har = bl.Har.from_dict(json.loads(json.dumps(fitted.har.to_dict())))
    for origin in test[[0, -1]] - 1:
        np.testing.assert_allclose(har.inputs(candles.iloc[:origin + 1]), before[[origin]], rtol=1e-9)


def test_a_combination_weighs_each_forecast_by_what_it_adds_on_validation():
    rng = np.random.default_rng(3)
    actual = rng.gamma(2.0, 0.005, (20_000, 2))
    baseline = actual + rng.normal(0, 0.004, actual.shape)
    assert bl.combination_weights(actual, baseline, actual).tolist() == [1.0, 1.0]  # the truth needs no baseline
    unrelated = 4 * rng.permutation(actual)  # unrelated to the actual values, and far too large
    assert bl.combination_weights(unrelated, baseline, actual).tolist() == [0.0, 0.0]
    # Two forecasts as good as each other with independent errors: each weighs about a half.
    other = actual + rng.normal(0, 0.004, actual.shape)
    assert np.allclose(bl.combination_weights(other, baseline, actual), 0.5, atol=0.1)


def test_scores():
    actual = np.array([[0.01, 0.02], [0.02, 0.04]])
    assert bl.mae(actual * 2, actual) == pytest.approx(0.0225)
    assert bl.qlike(actual, actual, 1e-4) == 0
    assert bl.qlike(actual * 2, actual, 1e-4) == pytest.approx(0.25 - math.log(0.25) - 1)
    assert bl.qlike(np.zeros_like(actual), actual, 1e-4) is None  # no change's range
    assert bl.pinball(np.zeros(2), np.array([1.0, -1.0]), 0.9) == pytest.approx((0.9 + 0.1) / 2)
    assert bl.skill(0.75, 1.0) == 0.25 and bl.skill(0.5, 0.0) is None and bl.skill(0.5, None) is None
    scores = bl.point_scores(actual * 2, actual, "range", 1e-4)
    assert scores.mae == pytest.approx(0.015) and scores.mae_horizon == pytest.approx(0.0225)
    assert scores.qlike == pytest.approx(scores.qlike_horizon)
    covered = bl.coverage(np.zeros(6), np.ones(6), np.array([0.5, 2, 0.5, 0.5, 2, 0.5]), np.arange(6.0))
    assert covered == (pytest.approx(4 / 6), [0.5, 1.0, 0.5])


def test_candles_with_a_timestamp_column_and_bad_candles(candles):
    windows = split(candles)
    rows = windows.test.first_target_rows
    as_column = fit(candles.reset_index(), windows)
    np.testing.assert_array_equal(as_column.forecast(rows)["har_tod"]["range"],
                                  fit(candles, windows).forecast(rows)["har_tod"]["range"])
    with pytest.raises(JobError, match="no times"):
        fit(candles.reset_index(drop=True), windows)
    broken = candles.copy()
    broken.iloc[100, broken.columns.get_loc("low")] = 0.0
    with pytest.raises(JobError, match=r"low is 0 at 2.*prices must be positive"):
        fit(broken, windows)
    with pytest.raises(JobError, match="3 samples are too few for a 80% interval"):
        bl.calibrate(0.0, 0.0, np.ones(3), np.ones(3), 0.8)
