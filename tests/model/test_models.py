"""Models from YAML: the three real families built (not trained) and checked layer by layer against
parameter counts computed from the layer formulas; heads shaped exactly like the window targets;
config mistakes as one-line UserErrors."""
from __future__ import annotations

from typing import Literal

import keras
import numpy as np
import pandas as pd
import pytest
from pydantic import Field, ValidationError

from tests.conftest import REPO, tiny_config_dict
from trainer.config import RunConfig, load_config
from trainer.data import load_candles
from trainer.data.features import load_features
from trainer.data.windows import LastInputs, make_windows
from trainer.errors import UserError
from trainer.evaluation.baselines import Baseline, fit_baselines
from trainer.heads.losses import Pinball
from trainer.model.layers import Layer
from trainer.model.models import build_model, count_params, output_shapes, predict_fixed_batches

pytestmark = pytest.mark.usefixtures("fresh_keras_session")


def lstm(units: int, inputs: int) -> int:
    """Four gates, each with input and recurrent kernels and a bias."""
    return 4 * (units * (inputs + units) + units)


def dense(inputs: int, units: int) -> int:
    return inputs * units + units


def layernorm(width: int) -> int:
    return 2 * width


def har_head(width: int, features: int, steps: int) -> int:
    """A HAR candle head (models._har_candle): open, close and the correction of the trunk per step, and the
    correction of the last input row, one per step."""
    return 3 * dense(width, 1) + dense(features, steps)


def _v7_decoder_and_heads(encoder_width: int) -> int:
    """RepeatVector(10) -> LSTM 64 -> LayerNorm -> per-step heads ohlc (HAR-started), bb 2, volatility 1."""
    return lstm(64, encoder_width) + layernorm(64) + har_head(64, 24, 10) + dense(64, 2) + dense(64, 1)


EXPECTED_PARAMS = {
    # 17 inputs (V8's 15, volume_surprise, market_range): BiLSTM 256 -> 128 -> 64, LSTM 32, each with LayerNorm;
    # Dense 128, 64, 32; head ohlc, HAR-started.
    "v8_stable": (17, 2 * lstm(256, 17) + layernorm(512) + 2 * lstm(128, 512) + layernorm(256)
                  + 2 * lstm(64, 256) + layernorm(128) + lstm(32, 128) + layernorm(32)
                  + dense(32, 128) + dense(128, 64) + dense(64, 32) + har_head(32, 17, 1)),  # 1,419,029
    # 24 inputs (OHLC, V7's 8 indicators, 10 of the candles' size and time, volume_surprise, market_range):
    # BiLSTM 128 -> BiLSTM 64 -> LSTM 32 encoder, each with LayerNorm.
    "v7": (24, 2 * lstm(128, 24) + layernorm(256) + 2 * lstm(64, 256) + layernorm(128)
           + lstm(32, 128) + layernorm(32) + _v7_decoder_and_heads(32)),
    # V7 with a bidirectional third encoder layer (so 64 wide into the RepeatVector).
    "v8_aligned": (24, 2 * lstm(128, 24) + layernorm(256) + 2 * lstm(64, 256) + layernorm(128)
                   + 2 * lstm(32, 128) + layernorm(64) + _v7_decoder_and_heads(64)),
}
KERAS_CLASS = {"lstm": "LSTM", "bilstm": "Bidirectional", "layernorm": "LayerNormalization",
               "dropout": "Dropout", "dense": "Dense", "repeat_vector": "RepeatVector"}


def random_frame(columns: list[str], rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    index = pd.date_range("2024-01-01", periods=rows, freq="h", tz="UTC", name="timestamp")
    return pd.DataFrame(100 + rng.normal(size=(rows, len(columns))).cumsum(axis=0), index=index, columns=columns)


def test_every_layer_kind_builds_its_keras_layer():
    required = {"units": 4}
    needs = {"dropout": {"rate": 0.1}, "layernorm": {}, "repeat_vector": {}}
    built = {kind: spec.model_validate({"kind": kind, **needs.get(kind, required)}).build(f"x_{kind}", horizon=3)
             for kind, spec in Layer.kinds.items()}
    assert {kind: type(layer).__name__ for kind, layer in built.items()} == {
        "lstm": "LSTM", "gru": "GRU", "bilstm": "Bidirectional", "bigru": "Bidirectional", "dense": "Dense",
        "time_dense": "TimeDistributed", "dropout": "Dropout", "layernorm": "LayerNormalization",
        "repeat_vector": "RepeatVector"}
    assert built["repeat_vector"].n == 3  # n defaults to the window's horizon


@pytest.fixture
def noise_layer():
    """A new layer kind, added as a user would: this one class, nothing else."""
    class GaussianNoiseLayer(Layer):
        kind: Literal["gaussian_noise"]
        stddev: float = Field(gt=0)

        def build(self, name: str, horizon: int) -> keras.layers.Layer:
            return keras.layers.GaussianNoise(self.stddev, name=name)

    yield GaussianNoiseLayer
    del Layer.kinds["gaussian_noise"]


def test_a_new_layer_kind_is_one_class(tmp_path, noise_layer):
    layers = [{"kind": "gaussian_noise", "stddev": 0.1}, *tiny_config_dict(tmp_path)["model"]["layers"]]
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, model={"layers": layers}))
    assert isinstance(cfg.model.layers[0], noise_layer)
    assert cfg.model_dump(mode="json")["model"]["layers"][0] == {"kind": "gaussian_noise", "stddev": 0.1}
    model = build_model(cfg.network, cfg.train)
    assert type(model.get_layer("trunk_0_gaussian_noise")).__name__ == "GaussianNoise"
    with pytest.raises(ValidationError, match="stddev"):
        RunConfig.model_validate(tiny_config_dict(tmp_path, model={"layers": [{"kind": "gaussian_noise"}]}))


@pytest.mark.parametrize("family", ["v8_stable", "v7", "v8_aligned"])
def test_family_models_match_their_specification(family):
    cfg = load_config(REPO / "configs" / f"{family}.yaml")
    n_features, expected_params = EXPECTED_PARAMS[family]
    assert len(cfg.features.columns) == n_features
    model = build_model(cfg.network, cfg.train)

    assert model.count_params() == expected_params == count_params(cfg.network)
    trunk = [layer for layer in model.layers if layer.name.startswith("trunk_")]
    assert [type(layer).__name__ for layer in trunk] == [KERAS_CLASS[s.kind] for s in cfg.model.layers]
    for layer, spec in zip(trunk, cfg.model.layers):
        if spec.kind in ("lstm", "bilstm"):
            rnn = layer.forward_layer if spec.kind == "bilstm" else layer
            assert (rnn.units, rnn.return_sequences, rnn.dropout) == (spec.units, spec.return_sequences,
                                                                      spec.dropout)
    horizon = cfg.window.horizon
    per_step = horizon > 1
    assert output_shapes(model, cfg.heads) == {h.name: (horizon, len(h.columns)) if per_step else (len(h.columns),)
                                               for h in cfg.heads}
    assert tuple(model.output["ohlc_range"].shape[1:]) == ((horizon, 1) if per_step else (1,))
    for head in cfg.heads:
        layer = model.get_layer(head.name)
        assert type(layer).__name__ == ("Concatenate" if head.name == "ohlc" else
                                        "TimeDistributed" if per_step else "Dense")
        assert layer.dtype_policy.compute_dtype == "float32"
    assert cfg.heads[0].kind == "har_candle" and cfg.window.relative_to == "last_close"  # the families' defaults
    compiled = model.get_compile_config()
    assert compiled["loss"]["ohlc_range"]["class_name"] == "Qlike"  # the range on QLIKE
    assert {k: v for k, v in compiled["loss"].items() if k != "ohlc_range"} == {h.name: h.loss for h in cfg.heads}
    assert compiled["loss_weights"] == {h.name: h.weight for h in cfg.heads} | {"ohlc_range": 1.0}
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    assert model.optimizer.clipvalue == cfg.train.clipvalue
    assert float(model.optimizer.learning_rate) == pytest.approx(cfg.train.learning_rate)

    # Targets come out with exactly the output shapes: (N, 4) for V8-stable, (N, 10, 4) seq2seq.
    windows = make_windows(random_frame(cfg.features.columns, 300), cfg.window, cfg.features.columns, cfg.heads,
                           output_shapes(model, cfg.heads))
    windows = windows.with_forecasts(np.full((300, horizon, 3), 0.01))  # HAR's forecasts, as train_one gives them
    outputs = model({k: v[:2] for k, v in windows.test.x.items()}, training=False)
    for head in cfg.heads:
        assert tuple(outputs[head.name].shape) == windows.test.y[head.name][:2].shape
    assert windows.test.y["ohlc"].shape[1:] == ((horizon, 4) if per_step else (4,))


@pytest.mark.parametrize("family", ["v8_stable", "v8_aligned"])
def test_lstms_stay_cudnn_eligible(family):
    """cuDNN runs an LSTM only with tanh / sigmoid, a bias, no recurrent dropout and no unroll."""
    cfg = load_config(REPO / "configs" / f"{family}.yaml")
    assert len(cfg.features.columns) == EXPECTED_PARAMS[family][0]
    model = build_model(cfg.network, cfg.train)
    lstms = [rnn for layer in model.layers
             for rnn in ([layer.forward_layer, layer.backward_layer] if hasattr(layer, "forward_layer") else [layer])
             if isinstance(rnn, keras.layers.LSTM)]
    assert len(lstms) >= 5
    for rnn in lstms:
        assert (rnn.activation.__name__, rnn.recurrent_activation.__name__) == ("tanh", "sigmoid")
        assert (rnn.recurrent_dropout, rnn.unroll, rnn.use_bias, rnn.use_cudnn) == (0, False, True, "auto")
    assert model.jit_compile is False  # XLA: slower on CPU, and it would keep the LSTMs off cuDNN on a GPU


def tiny(tmp_path, layers: list[dict] | None = None, **train) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    if layers is not None:
        raw["model"]["layers"] = layers
    raw["train"].update(train)
    return RunConfig.model_validate(raw)


def test_config_choices_reach_the_keras_layers_and_optimizer(tmp_path):
    cfg = tiny(tmp_path, [
        {"kind": "bigru", "units": 4, "return_sequences": True, "merge_mode": "sum", "recurrent_dropout": 0.1},
        {"kind": "time_dense", "units": 5, "activation": "relu"},
        {"kind": "gru", "units": 6},
        {"kind": "repeat_vector", "n": 3},
        {"kind": "lstm", "units": 7, "return_sequences": True},
    ], optimizer="adamw", clipnorm=0.5, learning_rate=0.01)
    model = build_model(cfg.network, cfg.train)
    bigru = model.get_layer("trunk_0_bigru")
    assert (bigru.merge_mode, bigru.forward_layer.recurrent_dropout) == ("sum", 0.1)
    assert model.get_layer("trunk_1_time_dense").output.shape == (None, 16, 5)
    assert model.get_layer("trunk_3_repeat_vector").output.shape == (None, 3, 6)
    assert output_shapes(model, cfg.heads) == {"ohlc": (3, 4), "bb": (3, 2)}
    assert isinstance(model.optimizer, keras.optimizers.AdamW) and model.optimizer.clipnorm == 0.5


@pytest.mark.parametrize("layers, message", [
    ([{"kind": "lstm", "units": 4}], r"^model\.layers: the last layer outputs one vector, but window\.horizon is 3"),
    ([{"kind": "lstm", "units": 4, "return_sequences": True}],
     r"^model\.layers: the last layer outputs a sequence of 16 steps, but window\.horizon is 3"),
    ([{"kind": "lstm", "units": 4}, {"kind": "lstm", "units": 4}], r"^model\.layers\[1\] \(lstm\): "),
])
def test_a_trunk_that_does_not_fit_the_horizon_is_a_user_error(tmp_path, layers, message):
    with pytest.raises(UserError, match=message):
        cfg = tiny(tmp_path, layers)
        build_model(cfg.network, cfg.train)


@pytest.mark.parametrize("horizon", [3, 1])
def test_candle_heads_give_consistent_candles_whatever_the_weights(tmp_path, horizon):
    """high >= max(open, close) and low <= min(open, close) by construction: random weights, random inputs,
    and the inversion to prices keep it so."""
    raw = tiny_config_dict(tmp_path)
    raw["window"]["horizon"] = horizon
    raw["heads"][0]["columns"] = ["close", "low", "open", "high"]  # a candle head's, in any order
    if horizon == 1:
        raw["model"]["layers"] = [{"kind": "lstm", "units": 8}]
    cfg = RunConfig.model_validate(raw)
    model = build_model(cfg.network, cfg.train)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(scale=3.0, size=w.shape) for w in model.get_weights()])
    windows = make_windows(random_frame(cfg.features.columns, 300), cfg.window, cfg.features.columns, cfg.heads,
                           output_shapes(model, cfg.heads))
    x = rng.normal(scale=3.0, size=(500, *windows.test.x.shape[1:])).astype("float32")
    outputs = {name: np.asarray(value) for name, value in model(x, training=False).items()}
    prices = windows.preprocessing.to_prices(outputs, LastInputs(rng.uniform(1, 1000, size=500), {}))["ohlc"]
    close, low, open_, high = (prices[..., i] for i in range(4))
    assert np.all(high >= np.maximum(open_, close)) and np.all(low <= np.minimum(open_, close))
    assert np.mean(high > np.maximum(open_, close)) > 0.5  # the wicks are real, not all zero
    assert np.ptp(open_) > 0 and np.ptp(close) > 0


def test_relative_heads_start_at_no_change(tmp_path):
    """Framed relative to the last close, an untrained model's outputs are 0, "no change" (a candle head's
    open and close; its wicks start at softplus(0))."""
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path))
    model = build_model(cfg.network, cfg.train)
    outputs = model(np.random.default_rng(0).normal(size=(4, 16, len(cfg.features.columns))), training=False)
    assert np.all(np.asarray(outputs["ohlc"])[..., [0, 3]] == 0) and np.all(np.asarray(outputs["bb"]) == 0)


QUANTILE_HEAD = {"name": "close_q", "kind": "quantile", "columns": ["close", "rsi"], "quantiles": [0.1, 0.5, 0.9]}


@pytest.mark.parametrize("horizon", [3, 1])
def test_a_quantile_heads_outputs_are_ordered_whatever_the_weights(tmp_path, horizon):
    """Each quantile at or above the one below by construction (a softplus gap, 0 only where float32 rounds it
    away): random weights, random inputs, and the inversion
    to prices keep the order; the targets keep the head's columns' shape (no quantile axis)."""
    raw = tiny_config_dict(tmp_path)
    raw["window"]["horizon"] = horizon
    raw["heads"].append(QUANTILE_HEAD)
    if horizon == 1:
        raw["model"]["layers"] = [{"kind": "lstm", "units": 8}]
    cfg = RunConfig.model_validate(raw)
    model = build_model(cfg.network, cfg.train)
    steps = (horizon,) if horizon > 1 else ()
    assert output_shapes(model, cfg.heads)["close_q"] == (*steps, 2)
    assert tuple(model.output["close_q"].shape[1:]) == (*steps, 3, 2)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(scale=3.0, size=w.shape) for w in model.get_weights()])
    windows = make_windows(random_frame(cfg.features.columns, 300), cfg.window, cfg.features.columns, cfg.heads,
                           output_shapes(model, cfg.heads))
    x = rng.normal(scale=3.0, size=(500, *windows.test.x.shape[1:])).astype("float32")
    outputs = np.asarray(model(x, training=False)["close_q"])
    assert (np.diff(outputs, axis=-2) >= 0).all() and np.mean(np.diff(outputs, axis=-2) > 0) > 0.9  # never cross
    prices = windows.preprocessing.head_prices(windows.preprocessing.heads[-1], outputs,
                                               LastInputs(rng.uniform(1, 1000, size=500), {}))
    assert (np.diff(prices, axis=-2) >= 0).all()  # prices (close) and rsi alike
    point = windows.preprocessing.point({**{h.name: None for h in windows.preprocessing.heads},
                                         "close_q": outputs})["close_q"]
    np.testing.assert_array_equal(point, outputs[..., 1, :])  # the median


def test_the_pinball_loss_is_each_levels_quantile_loss_averaged():
    levels = [0.1, 0.5, 0.9]
    y_true = np.array([[1.0, -2.0]])  # (batch, C)
    y_pred = np.array([[[0.0, 0.0], [1.0, -1.0], [3.0, 1.0]]])  # (batch, Q, C)
    error = y_true[:, None, :] - y_pred
    expected = np.mean(np.maximum(np.array(levels)[:, None] * error, (np.array(levels)[:, None] - 1) * error))
    assert float(Pinball(levels)(y_true, y_pred)) == pytest.approx(expected)


@pytest.mark.parametrize("change, message", [
    ({"quantiles": [0.5, 0.1]}, "increasing"),
    ({"quantiles": [0.5]}, "at least two"),
    ({"quantiles": [0.0, 0.5]}, "between 0 and 1"),
    ({"loss": "mae"}, "loss"),  # a quantile head is trained with the pinball loss: it has no loss to choose
])
def test_quantile_heads_are_checked(tmp_path, change, message):
    raw = tiny_config_dict(tmp_path)
    raw["heads"].append({**QUANTILE_HEAD, **change})
    with pytest.raises(ValueError, match=message):
        RunConfig.model_validate(raw)
    raw = tiny_config_dict(tmp_path)
    raw["heads"][0]["quantiles"] = [0.1, 0.9]  # on the candle head: a head of another kind
    with pytest.raises(ValueError, match="quantiles"):
        RunConfig.model_validate(raw)


HAR_HEAD = {"name": "ohlc", "kind": "har_candle", "columns": ["open", "high", "low", "close"], "loss": "mae"}


def har_windows(cfg: RunConfig, model: keras.Model, symbol: str = "BTCUSDT"):
    """The job's windows with HAR's forecasts (what train_one gives a HAR head), and the fitted baselines."""
    frame, _ = load_features(load_candles(cfg, symbol, "1h"), cfg.features, cfg.cache_path)
    windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, output_shapes(model, cfg.heads))
    fitted = fit_baselines(frame, "1h", cfg.window.horizon, windows.train.first_target_rows,
                           windows.val.first_target_rows)
    return windows.with_forecasts(fitted.har_inputs()), fitted


def test_an_untrained_har_head_forecasts_exactly_har(tmp_path):
    """HARNet's start: before any training the head's high and low excursions are HAR + time of day's, its range
    output HAR's root-mean-square range, and its close the last close."""
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[HAR_HEAD]))
    model = build_model(cfg.network, cfg.train)
    assert sorted(model.input) == ["har_high", "har_low", "har_range", "inputs"]
    assert set(model.output) == {"ohlc", "ohlc_range"}
    windows, fitted = har_windows(cfg, model)
    test, prep = windows.test, windows.preprocessing
    head = prep.heads[0]

    def forecast(x) -> dict[str, np.ndarray]:
        outputs = predict_fixed_batches(model, x)
        candle = prep.to_prices(prep.point(outputs), test.last)["ohlc"]
        return prep.candle_quantities(head, outputs, candle, test.last_close)

    har = fitted.forecast(test.first_target_rows)
    untrained = forecast(test.x)
    np.testing.assert_allclose(untrained["high"], har[Baseline.HAR_TOD]["high"], rtol=1e-6)
    np.testing.assert_allclose(untrained["low"], har[Baseline.HAR_TOD]["low"], rtol=1e-6)
    np.testing.assert_allclose(untrained["range"], har[Baseline.HAR_TOD_RMS]["range"], rtol=1e-6)
    np.testing.assert_allclose(untrained["return"], 0, atol=1e-12)
    # Not HAR's through some other path: give the head other HAR forecasts and its candles follow them
    doubled = forecast(windows.with_forecasts(2 * fitted.har_inputs()).test.x)
    np.testing.assert_allclose(doubled["range"], 2 * har[Baseline.HAR_TOD_RMS]["range"], rtol=1e-6)


def test_a_har_head_needs_a_candle_and_is_one(tmp_path):
    with pytest.raises(ValidationError, match="a candle head needs exactly the columns open, high, low, close"):
        RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[{**HAR_HEAD, "columns": ["close"]}]))
    with pytest.raises(ValidationError, match="heads 'ohlc' and 'other' both read the model input har_high: one "
                                              "head of kind har_candle at most"):
        RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[HAR_HEAD, {**HAR_HEAD, "name": "other"}]))
    with pytest.raises(ValidationError, match="ohlc_range"):
        RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[HAR_HEAD, {"name": "ohlc_range",
                                                                              "columns": ["close"]}]))
