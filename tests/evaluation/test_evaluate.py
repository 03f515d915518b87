"""Evaluation in price units: metric arithmetic on small hand-checked arrays, a persistence model with
exactly zero skill, and a briefly trained real model checked against numbers taken from the frame."""
from __future__ import annotations

import math
from dataclasses import replace

import keras
import numpy as np
import pytest

from tests.conftest import tiny_config_dict
from tests.data.test_windows import feature_frame, positions
from trainer.config import RunConfig
from trainer.data.windows import make_windows
from trainer.errors import JobError
from trainer.evaluation.baselines import Baseline, fit_baselines, mae_factor, qlike_factor
from trainer.evaluation.evaluate import (
    candle_scores,
    choose_shrink,
    evaluate,
    metrics,
    significant_gain,
)
from trainer.evaluation.results import BAR, BAR_RMS, CandleScores
from trainer.evaluation.scores import qlike, qlike_losses
from trainer.evaluation.serving import Serving
from trainer.evaluation.settings import EvaluationConfig, IntervalConfig
from trainer.heads import quantities
from trainer.model.models import build_model, output_shapes, predict_prices

pytestmark = pytest.mark.usefixtures("fresh_keras_session")


def test_metrics_on_a_single_step_head():
    pred = np.array([[10.0, 12.0], [20.0, 18.0]])  # columns: open, close
    actual = np.array([[11.0, 11.0], [20.0, 20.0]])
    last_close = np.array([10.0, 19.0])
    result = metrics(pred, actual, last_close, close_index=1)
    assert result.mae == pytest.approx((1 + 1 + 0 + 2) / 4)
    assert result.rmse == pytest.approx(math.sqrt((1 + 1 + 0 + 4) / 4))
    assert result.mape == pytest.approx(100 * (1 / 11 + 1 / 11 + 0 + 2 / 20) / 4)
    # Sample 1: both up from 10. Sample 2: predicted down from 19, actually up.
    assert result.direction_accuracy == pytest.approx(0.5)


def test_direction_accuracy_counts_every_horizon_step():
    pred = np.array([[[101.0], [99.0], [100.0]]])  # one sample, 3 steps, one column (close)
    actual = np.array([[[102.0], [98.0], [99.0]]])
    # Steps: up/up, down/down, flat/down.
    assert metrics(pred, actual, np.array([100.0]), close_index=0).direction_accuracy == pytest.approx(2 / 3)


def test_undefined_metrics_are_none_not_guessed():
    pred, actual = np.array([[1.0, 2.0]]), np.array([[0.0, 2.0]])
    result = metrics(pred, actual)
    assert result.mape is None and result.direction_accuracy is None
    assert result.mae == pytest.approx(0.5)


def test_a_target_shaped_differently_from_the_prediction_is_refused():
    """The old scripts' (N, 1, 4) target against an (N, 4) output broadcast silently."""
    with pytest.raises(JobError, match=r"predictions of shape \(5, 4\) against targets of shape \(5, 1, 4\)"):
        metrics(np.zeros((5, 4)), np.ones((5, 1, 4)))


def tiny_cfg(tmp_path, **heads) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["heads"][0].update(heads)
    return RunConfig.model_validate(raw)


def windows_of(frame, cfg: RunConfig, model: keras.Model):
    return make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, output_shapes(model, cfg.heads))


def zero_model(cfg: RunConfig) -> keras.Model:
    """A real Keras model whose every output is 0: framed relative to the last close, "no change"."""
    inputs = keras.Input((cfg.window.lookback, len(cfg.features.columns)))
    outputs = {head.name: keras.layers.RepeatVector(cfg.window.horizon)(
        keras.layers.Dense(len(head.columns), kernel_initializer="zeros")(keras.layers.Flatten()(inputs)))
        for head in cfg.heads}
    return keras.Model(inputs, outputs)


def test_an_all_zero_output_is_persistence_of_the_close_with_zero_skill(tmp_path):
    cfg = tiny_cfg(tmp_path)
    model = zero_model(cfg)
    frame = feature_frame()
    close = frame.columns.get_loc("close")
    for row in range(341, 400, 2):  # flat candles in the test split: no move is a direction too
        frame.iloc[row, close] = frame.iloc[row - 1, close]
    windows = windows_of(frame, cfg, model)
    predicted = predict_prices(model, windows.test, windows.preprocessing)
    report = evaluate(predicted, windows.test, windows.preprocessing)
    rows = positions(frame, windows.test.target_times)
    closes = frame["close"].to_numpy()
    np.testing.assert_array_equal(predicted["ohlc"][..., 3], np.repeat(closes[rows - 1, None], 3, axis=1))
    moves = np.sign(np.stack([closes[rows + step] - closes[rows - 1] for step in range(3)], axis=1))
    assert report.n_test == len(windows.test)
    scores = report.heads["ohlc"].close
    assert scores.mae == pytest.approx(scores.persistence_mae, rel=1e-12) and scores.persistence_mae > 0
    assert scores.skill == pytest.approx(0, abs=1e-12)
    assert scores.skill_by_step == pytest.approx([0, 0, 0], abs=1e-12)
    # "No change" is right exactly where the close stayed flat; the majority class is the commonest move.
    assert scores.direction_accuracy == pytest.approx(np.mean(moves == 0)) and np.mean(moves == 0) > 0.1
    assert (scores.up_move_rate, scores.down_move_rate) == pytest.approx((np.mean(moves > 0), np.mean(moves < 0)))
    assert scores.majority_rate == pytest.approx(max(np.mean(moves > 0), np.mean(moves < 0), np.mean(moves == 0)))
    assert report.headline.model_dump() == {"head": "ohlc", "column": "close", "shrink": 1.0, **{
        k: getattr(scores, k) for k in ("skill", "mae", "persistence_mae", "direction_accuracy", "majority_rate")}}
    assert report.heads["ohlc"].persistence.direction_accuracy is None  # not a forecast of moves


def test_inconsistent_candles_are_counted(tmp_path):
    cfg = tiny_cfg(tmp_path)
    model = zero_model(cfg)
    windows = windows_of(feature_frame(), cfg, model)
    predicted = predict_prices(model, windows.test, windows.preprocessing)
    predicted["ohlc"][:10, 0, 1] = predicted["ohlc"][:10, 0, 3] - 1  # high below the close
    predicted["ohlc"][10:15, 2, 2] = predicted["ohlc"][10:15, 2, 0] + 1  # low above the open
    report = evaluate(predicted, windows.test, windows.preprocessing)
    share = 15 / predicted["ohlc"][..., 0].size
    assert report.heads["ohlc"].inconsistent_candles == {"model": pytest.approx(share), "actual": 0.0}
    assert report.heads["bb"].inconsistent_candles is None


@pytest.mark.train
@pytest.mark.parametrize("relative_to", ["last_close", None])
def test_evaluate_a_trained_model_in_price_units(tmp_path, relative_to):
    raw = tiny_config_dict(tmp_path)
    raw["window"]["relative_to"] = relative_to
    raw["heads"][0]["kind"] = "candle" if relative_to is not None else "plain"
    cfg = RunConfig.model_validate(raw)
    frame = feature_frame()
    model = build_model(cfg.network, cfg.train)
    windows = windows_of(frame, cfg, model)
    history = model.fit(windows.train.x, windows.train.y, batch_size=64, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])

    predicted = predict_prices(model, windows.test, windows.preprocessing)
    report = evaluate(predicted, windows.test, windows.preprocessing)
    test_rows = positions(frame, windows.test.target_times)
    last_close = frame["close"].to_numpy()[test_rows - 1]
    for head in windows.preprocessing.heads:
        scaled = model.predict(windows.test.x, verbose=0)[head.name]
        framed = scaled * head.scaler.scale + head.scaler.offset
        expected = np.exp(framed) * last_close[:, None, None] if relative_to else framed  # tiny heads: price levels
        # float32 network outputs, batched differently by the two predict calls
        np.testing.assert_allclose(predicted[head.name], expected, rtol=1e-6)
        # Actual and last-input values straight from the frame, independent of the windows' scaling.
        values = frame[list(head.columns)].to_numpy()
        actual = np.stack([values[row:row + cfg.window.horizon] for row in test_rows])
        last = values[test_rows - 1]
        close = head.columns.index("close") if "close" in head.columns else None
        expected_model = metrics(predicted[head.name], actual, last[:, close] if close is not None else None,
                                 close)
        expected_persistence = metrics(np.repeat(last[:, None, :], cfg.window.horizon, axis=1), actual)
        scores = report.heads[head.name]
        assert scores.model.model_dump() == pytest.approx(expected_model.model_dump())  # relative 1e-6
        for name in ("mae", "rmse", "mape"):
            assert getattr(scores.persistence, name) == pytest.approx(getattr(expected_persistence, name), rel=1e-6)
        assert scores.skill == pytest.approx(1 - expected_model.mae / expected_persistence.mae, rel=1e-6)
    close_error = np.abs(predicted["ohlc"][..., 3] - frame["close"].to_numpy()[test_rows[:, None] + np.arange(3)])
    persistence_error = np.abs(last_close[:, None] - frame["close"].to_numpy()[test_rows[:, None] + np.arange(3)])
    assert report.headline.skill == pytest.approx(1 - close_error.mean() / persistence_error.mean(), rel=1e-9)
    assert 0 <= report.heads["ohlc"].model.direction_accuracy <= 1
    assert report.heads["bb"].model.direction_accuracy is None  # bb has no close column


def test_non_finite_predictions_never_count(tmp_path):
    with pytest.raises(JobError, match="not all finite"):
        metrics(np.array([[1.0, np.inf]]), np.array([[1.0, 2.0]]))


def _windows_with_an_rsi_head(tmp_path, relative_to: str | None = "last_close"):
    """The tiny config's windows with a third head of a unitless column (rsi) beside ohlc (a candle) and bb (bands)."""
    raw = tiny_config_dict(tmp_path)
    raw["heads"].append({"name": "rsi", "columns": ["rsi"]})
    raw["window"]["relative_to"] = relative_to
    if relative_to is None:  # a candle head needs relative framing
        raw["heads"][0]["kind"] = "plain"
    cfg = RunConfig.model_validate(raw)
    return make_windows(feature_frame(), cfg.window, cfg.features.columns, cfg.heads,
                        {"ohlc": (3, 4), "bb": (3, 2), "rsi": (3, 1)})


def test_the_shrink_factor_is_chosen_on_the_validation_split(tmp_path):
    """A perfect forecast keeps its whole deviation from its persistence (1), noise keeps none (0), whatever the
    head's columns (a candle's body, bands, a unitless column); the validation gain of the best factor comes beside."""
    windows = _windows_with_an_rsi_head(tmp_path)
    val = windows.val
    perfect, gains = choose_shrink(val.y, val, windows.preprocessing)
    assert [h.shrink for h in perfect.heads] == [1.0, 1.0, 1.0]
    assert all(gain > 0.5 for gain in gains.values())
    rng = np.random.default_rng(0)
    noise = {name: rng.normal(size=y.shape).astype(np.float32) for name, y in val.y.items()}
    noise["ohlc"][..., 1] = noise["ohlc"][..., [0, 3]].max(-1) + 0.1  # candles, as a candle head makes them
    noise["ohlc"][..., 2] = noise["ohlc"][..., [0, 3]].min(-1) - 0.1
    shrunk, gains = choose_shrink(noise, val, windows.preprocessing)
    assert [h.shrink for h in shrunk.heads] == [0.0, 0.0, 0.0]
    assert all(gain < 0.05 for gain in gains.values())  # at most a little, from a small factor, not significant


@pytest.mark.parametrize("relative_to", ["last_close", None])
def test_a_head_no_better_than_its_persistence_on_validation_is_served_as_it(tmp_path, relative_to):
    """An untrained network's outputs - bands at the last close (all zeros, "no change"), an rsi at its train mean -
    lose to each column's own last value on validation: those heads are served as their persistence, and on the test
    split score >= -0.005 against it (exactly 0: they are it), where the network's own forecast is far worse. A head
    that beats its persistence on validation (here: the actual values) keeps its factor, and its gain on test. Framed
    relative to the last close or on absolute levels alike."""
    windows = _windows_with_an_rsi_head(tmp_path, relative_to)
    prep, val, test = windows.preprocessing, windows.val, windows.test

    def untrained(split) -> dict[str, np.ndarray]:
        return {"ohlc": split.y["ohlc"], "bb": np.zeros_like(split.y["bb"]), "rsi": np.zeros_like(split.y["rsi"])}

    served, gains = choose_shrink(untrained(val), val, prep)
    assert {h.name: h.shrink for h in served.heads} == {"ohlc": 1.0, "bb": 0.0, "rsi": 0.0}
    assert gains["ohlc"] > 0.5 and gains["bb"] < 0.1 and gains["rsi"] < 0.1  # a small factor's, not significant
    outputs = untrained(test)
    report = evaluate(served.to_prices(outputs, test.last), test, served, prep.to_prices(outputs, test.last),
                      validation_gains=gains)
    for name in ("bb", "rsi"):
        scores = report.heads[name]
        assert scores.skill >= -0.005 and scores.skill == pytest.approx(0, abs=1e-9)
        assert scores.skill_unshrunk < -0.1  # what the network alone would have served
        assert (scores.shrink, scores.validation_gain) == (0.0, gains[name])
        np.testing.assert_allclose(served.to_prices(outputs, test.last)[name],
                                   np.broadcast_to(test.last_inputs[name][:, None], test.y_raw[name].shape),
                                   rtol=1e-12)
    assert report.heads["ohlc"].shrink == 1.0 and report.heads["ohlc"].skill > 0.5


def test_a_quantile_head_is_mixed_with_its_persistence_keeping_its_spread(tmp_path):
    """Shrunk, a quantile head's median moves toward each column's last value and every other quantile with it."""
    raw = tiny_config_dict(tmp_path)
    raw["heads"].append({"name": "close_q", "kind": "quantile", "columns": ["close", "rsi"],
                         "quantiles": [0.1, 0.5, 0.9]})
    cfg = RunConfig.model_validate(raw)
    windows = make_windows(feature_frame(), cfg.window, cfg.features.columns, cfg.heads,
                           {"ohlc": (3, 4), "bb": (3, 2), "close_q": (3, 2)})
    prep, test = windows.preprocessing, windows.test
    head = prep.heads[-1]
    rng = np.random.default_rng(0)
    outputs = np.cumsum(rng.uniform(0.1, 1, size=(len(test), 3, 3, 2)), axis=-2).astype(np.float32)
    full, half = (prep.head_prices(replace(head, shrink=f), outputs, test.last) for f in (1.0, 0.5))
    shrunk_point = prep.head_prices(replace(head, shrink=0.5), head.spec.point(outputs), test.last)
    np.testing.assert_allclose(half[..., 1, :], shrunk_point, rtol=1e-12)  # the median is the point forecast
    persistence = prep.head_prices(replace(head, shrink=0.0), head.spec.point(outputs), test.last)
    np.testing.assert_allclose(persistence, np.broadcast_to(test.last_inputs["close_q"][:, None], persistence.shape),
                               rtol=1e-12)
    rsi = 1  # unitless: the spread between quantiles is kept exactly
    np.testing.assert_allclose(np.diff(half[..., rsi], axis=-1), np.diff(full[..., rsi], axis=-1), atol=1e-9)
    assert (np.diff(half, axis=-2) >= 0).all()  # never crossing


def test_a_shrink_is_kept_only_for_a_gain_beyond_chance_counting_overlapping_horizons():
    rng = np.random.default_rng(0)
    assert significant_gain(rng.normal(0.5, 1, 400), block=10)  # a real gain
    assert not significant_gain(rng.normal(0.0, 1, 400), block=10) and not significant_gain(-np.ones(50), block=5)
    # Gains shared by the 10 samples of a horizon (they overlap): 20 independent draws, not 200.
    shared = np.repeat(np.tile([1.3, -0.7], 10), 10)  # mean 0.3
    assert 0.3 / (shared.std() / np.sqrt(len(shared))) > 2  # naively "significant"
    assert not significant_gain(shared, block=10)
    # A gain made in one stretch of validation only: far beyond two standard errors overall, but not a gain to
    # expect on the next stretch.
    episode = np.concatenate([rng.normal(1.0, 0.5, 200), rng.normal(-0.05, 0.1, 200)])
    blocks = episode.reshape(-1, 10).mean(axis=1)
    assert blocks.mean() > 4 * blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert not significant_gain(episode, block=10)


def _candles(split, high: np.ndarray, low: np.ndarray, ret: np.ndarray) -> dict[str, np.ndarray]:
    """A candle head's forecasts of the size of the coming candles (Head.candle_quantities) from its candles' high
    and low excursions and return relative to the last close, (N, steps) each."""
    last = split.last_close[:, None]
    return quantities(last * np.exp(high), last * np.exp(-low), last * np.exp(ret), split.last_close)


def _windows_and_baselines(tmp_path, rows: int):
    """The tiny config's windows of `rows` real BTCUSDT 1h candles (horizon 3), their frame and fitted baselines."""
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame(rows)
    windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, {"ohlc": (3, 4), "bb": (3, 2)})
    return windows, frame, fit_baselines(frame, "1h", 3, windows.train.first_target_rows,
                                         windows.val.first_target_rows)


def test_the_size_of_the_coming_candles_is_scored_against_each_baseline(tmp_path):
    windows, frame, fitted = _windows_and_baselines(tmp_path, 1500)
    test, val = windows.test, windows.val
    head = windows.preprocessing.heads[0]

    def har(split) -> dict[str, np.ndarray]:
        points = fitted.forecast(split.first_target_rows)[Baseline.HAR_TOD]
        return _candles(split, points["high"], points["low"], np.zeros_like(points["high"]))

    scores, served, _ = candle_scores(head, har(test), har(val), test, val, fitted, EvaluationConfig())
    assert CandleScores.model_validate_json(scores.model_dump_json()) == scores  # what metrics.json holds
    # HAR's own excursions, put on their level on validation as the network's are: HAR on its level (the bar) exactly
    assert scores.high.network_skill[BAR] == pytest.approx(0, abs=1e-12)
    assert scores.low.network_skill[BAR] == pytest.approx(0, abs=1e-12)
    # HAR against no change, from the frame itself
    rows = positions(frame, test.target_times)
    high_next = np.log(frame["high"].to_numpy()[rows] / frame["close"].to_numpy()[rows - 1])
    har_high = fitted.forecast(test.first_target_rows)[Baseline.HAR_TOD]["high"][:, 0]
    assert scores.high.baselines[Baseline.HAR_TOD].mae == pytest.approx(np.abs(har_high - high_next).mean(), rel=1e-9)
    assert scores.high.baselines[Baseline.NO_CHANGE].mae == pytest.approx(np.abs(high_next).mean(), rel=1e-9)
    assert scores.high.baselines[Baseline.HAR_TOD].mae < 0.8 * scores.high.baselines[Baseline.NO_CHANGE].mae
    assert set(scores.range.qlike_skill) == {Baseline.HAR_TOD_RMS, BAR_RMS}  # no HAR-X: the frame has no extra input
    # predictions.npz keeps what users get per window and step: re-scoring it gives the scores
    actual_next = fitted.actual(test.first_target_rows)
    for quantity in ("high", "low", "range"):
        assert served[f"expected_{quantity}"].shape == (len(test), 3)
        assert np.abs(served[f"expected_{quantity}"][:, 0] - actual_next[quantity][:, 0]).mean() == pytest.approx(
            getattr(scores, quantity).mae, rel=1e-12)
    assert qlike(served["expected_range_rms"][:, 0], actual_next["range"][:, 0], fitted.floor) == \
        pytest.approx(scores.range.qlike, rel=1e-12)
    inside = (served["interval_low"][:, 0] <= actual_next["return"][:, 0]) & \
        (actual_next["return"][:, 0] <= served["interval_high"][:, 0])
    assert inside.mean() == pytest.approx(scores.interval.coverage)

    # A HAR head that forecasts HAR's root-mean-square range exactly: its forecast is that put on its level on
    # validation, per step; so is the bar, HAR on its level, which it then equals
    rms = {split: fitted.forecast(split.first_target_rows)[Baseline.HAR_TOD_RMS]["range"] for split in (test, val)}
    started, served, serving = candle_scores(head, {**har(test), "range": rms[test]},
                                             {**har(val), "range": rms[val]}, test, val, fitted, EvaluationConfig())
    factor = qlike_factor(rms[val], fitted.actual(val.first_target_rows)["range"], fitted.floor)
    assert serving.rms_factor == pytest.approx(factor.tolist(), rel=1e-12) and factor[0] != 1
    np.testing.assert_allclose(served["network_range_rms"], rms[test] * factor, rtol=1e-12)
    assert started.range.network.qlike == pytest.approx(
        qlike(rms[test][:, 0] * factor[0], actual_next["range"][:, 0], fitted.floor), rel=1e-12)
    assert started.range.network_qlike_skill[Baseline.HAR_TOD_RMS] == pytest.approx(
        1 - started.range.network.qlike / qlike(rms[test][:, 0], actual_next["range"][:, 0], fitted.floor), rel=1e-9)
    assert started.range.network_qlike_skill[BAR_RMS] == pytest.approx(0, abs=1e-12)
    # the same forecast as the bar: no test of a difference; against HAR as fitted, a two-sided p-value
    assert started.range.network_qlike_p[BAR_RMS] is None and started.range.network_p[BAR] is None
    assert 0 < started.range.network_qlike_p[Baseline.HAR_TOD_RMS] < 1
    assert 0 <= started.high.network_p[Baseline.NO_CHANGE] < 0.05  # HAR's excursion against none at all
    assert started.mean_range.har_qlike > 0 and started.mean_range.steps == 3
    for quantity in ("high", "low", "range"):
        assert getattr(started, quantity).network_skill[BAR] == pytest.approx(0, abs=1e-12)
    # ... on the validation split too, where choices among variants are made
    assert started.validation.model_dump() == pytest.approx(dict.fromkeys(("range_qlike", "range_mae", "high_low_mae"),
                                                                          0), abs=1e-12)

    # The future itself: skill 1 against every baseline, and nothing to widen its interval by.
    actual, val_actual = fitted.actual(test.first_target_rows), fitted.actual(val.first_target_rows)
    perfect, *_ = candle_scores(head, _candles(test, actual["high"], actual["low"], actual["return"]),
                               _candles(val, val_actual["high"], val_actual["low"], val_actual["return"]),
                               test, val, fitted, EvaluationConfig())
    for quantity in ("high", "low", "range"):
        assert all(v == pytest.approx(1) for v in getattr(perfect, quantity).skill.values()), quantity
    assert perfect.interval.margin == pytest.approx([0, 0, 0], abs=1e-12)
    assert perfect.high.network_weight == perfect.low.network_weight == [1, 1, 1]  # HAR adds nothing

    # A network of noise (on its level it is a noisy constant, the actual values' median on validation): validation
    # gives it little weight beside HAR, and what is scored is mostly HAR's.
    rng = np.random.default_rng(1)

    def noise(split) -> dict[str, np.ndarray]:
        return _candles(split, *np.exp(rng.normal(-5, 1.5, (2, len(split), 3))), np.zeros((len(split), 3)))

    noisy, *_ = candle_scores(head, noise(test), noise(val), test, val, fitted, EvaluationConfig())
    for quantity in ("high", "low"):
        scores_of = getattr(noisy, quantity)
        assert max(scores_of.network_weight) <= 0.3, scores_of.network_weight
        assert scores_of.network_skill[Baseline.HAR_TOD] < -0.1 < scores_of.skill[Baseline.HAR_TOD]


@pytest.mark.parametrize("method", ["adaptive", "split"])
def test_the_interval_of_no_change_covers_about_its_nominal_rate_on_real_candles(tmp_path, method):
    windows, _, fitted = _windows_and_baselines(tmp_path, 2900)
    test, val = windows.test, windows.val
    zeros, val_zeros = np.zeros((len(test), 3)), np.zeros((len(val), 3))
    settings = EvaluationConfig(interval=IntervalConfig(method=method))
    interval = candle_scores(windows.preprocessing.heads[0], _candles(test, zeros, zeros, zeros),
                             _candles(val, val_zeros, val_zeros, val_zeros), test, val, fitted,
                             settings)[0].interval
    # ~430 test samples: a binomial standard error of 2 points around 80 %.
    assert 0.72 <= interval.coverage <= 0.88, interval
    assert interval.baselines.keys() == {"static", "ewma_scaled"}
    assert interval.method == method
    if method == "split":
        assert (interval.gamma, interval.level, interval.calibration) == (None, None, "split conformal on validation")
    else:  # where its level ended, per step, and the margin at that level, the next interval's
        assert interval.gamma == 0.005 and len(interval.level) == len(interval.margin) == 3
        assert 0.6 < interval.level[0] < 1 and interval.calibration == \
            f"adaptive conformal, level {interval.level[0]:.2f} after the test split"


def test_the_mae_factor_is_the_scale_with_the_lowest_mae():
    rng = np.random.default_rng(4)
    forecast = rng.lognormal(-5, 0.5, (400, 2))
    actual = forecast * rng.lognormal(0.2, 0.4, (400, 2))
    factors = mae_factor(forecast, actual)
    grid = np.linspace(0.5, 2, 1501)
    for k in range(2):
        errors = [np.abs(actual[:, k] - a * forecast[:, k]).mean() for a in grid]
        assert factors[k] == pytest.approx(grid[int(np.argmin(errors))], abs=2e-3)
    assert mae_factor(np.zeros((3, 1)), np.ones((3, 1))).tolist() == [1.0]  # no forecast to scale


def test_the_qlike_factor_is_the_scale_with_the_lowest_qlike():
    """A HAR head's range is put on its level on validation by it (TRXUSDT 1h's network forecast 12 % too high)."""
    rng = np.random.default_rng(5)
    forecast = rng.lognormal(-5, 0.5, (400, 2))
    actual = forecast * rng.lognormal(-0.1, 0.4, (400, 2))
    factors = qlike_factor(forecast, actual, floor=1e-6)
    grid = np.linspace(0.5, 2, 1501)
    for k in range(2):
        losses = [qlike(a * forecast[:, k], actual[:, k], 1e-6) for a in grid]
        assert factors[k] == pytest.approx(grid[int(np.argmin(losses))], abs=2e-3)
        assert qlike(factors[k] * forecast[:, k], actual[:, k], 1e-6) < qlike(forecast[:, k], actual[:, k], 1e-6)


def test_the_network_is_scored_against_harx_where_the_job_has_its_extra_inputs(tmp_path):
    """With a volume surprise among the feature columns, HAR-X (HAR + time of day with it, linear, on its validation
    level) is scored beside HAR + time of day: MAE skills of the high, low and range, QLIKE skill of the range; HAR-X
    itself, put on its level as the network is, scores exactly 0 against it."""
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame(1500)
    frame["volume_surprise"] = np.log(frame["volume"]) - np.log(frame["volume"]).rolling(24, min_periods=1).mean()
    windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, {"ohlc": (3, 4), "bb": (3, 2)})
    test, val = windows.test, windows.val
    fitted = fit_baselines(frame, "1h", 3, windows.train.first_target_rows, val.first_target_rows)

    def harx(split) -> dict[str, np.ndarray]:
        points = fitted.forecast(split.first_target_rows)[Baseline.HARX]
        return _candles(split, points["high"], points["low"], np.zeros_like(points["high"]))

    scores, *_ = candle_scores(windows.preprocessing.heads[0], harx(test), harx(val), test, val, fitted,
                              EvaluationConfig())
    assert set(scores.range.qlike_skill) == {Baseline.HAR_TOD_RMS, BAR_RMS, Baseline.HARX_LEVEL_RMS}
    for quantity in ("high", "low"):
        assert getattr(scores, quantity).network_skill[Baseline.HARX_LEVEL] == pytest.approx(0, abs=1e-12)
        assert Baseline.HARX_LEVEL in getattr(scores, quantity).skill
    assert CandleScores.model_validate_json(scores.model_dump_json()) == scores


def test_what_is_served_is_never_worse_on_validation_than_the_network_har_or_harx_by_construction():
    """Serving, fitted on validation: per quantity and step, the medians' weights of the network (on its level), HAR-X
    and HAR with the lowest validation MAE, and the weights of the range's root mean square with the lowest validation
    QLIKE, each source's on its level there (each alone among the choices): what is served there is never worse than
    any of them alone; the weights sum to 1."""
    rng = np.random.default_rng(5)
    floor = 1e-4
    actual = {q: rng.gamma(2.0, 0.004, (3000, 3)) for q in ("high", "low", "range")}

    def noisy(scale: float) -> dict[str, np.ndarray]:
        medians = {q: a * np.exp(rng.normal(0, scale, a.shape)) for q, a in actual.items()}
        return medians | {"range_rms": 1.3 * medians["range"]}  # a root mean square, above the median

    for network in (noisy(0.3), noisy(2.0)):  # a fair network, and one far worse than the baselines
        sources = {"harx": noisy(0.5), "har_tod": noisy(0.6)}
        serving = Serving.fit(network, sources, actual, floor, "har_ewma", np.zeros(3))
        served, own, levelled = (serving.served(network, sources), serving.network_on_level(network),
                                 serving.sources_on_level(sources))
        for q in ("high", "low", "range"):
            np.testing.assert_allclose(sum(np.asarray(w) for w in serving.weights[q].values()), 1.0)
            mae = np.abs(served[f"expected_{q}"] - actual[q]).mean(axis=0)
            for alone in (own[q], sources["harx"][q], sources["har_tod"][q]):
                assert (mae <= np.abs(alone - actual[q]).mean(axis=0) + 1e-15).all()
        np.testing.assert_allclose(sum(np.asarray(w) for w in serving.rms_weights.values()), 1.0)
        losses = qlike_losses(served["expected_range_rms"], actual["range"], floor).mean(axis=0)
        for alone in (own["range_rms"], levelled["harx"]["range_rms"], levelled["har_tod"]["range_rms"]):
            assert (losses <= qlike_losses(alone, actual["range"], floor).mean(axis=0) + 1e-12).all()
        # each source's root mean square on its level there: the factor with the lowest QLIKE
        np.testing.assert_allclose(serving.rms_levels["harx"],
                                   qlike_factor(sources["harx"]["range_rms"], actual["range"], floor))
    assert Serving.model_validate_json(serving.model_dump_json()) == serving  # what serving.json holds
