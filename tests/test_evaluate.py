"""Evaluation in price units: metric arithmetic on small hand-checked arrays, a persistence model with
exactly zero skill, and a briefly trained real model checked against numbers taken from the frame."""
from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from tests.conftest import tiny_config_dict
from tests.test_windows import feature_frame, positions
from trainer.config import RunConfig
from trainer.errors import JobError
from trainer.evaluate import evaluate, metrics, predict_prices
from trainer.models import build_model, output_shapes
from trainer.windows import make_windows


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    yield
    keras.backend.clear_session()


def test_metrics_on_a_single_step_head():
    pred = np.array([[10.0, 12.0], [20.0, 18.0]])  # columns: open, close
    actual = np.array([[11.0, 11.0], [20.0, 20.0]])
    last_close = np.array([10.0, 19.0])
    result = metrics(pred, actual, last_close, close_index=1)
    assert result["mae"] == pytest.approx((1 + 1 + 0 + 2) / 4)
    assert result["rmse"] == pytest.approx(math.sqrt((1 + 1 + 0 + 4) / 4))
    assert result["mape"] == pytest.approx(100 * (1 / 11 + 1 / 11 + 0 + 2 / 20) / 4)
    # Sample 1: both up from 10. Sample 2: predicted down from 19, actually up.
    assert result["direction_accuracy"] == pytest.approx(0.5)


def test_direction_accuracy_counts_every_horizon_step():
    pred = np.array([[[101.0], [99.0], [100.0]]])  # one sample, 3 steps, one column (close)
    actual = np.array([[[102.0], [98.0], [99.0]]])
    # Steps: up/up, down/down, flat/down.
    assert metrics(pred, actual, np.array([100.0]), close_index=0)["direction_accuracy"] == pytest.approx(2 / 3)


def test_undefined_metrics_are_none_not_guessed():
    pred, actual = np.array([[1.0, 2.0]]), np.array([[0.0, 2.0]])
    result = metrics(pred, actual)
    assert result["mape"] is None and result["direction_accuracy"] is None
    assert result["mae"] == pytest.approx(0.5)


def test_a_target_shaped_differently_from_the_prediction_is_refused():
    """The old scripts' (N, 1, 4) target against an (N, 4) output broadcast silently."""
    with pytest.raises(JobError, match=r"predictions of shape \(5, 4\) against targets of shape \(5, 1, 4\)"):
        metrics(np.zeros((5, 4)), np.ones((5, 1, 4)))


def tiny_cfg(tmp_path) -> RunConfig:
    return RunConfig.model_validate(tiny_config_dict(tmp_path))


def persistence_model(cfg: RunConfig) -> keras.Model:
    """A real Keras model whose forecast is the last input step, repeated over the horizon."""
    inputs = keras.Input((cfg.window.lookback, len(cfg.features.columns)))
    outputs = {}
    for head in cfg.heads:
        positions = [cfg.features.columns.index(c) for c in head.columns]
        last = keras.layers.Lambda(lambda x, p=positions: keras.ops.take(x[:, -1, :], p, axis=-1))(inputs)
        outputs[head.name] = keras.layers.RepeatVector(cfg.window.horizon)(last)
    return keras.Model(inputs, outputs)


def test_predicting_persistence_has_zero_skill(tmp_path):
    cfg = tiny_cfg(tmp_path)
    model = persistence_model(cfg)
    frame = feature_frame()
    close = frame.columns.get_loc("close")
    for row in range(341, 400, 2):  # flat candles in the test split: no move is a direction too
        frame.iloc[row, close] = frame.iloc[row - 1, close]
    windows = make_windows(frame, cfg, output_shapes(model))
    report = evaluate(predict_prices(model, windows.test, windows, cfg.heads), windows, cfg)
    rows = positions(frame, windows.test.target_times)
    closes = frame["close"].to_numpy()
    flat = np.stack([closes[rows + step] == closes[rows - 1] for step in range(cfg.window.horizon)])
    assert report["heads"]["ohlc"]["persistence"]["direction_accuracy"] == pytest.approx(flat.mean())
    assert flat.mean() > 0.1
    assert report["n_test"] == len(windows.test.x)
    for head in cfg.heads:
        scores = report["heads"][head.name]
        for name in ("mae", "rmse", "mape"):
            assert scores["model"][name] == pytest.approx(scores["persistence"][name], rel=1e-6)
        assert scores["persistence"]["mae"] > 0
        assert scores["skill"] == pytest.approx(0, abs=1e-6)


def test_evaluate_a_trained_model_in_price_units(tmp_path):
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    model = build_model(cfg, len(cfg.features.columns))
    windows = make_windows(frame, cfg, output_shapes(model))
    history = model.fit(np.asarray(windows.train.x), windows.train.y, batch_size=64, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])

    report = evaluate(predict_prices(model, windows.test, windows, cfg.heads), windows, cfg)
    predicted = predict_prices(model, windows.test, windows.scaler, cfg.heads)
    test_rows = positions(frame, windows.test.target_times)
    for head in cfg.heads:
        scaled = model.predict(np.asarray(windows.test.x), verbose=0)[head.name]
        offset = frame[head.columns].iloc[:280].mean().to_numpy()  # the train split: 70 % of 400 rows
        scale = frame[head.columns].iloc[:280].std(ddof=0).to_numpy()
        np.testing.assert_allclose(predicted[head.name], scaled * scale + offset, rtol=1e-9)
        # Actual and last-input values straight from the frame, independent of the windows' scaling.
        values = frame[head.columns].to_numpy()
        actual = np.stack([values[row:row + cfg.window.horizon] for row in test_rows])
        last = values[test_rows - 1]
        close = head.columns.index("close") if "close" in head.columns else None
        expected_model = metrics(predicted[head.name], actual, last[:, close] if close is not None else None,
                                 close)
        expected_persistence = metrics(np.repeat(last[:, None, :], cfg.window.horizon, axis=1), actual)
        scores = report["heads"][head.name]
        assert scores["model"] == pytest.approx(expected_model)  # relative 1e-6
        for name in ("mae", "rmse", "mape"):
            assert scores["persistence"][name] == pytest.approx(expected_persistence[name], rel=1e-6)
        assert scores["skill"] == pytest.approx(1 - expected_model["mae"] / expected_persistence["mae"], rel=1e-6)
    assert 0 <= report["heads"]["ohlc"]["model"]["direction_accuracy"] <= 1
    assert report["heads"]["bb"]["model"]["direction_accuracy"] is None  # bb has no close column
