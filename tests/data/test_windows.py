"""Windows: chronological split, framing relative to each window's last close (or absolute levels), scaling
fit on the train samples only, sliding windows shaped exactly like the model heads, the saved preprocessing
that `predict` replays, and the one inversion back to prices."""
from __future__ import annotations

import json
import re
from typing import get_args

import numpy as np
import pandas as pd
import pytest

from tests.conftest import CANDLES_DIR, REPO, tiny_config_dict
from trainer.config import RunConfig, WindowConfig, load_config
from trainer.data import load_candles
from trainer.data.features import compute_features
from trainer.data.scalers import Scaler
from trainer.data.windows import Preprocessing, framing, make_windows
from trainer.errors import JobError, UserError
from trainer.heads import PlainHead

SEQ_SHAPES = {"ohlc": (3, 4), "bb": (3, 2)}  # the tiny config: horizon 3, heads ohlc (4 columns), bb (2)


def feature_frame(rows: int = 400) -> pd.DataFrame:
    """Real BTCUSDT 1h candles plus simple rolling stand-ins for the tiny config's indicator columns
    (this module only needs columns of those names; trainer/data/features.py computes the real ones)."""
    candles = pd.read_csv(CANDLES_DIR / "BTCUSDT_1h.csv.gz", nrows=rows + 19)
    frame = candles.set_index(pd.to_datetime(candles.pop("timestamp"), utc=True))
    close = frame["close"]
    mean, std = close.rolling(20).mean(), close.rolling(20).std()
    frame["rsi"] = 100 * close.diff().clip(lower=0).rolling(14).mean() / close.diff().abs().rolling(14).mean()
    frame["bb_upper"], frame["bb_lower"] = mean + 2 * std, mean - 2 * std
    frame["atr"] = (frame["high"] - frame["low"]).rolling(14).mean()
    return frame.dropna()


def tiny_cfg(tmp_path, **window) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["window"].update(window)
    raw["heads"][0]["kind"] = "candle" if raw["window"].get("relative_to", "last_close") is not None else "plain"
    return RunConfig.model_validate(raw)


def windows_of(frame: pd.DataFrame, cfg: RunConfig, shapes: dict = SEQ_SHAPES):
    return make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, shapes)


def framed(values: pd.DataFrame, last_close: float, relative: bool) -> np.ndarray:
    """The framing spelled out column by column, independently of trainer.data.windows."""
    if not relative:
        return values.to_numpy()
    return np.stack([np.log(values[c] / last_close) if framing(c) == "level" else
                     values[c] / last_close if framing(c) == "difference" else values[c] for c in values.columns],
                    axis=-1)


FRAMINGS = pytest.mark.parametrize("relative_to", ["last_close", None])


def positions(frame: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Row numbers of the frame at the given (naive UTC) timestamps."""
    index = frame.index.to_numpy(dtype="datetime64[ns]")
    found = np.searchsorted(index, times)
    assert np.array_equal(index[found], times)
    return found


@FRAMINGS
def test_windows_are_chronological_and_line_up_with_the_frame(tmp_path, relative_to):
    cfg = tiny_cfg(tmp_path, relative_to=relative_to)
    frame = feature_frame()
    original = frame.copy()
    windows = windows_of(frame, cfg)
    pd.testing.assert_frame_equal(frame, original)  # framed and scaled in copies, never in the caller's frame
    prep = windows.preprocessing
    columns = cfg.features.columns
    heads = {head.name: head for head in prep.heads}
    previous_last_target = -1
    for split in (windows.train, windows.val, windows.test):
        n = len(split)
        assert split.x.shape == (n, 16, len(columns)) and split.x.dtype == np.float32
        assert {name: y.shape for name, y in split.y.items()} == {"ohlc": (n, 3, 4), "bb": (n, 3, 2)}
        assert split.target_times.dtype == np.dtype("datetime64[ns]") and split.target_times.shape == (n,)
        rows = positions(frame, split.target_times)
        assert rows[0] > previous_last_target  # no target row is shared between splits
        previous_last_target = rows[-1] + 2
        for sample in sorted({0, n - 1, *range(0, n, 7)}):  # a spread of samples, both ends included
            row = rows[sample]
            last_close = frame["close"].iloc[row - 1]
            expected_x = (framed(frame[columns].iloc[row - 16:row], last_close, relative_to is not None)
                          - prep.scaler.offset) / prep.scaler.scale
            np.testing.assert_allclose(split.x[sample], expected_x, rtol=1e-5, atol=1e-5)
            for name, head in heads.items():
                target_rows = frame[list(head.columns)].iloc[row:row + 3]
                expected_y = (framed(target_rows, last_close, relative_to is not None) - head.scaler.offset) \
                    / head.scaler.scale
                np.testing.assert_allclose(split.y[name][sample], expected_y, rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(split.y_raw[name][sample], target_rows)
                np.testing.assert_array_equal(split.last_inputs[name][sample],
                                              frame[list(head.columns)].iloc[row - 1].to_numpy())
    splits = prep.splits
    assert [splits[s]["rows"] for s in ("train", "val", "test")] == [280, 60, 60]
    assert pd.Timestamp(splits["train"]["last"]) < pd.Timestamp(splits["val"]["first"])
    assert pd.Timestamp(splits["test"]["last"]) == frame.index[-1]


def test_price_targets_framed_relative_to_the_last_close_keep_zero_at_zero(tmp_path):
    """Price levels' targets are log returns from the last close, scaled without an offset: an all-zero model
    output is "no change"; unitless columns keep an ordinary scaler."""
    raw = tiny_config_dict(tmp_path)
    raw["heads"] = [{"name": "ohlc", "kind": "candle", "columns": ["open", "high", "low", "close"]},
                    {"name": "momentum", "columns": ["rsi", "atr"]}]
    cfg = RunConfig.model_validate(raw)
    prep = windows_of(feature_frame(), cfg, {"ohlc": (3, 4), "momentum": (3, 2)}).preprocessing
    ohlc, momentum = prep.heads
    assert np.all(ohlc.scaler.offset == 0) and len(set(ohlc.scaler.scale)) == 1  # one scale: a candle stays one
    assert np.all(momentum.scaler.offset != 0)


@FRAMINGS
@pytest.mark.parametrize("kind", list(Scaler.kinds))
@pytest.mark.parametrize("lookback, horizon", [(24, 3), (5, 1)])
def test_the_scalers_are_those_of_every_train_window_materialised(tmp_path, kind, relative_to, lookback, horizon):
    """The proof that computing the scalers from the rows changes nothing: on real candles and V8-stable's real
    indicator columns (price levels, price differences, unitless), every train sample's input window and
    targets are materialised and framed one by one, independently of trainer.data.windows, and fit as they were
    before: the input scaler and each head's (anchored, shared for a candle) are those to float rounding;
    minmax's equal exactly what fitting the windows framed by trainer.data.windows' own framing gives."""
    cfg = load_config(REPO / "configs" / "v8_stable.yaml", [
        f"data.local.path={CANDLES_DIR}", "data.max_rows=1500", f"window.scaler={kind}",
        f"window.relative_to={relative_to or 'null'}", f"window.lookback={lookback}", f"window.horizon={horizon}",
        f"heads.0.kind={'candle' if relative_to is not None else 'plain'}", "train.early_stopping.monitor=val_loss",
        "train.reduce_lr.monitor=val_loss", "features.market=null"])
    heads = [*cfg.heads, PlainHead(kind="plain", name="momentum", columns=["rsi", "macd", "atr"])]
    frame = compute_features(load_candles(cfg, "SOLUSDT", "1h"), cfg.features)
    columns = cfg.features.columns
    windows = make_windows(frame, cfg.window, columns, heads, {h.name: (horizon, len(h.columns)) for h in heads})
    prep, train = windows.preprocessing, windows.train.first_target_rows
    assert len(train) > 900 and {"macd", "signal", "atr", "bb_upper", "rsi"} <= set(columns)

    values = frame[columns].to_numpy()
    last_close = values[train - 1, columns.index("close")][:, None, None]
    inputs = np.stack([values[row - lookback:row] for row in train])  # (n, lookback, F), as the model sees them
    relative = relative_to is not None
    assert_same_scaler(prep.scaler, Scaler.of(kind).fit(columns, framed_values(inputs, last_close, columns, relative)))
    if kind == "minmax":  # exactly what fitting the windows framed by trainer.data.windows' own framing gives
        rows = prep.framing.encode(values.copy(), frame.index)
        encoded = np.stack([rows[row - lookback:row] for row in train])
        anchor = rows[train - 1, prep.framing.anchor_column][:, None, None]
        materialised = prep.framing.apply(encoded, anchor)
        np.testing.assert_array_equal(prep.framing.frame(encoded.copy(), anchor), materialised)  # host == device
        fit = Scaler.of(kind).fit(columns, materialised)
        assert np.array_equal(prep.scaler.offset, fit.offset) and np.array_equal(prep.scaler.scale, fit.scale)
        assert windows.train.x.min() >= -1e-6 and windows.train.x.max() <= 1 + 1e-6
    for head, target in zip(heads, prep.heads, strict=True):
        positions = [columns.index(c) for c in head.columns]
        ahead = np.stack([values[row:row + horizon, positions] for row in train])
        assert_same_scaler(target.scaler, Scaler.of(kind).fit(
            head.columns, framed_values(ahead, last_close, head.columns, relative),
            anchored=[relative and framing(c) == "level" for c in head.columns], shared=head.shares_scale))


def assert_same_scaler(actual: Scaler, expected: Scaler) -> None:
    """Equal to float rounding: offsets within 1e-9 of the scale, scales within 1e-9 of themselves."""
    assert (actual.kind, actual.columns) == (expected.kind, expected.columns)
    np.testing.assert_allclose((actual.offset - expected.offset) / expected.scale, 0, atol=1e-9)
    np.testing.assert_allclose(actual.scale, expected.scale, rtol=1e-9)


def framed_values(values: np.ndarray, last_close: np.ndarray, columns: list[str], relative: bool) -> np.ndarray:
    """`framed` for arrays (..., columns) of raw values."""
    if not relative:
        return values
    return np.stack([np.log(values[..., i] / last_close[..., 0]) if framing(c) == "level" else
                     values[..., i] / last_close[..., 0] if framing(c) == "difference" else values[..., i]
                     for i, c in enumerate(columns)], axis=-1)


def _fitted(windows) -> dict:
    """The scalers, as saved."""
    saved = windows.preprocessing.to_dict()
    return {"scaler": saved["scaler"], "heads": saved["heads"]}


@FRAMINGS
@pytest.mark.parametrize("changed", ["first row after the train split", "every row after the train split"])
def test_no_leakage_from_rows_after_the_train_split(tmp_path, changed, relative_to):
    cfg = tiny_cfg(tmp_path, relative_to=relative_to)
    frame = feature_frame()
    before = windows_of(frame, cfg)
    train_end = before.preprocessing.splits["train"]["rows"]
    end = train_end + 1 if changed.startswith("first") else len(frame)
    altered = frame.copy()
    altered.iloc[train_end:end] *= np.random.default_rng(0).uniform(0.5, 2.0, size=(end - train_end, 1))
    after = windows_of(altered, cfg)

    np.testing.assert_array_equal(after.train.x, before.train.x)
    for name in SEQ_SHAPES:
        np.testing.assert_array_equal(after.train.y[name], before.train.y[name])
    assert _fitted(after) == _fitted(before)
    # The change did reach the later splits, so the test would see a leak if there were one.
    assert not np.array_equal(after.val.x, before.val.x)


def test_a_window_uses_nothing_after_its_last_input_row(tmp_path):
    """Relative framing reads each window's anchor at its own last input row: later rows (its targets and
    everything after) cannot change its inputs; its last input row does."""
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    before = windows_of(frame, cfg)
    sample = 20
    first_target = positions(frame, before.test.target_times[sample:sample + 1])[0]
    later = frame.copy()
    later.iloc[first_target:] *= 1.3
    after = windows_of(later, cfg)
    np.testing.assert_array_equal(after.test.x[sample], before.test.x[sample])
    assert after.test.anchor[sample] == before.test.anchor[sample]
    last_input = frame.copy()
    last_input.iloc[first_target - 1] *= 1.3
    assert not np.array_equal(windows_of(last_input, cfg).test.x[sample], before.test.x[sample])


def test_changing_a_train_row_changes_the_scalers(tmp_path):
    """The counterpart of the leakage test: the comparison it relies on does detect a change."""
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    before = windows_of(frame, cfg)
    altered = frame.copy()
    altered.iloc[before.preprocessing.splits["train"]["rows"] // 2] *= 1.5
    assert _fitted(windows_of(altered, cfg)) != _fitted(before)


def test_single_step_targets_take_the_exact_output_shape(tmp_path):
    cfg = tiny_cfg(tmp_path, horizon=1)
    frame = feature_frame()
    dense = windows_of(frame, cfg, {"ohlc": (4,), "bb": (2,)})
    per_step = windows_of(frame, cfg, {"ohlc": (1, 4), "bb": (1, 2)})
    n = len(dense.train)
    assert dense.train.y["ohlc"].shape == dense.train.y_raw["ohlc"].shape == (n, 4)
    assert per_step.train.y["ohlc"].shape == per_step.train.y_raw["ohlc"].shape == (n, 1, 4)
    np.testing.assert_array_equal(dense.train.y["ohlc"], per_step.train.y["ohlc"][:, 0])
    saved = dense.preprocessing.to_dict()["heads"][0]
    assert (saved["name"], saved["columns"], saved["target_shape"]) == ("ohlc", ["open", "high", "low", "close"], [4])


@pytest.mark.parametrize("shapes, named", [
    ({"ohlc": (4,), "bb": (2,)}, "heads[0] 'ohlc'"),  # a vector output cannot hold 3 steps
    ({"ohlc": (3, 4), "bb": (3, 3)}, "heads[1] 'bb'"),  # 3 outputs for 2 columns
    ({"ohlc": (3, 4)}, "heads[1] 'bb'"),  # no output at all
])
def test_a_target_shape_that_does_not_fit_the_head_is_a_user_error(tmp_path, shapes, named):
    with pytest.raises(UserError, match="^" + re.escape(named) + ": model output"):
        windows_of(feature_frame(), tiny_cfg(tmp_path), shapes)


def test_too_few_rows_fail_the_job(tmp_path):
    with pytest.raises(JobError, match=r"too few .* the train split \(56 rows\) holds no complete window"):
        windows_of(feature_frame(80), tiny_cfg(tmp_path, lookback=60))


def test_a_non_finite_feature_fails_the_job_naming_column_and_time(tmp_path):
    frame = feature_frame()
    frame.iloc[100, frame.columns.get_loc("atr")] = np.inf
    with pytest.raises(JobError, match=re.escape(f"atr is not finite at {frame.index[100]}")):
        windows_of(frame, tiny_cfg(tmp_path))


def test_a_price_level_that_is_not_positive_fails_the_job_when_framed_relative(tmp_path):
    frame = feature_frame()
    frame.iloc[100, frame.columns.get_loc("bb_lower")] = -3.0
    with pytest.raises(JobError, match=re.escape(f"bb_lower is -3 at {frame.index[100]}; a price level must be "
                                                 "positive")):
        windows_of(frame, tiny_cfg(tmp_path))
    windows_of(frame, tiny_cfg(tmp_path, relative_to=None))  # absolute levels may be anything finite


@pytest.mark.parametrize("kind", list(Scaler.kinds))
def test_scaler_round_trips_exactly_through_json(kind):
    frame = feature_frame(100)
    frame["constant"] = 3.0
    scaler = Scaler.of(kind).fit(list(frame.columns), frame.to_numpy())
    assert scaler.scale[-1] == 1.0  # zero spread would divide by zero
    restored = Scaler.from_dict(json.loads(json.dumps(scaler.to_dict())))
    assert (restored.kind, restored.columns) == (scaler.kind, scaler.columns)
    assert np.array_equal(restored.offset, scaler.offset) and np.array_equal(restored.scale, scaler.scale)
    scaled = restored.transform(frame)
    assert scaled.dtype == np.float32
    np.testing.assert_allclose(restored.inverse(scaled, frame.columns), frame, rtol=1e-6)
    # A subset of columns, in another order, from an array.
    subset = ["close", "open"]
    np.testing.assert_array_equal(restored.transform(frame[subset].to_numpy(), subset), scaled[:, [3, 0]])
    with pytest.raises(UserError, match="no column nope"):
        restored.transform(frame, ["close", "nope"])


@FRAMINGS
def test_make_inputs_replays_the_saved_preprocessing(tmp_path, relative_to):
    cfg = tiny_cfg(tmp_path, relative_to=relative_to)
    frame = feature_frame()
    windows = windows_of(frame, cfg)
    prep = Preprocessing.from_dict(json.loads(json.dumps(windows.preprocessing.to_dict())))
    assert (prep.lookback, prep.horizon, prep.relative_to) == (16, 3, relative_to)
    assert list(prep.input_columns) == cfg.features.columns
    # The frame up to the last test sample's inputs gives exactly that sample's x and anchor.
    last_input_row = positions(frame, windows.test.target_times[-1:])[0]
    inputs, last = prep.make_inputs(frame.iloc[:last_input_row])
    assert inputs.shape == (1, 16, len(cfg.features.columns))
    np.testing.assert_array_equal(inputs[0], windows.test.x[-1])
    np.testing.assert_array_equal(last.close, windows.test.last_close[-1:])
    for head, values in windows.test.last_inputs.items():  # each head's persistence
        np.testing.assert_array_equal(last.heads[head], values[-1:])
    with pytest.raises(UserError, match="needs the last 16 feature rows; the data gives 10"):
        prep.make_inputs(frame.iloc[:10])
    with pytest.raises(UserError, match="no column atr"):
        prep.make_inputs(frame.drop(columns="atr"))


def test_an_all_zero_output_is_no_change_from_the_last_close_exactly(tmp_path):
    """The inversion: zeros -> every price at its sample's last close, to float precision; the last close is
    persistence's forecast of the close."""
    windows = windows_of(feature_frame(), tiny_cfg(tmp_path))
    test = windows.test
    zeros = {name: np.zeros_like(y) for name, y in test.y.items()}
    prices = windows.preprocessing.to_prices(zeros, test.last)
    last_close = test.last_inputs["ohlc"][:, 3]
    for name in SEQ_SHAPES:
        np.testing.assert_array_equal(prices[name], np.broadcast_to(last_close[:, None, None], prices[name].shape))


@FRAMINGS
def test_the_scaled_targets_invert_to_the_actual_prices(tmp_path, relative_to):
    windows = windows_of(feature_frame(), tiny_cfg(tmp_path, relative_to=relative_to))
    test = windows.test
    prices = windows.preprocessing.to_prices(test.y, test.last)
    for name in SEQ_SHAPES:
        np.testing.assert_allclose(prices[name], test.y_raw[name], rtol=1e-6)  # the targets are float32


@pytest.mark.parametrize("factor", [0.0, 0.35, 1.0])
def test_shrinking_toward_persistence_keeps_candles_candles(tmp_path, factor):
    """A candle head's body (open, close) is weighted toward its persistence, the last close ("no change"), its wicks
    kept: random outputs stay consistent candles; factor 0 puts open and close at the last close exactly, and a plain
    head (bands) at each column's last value; factor 1 changes nothing."""
    windows = windows_of(feature_frame(), tiny_cfg(tmp_path))
    test = windows.test
    prep = windows.preprocessing.with_shrink({"ohlc": factor, "bb": factor})
    rng = np.random.default_rng(1)
    body = rng.normal(size=(len(test), 3, 2))
    wicks = np.abs(rng.normal(size=(len(test), 3, 2)))
    outputs = {"ohlc": np.stack([body[..., 0], body.max(-1) + wicks[..., 0], body.min(-1) - wicks[..., 1],
                                 body[..., 1]], axis=-1).astype(np.float32),
               "bb": rng.normal(size=(len(test), 3, 2)).astype(np.float32)}
    prices = prep.to_prices(outputs, test.last)
    unshrunk = windows.preprocessing.to_prices(outputs, test.last)
    o, h, low, c = (prices["ohlc"][..., i] for i in range(4))
    assert np.all(h >= np.maximum(o, c)) and np.all(low <= np.minimum(o, c))
    if factor == 1.0:
        np.testing.assert_array_equal(prices["ohlc"], unshrunk["ohlc"])
    if factor == 0.0:
        np.testing.assert_array_equal(c, np.broadcast_to(test.last_close[:, None], c.shape))
        np.testing.assert_array_equal(o, c)
        np.testing.assert_allclose(prices["bb"], np.broadcast_to(test.last_inputs["bb"][:, None], (len(test), 3, 2)),
                                   rtol=1e-12)
    # The wicks, in log returns, are the model's whatever the factor.
    np.testing.assert_allclose(np.log(h / np.maximum(o, c)), np.log(unshrunk["ohlc"][..., 1] / np.maximum(
        unshrunk["ohlc"][..., 0], unshrunk["ohlc"][..., 3])), atol=1e-12)
    saved = Preprocessing.from_dict(json.loads(json.dumps(prep.to_dict())))
    assert [h.shrink for h in saved.heads] == [factor, factor]


@pytest.mark.parametrize("factor", [0.0, 0.35])
def test_shrinking_a_har_heads_body_keeps_its_excursions_from_the_last_close(tmp_path, factor):
    """A HAR head's high and low are excursions from the last close (HAR's, corrected): shrinking the body toward
    no change leaves them where they are, unless the body still reaches past them; the candle stays a candle."""
    raw = tiny_config_dict(tmp_path)
    raw["heads"][0].update(kind="har_candle", loss="mae")
    windows = windows_of(feature_frame(), RunConfig.model_validate(raw))
    test = windows.test
    prep = windows.preprocessing.with_shrink({"ohlc": factor})
    rng = np.random.default_rng(2)
    body = rng.normal(0, 0.3, size=(len(test), 3, 2))
    high = np.maximum(body.max(-1), np.abs(rng.normal(size=(len(test), 3))))
    low = np.minimum(body.min(-1), -np.abs(rng.normal(size=(len(test), 3))))
    outputs = {"ohlc": np.stack([body[..., 0], high, low, body[..., 1]], axis=-1).astype(np.float32),
               "bb": rng.normal(size=(len(test), 3, 2)).astype(np.float32)}
    prices, unshrunk = (p.to_prices(outputs, test.last)["ohlc"] for p in (prep, windows.preprocessing))
    o, h, low_, c = (prices[..., i] for i in range(4))
    assert np.all(h >= np.maximum(o, c)) and np.all(low_ <= np.minimum(o, c))
    np.testing.assert_allclose(h, np.maximum(unshrunk[..., 1], np.maximum(o, c)), rtol=1e-12)
    np.testing.assert_allclose(low_, np.minimum(unshrunk[..., 2], np.minimum(o, c)), rtol=1e-12)
    if factor == 0.0:
        np.testing.assert_allclose(h, unshrunk[..., 1], rtol=1e-12)  # the excursions exactly as forecast


def test_a_new_scaler_kind_is_one_class_that_fits_and_is_saved_and_read_back(monkeypatch):
    """The config accepts every kind of trainer.data.scalers and nothing else; a kind defined anywhere is known by
    its name, fits, and is read back from a preprocessing file as the kind it is, with nothing else to change."""
    assert get_args(WindowConfig.model_fields["scaler"].annotation) == tuple(Scaler.kinds) == ("standard", "minmax")
    monkeypatch.setattr(Scaler, "kinds", dict(Scaler.kinds))  # the test's kind is gone after it

    class MaxAbsScaler(Scaler):
        kind = "maxabs"

        @classmethod
        def statistics(cls, values):
            return np.zeros(values.shape[1]), np.abs(values).max(axis=0)

        @classmethod
        def affine(cls, zero, largest):
            return zero, largest, largest

        @classmethod
        def pooled(cls, from_zero):
            return from_zero.max()

    frame = feature_frame(100)[["open", "close", "rsi"]]
    scaler = Scaler.of("maxabs").fit(list(frame.columns), frame.to_numpy())
    np.testing.assert_array_equal(scaler.scale, frame.abs().max().to_numpy())
    restored = Scaler.from_dict(json.loads(json.dumps(scaler.to_dict())))
    assert type(restored) is MaxAbsScaler and restored.to_dict() == scaler.to_dict()
    with pytest.raises(ValueError, match="unknown scaler 'robust' \\(standard or minmax or maxabs\\)"):
        Scaler.of("robust")
