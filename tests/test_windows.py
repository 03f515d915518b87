"""Windows: chronological split, scaling fit on the train rows only, sliding windows shaped exactly like
the model heads, and the saved preprocessing that `predict` replays."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from tests.conftest import SHARED_OHLCV, tiny_config_dict
from trainer.config import RunConfig
from trainer.errors import JobError, UserError
from trainer.windows import Scaler, make_inputs, make_windows

SEQ_SHAPES = {"ohlc": (3, 4), "bb": (3, 2)}  # the tiny config: horizon 3, heads ohlc (4 columns), bb (2)


def feature_frame(rows: int = 400) -> pd.DataFrame:
    """Real BTCUSDT 1h candles plus simple rolling stand-ins for the tiny config's indicator columns
    (this module only needs columns of those names; trainer/features.py computes the real ones)."""
    candles = pd.read_csv(SHARED_OHLCV / "BTCUSDT_1h.csv.gz", nrows=rows + 19)
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
    return RunConfig.model_validate(raw)


def positions(frame: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Row numbers of the frame at the given (naive UTC) timestamps."""
    index = frame.index.values.astype("datetime64[ns]")
    found = np.searchsorted(index, times)
    assert np.array_equal(index[found], times)
    return found


def test_windows_are_chronological_and_line_up_with_the_frame(tmp_path):
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    original = frame.copy()
    windows = make_windows(frame, cfg, SEQ_SHAPES)
    pd.testing.assert_frame_equal(frame, original)  # scaled in a copy, never in the caller's frame
    columns = cfg.features.columns
    heads = {head.name: head.columns for head in cfg.heads}
    previous_last_target = -1
    for split in (windows.train, windows.val, windows.test):
        n = len(split.x)
        assert split.x.shape == (n, 16, len(columns)) and split.x.dtype == np.float32
        assert {name: y.shape for name, y in split.y.items()} == {"ohlc": (n, 3, 4), "bb": (n, 3, 2)}
        assert split.target_times.dtype == np.dtype("datetime64[ns]") and split.target_times.shape == (n,)
        rows = positions(frame, split.target_times)
        assert rows[0] > previous_last_target  # no target row is shared between splits
        previous_last_target = rows[-1] + 2
        for sample in sorted({0, n - 1, *range(0, n, 7)}):  # a spread of samples, both ends included
            row = rows[sample]
            expected_x = windows.scaler.transform(frame.iloc[row - 16:row])
            np.testing.assert_array_equal(split.x[sample], expected_x)
            for name, head_columns in heads.items():
                target_rows = frame.iloc[row:row + 3]
                np.testing.assert_array_equal(split.y[name][sample],
                                              windows.scaler.transform(target_rows, head_columns))
                np.testing.assert_array_equal(split.y_raw[name][sample], target_rows[head_columns])
                np.testing.assert_array_equal(split.last_inputs[name][sample],
                                              frame[head_columns].iloc[row - 1].to_numpy())
    splits = windows.preprocessing()["splits"]
    assert [splits[s]["rows"] for s in ("train", "val", "test")] == [280, 60, 60]
    assert pd.Timestamp(splits["train"]["last"]) < pd.Timestamp(splits["val"]["first"])
    assert pd.Timestamp(splits["test"]["last"]) == frame.index[-1]


@pytest.mark.parametrize("kind", ["standard", "minmax"])
def test_scaler_is_fit_on_the_train_rows_only(tmp_path, kind):
    cfg = tiny_cfg(tmp_path, scaler=kind)
    frame = feature_frame()
    windows = make_windows(frame, cfg, SEQ_SHAPES)
    train_rows = frame[cfg.features.columns].iloc[:windows.preprocessing()["splits"]["train"]["rows"]]
    if kind == "standard":
        np.testing.assert_allclose(windows.scaler.offset, train_rows.mean(), rtol=1e-12)
        np.testing.assert_allclose(windows.scaler.scale, train_rows.std(ddof=0), rtol=1e-12)
    else:
        np.testing.assert_allclose(windows.scaler.offset, train_rows.min(), rtol=1e-12)
        np.testing.assert_allclose(windows.scaler.scale, train_rows.max() - train_rows.min(), rtol=1e-12)
        assert windows.train.x.min() >= 0 and windows.train.x.max() <= 1


@pytest.mark.parametrize("changed", ["first row after the train split", "every row after the train split"])
def test_no_leakage_from_rows_after_the_train_split(tmp_path, changed):
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    before = make_windows(frame, cfg, SEQ_SHAPES)
    train_end = before.preprocessing()["splits"]["train"]["rows"]
    end = train_end + 1 if changed.startswith("first") else len(frame)
    altered = frame.copy()
    altered.iloc[train_end:end] *= np.random.default_rng(0).uniform(0.5, 2.0, size=(end - train_end, 1))
    after = make_windows(altered, cfg, SEQ_SHAPES)

    np.testing.assert_array_equal(after.train.x, before.train.x)
    for name in SEQ_SHAPES:
        np.testing.assert_array_equal(after.train.y[name], before.train.y[name])
    assert after.scaler.to_dict() == before.scaler.to_dict()
    # The change did reach the later splits, so the test would see a leak if there were one.
    assert not np.array_equal(after.val.x, before.val.x)


def test_changing_a_train_row_changes_the_scaler(tmp_path):
    """The counterpart of the leakage test: the comparison it relies on does detect a change."""
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    before = make_windows(frame, cfg, SEQ_SHAPES)
    altered = frame.copy()
    altered.iloc[before.preprocessing()["splits"]["train"]["rows"] - 1] *= 1.5
    assert make_windows(altered, cfg, SEQ_SHAPES).scaler.to_dict() != before.scaler.to_dict()


def test_single_step_targets_take_the_exact_output_shape(tmp_path):
    cfg = tiny_cfg(tmp_path, horizon=1)
    frame = feature_frame()
    dense = make_windows(frame, cfg, {"ohlc": (4,), "bb": (2,)})
    per_step = make_windows(frame, cfg, {"ohlc": (1, 4), "bb": (1, 2)})
    n = len(dense.train.x)
    assert dense.train.y["ohlc"].shape == dense.train.y_raw["ohlc"].shape == (n, 4)
    assert per_step.train.y["ohlc"].shape == per_step.train.y_raw["ohlc"].shape == (n, 1, 4)
    np.testing.assert_array_equal(dense.train.y["ohlc"], per_step.train.y["ohlc"][:, 0])
    assert dense.preprocessing()["heads"][0] == {"name": "ohlc", "columns": ["open", "high", "low", "close"],
                                                 "target_shape": [4]}


@pytest.mark.parametrize("shapes, named", [
    ({"ohlc": (4,), "bb": (2,)}, "heads[0] 'ohlc'"),  # a vector output cannot hold 3 steps
    ({"ohlc": (3, 4), "bb": (3, 3)}, "heads[1] 'bb'"),  # 3 outputs for 2 columns
    ({"ohlc": (3, 4)}, "heads[1] 'bb'"),  # no output at all
])
def test_a_target_shape_that_does_not_fit_the_head_is_a_user_error(tmp_path, shapes, named):
    with pytest.raises(UserError, match="^" + re.escape(named) + ": model output"):
        make_windows(feature_frame(), tiny_cfg(tmp_path), shapes)


def test_too_few_rows_fail_the_job(tmp_path):
    with pytest.raises(JobError, match=r"too few .* the train split \(56 rows\) holds no complete window"):
        make_windows(feature_frame(80), tiny_cfg(tmp_path, lookback=60), SEQ_SHAPES)


def test_a_non_finite_feature_fails_the_job_naming_column_and_time(tmp_path):
    frame = feature_frame()
    frame.iloc[100, frame.columns.get_loc("atr")] = np.inf
    with pytest.raises(JobError, match=re.escape(f"atr is not finite at {frame.index[100]}")):
        make_windows(frame, tiny_cfg(tmp_path), SEQ_SHAPES)


@pytest.mark.parametrize("kind", ["standard", "minmax"])
def test_scaler_round_trips_exactly_through_json(kind):
    frame = feature_frame(100)
    frame["constant"] = 3.0
    scaler = Scaler.fit(kind, list(frame.columns), frame.to_numpy())
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


def test_make_inputs_replays_the_saved_preprocessing(tmp_path):
    cfg = tiny_cfg(tmp_path)
    frame = feature_frame()
    windows = make_windows(frame, cfg, SEQ_SHAPES)
    preprocessing = json.loads(json.dumps(windows.preprocessing()))
    assert (preprocessing["lookback"], preprocessing["horizon"]) == (16, 3)
    assert preprocessing["input_columns"] == cfg.features.columns
    # The frame up to the last test sample's inputs gives exactly that sample's x.
    last_input_row = positions(frame, windows.test.target_times[-1:])[0]
    inputs = make_inputs(frame.iloc[:last_input_row], preprocessing)
    assert inputs.shape == (1, 16, len(cfg.features.columns))
    np.testing.assert_array_equal(inputs[0], windows.test.x[-1])
    with pytest.raises(UserError, match="needs the last 16 feature rows; the data gives 10"):
        make_inputs(frame.iloc[:10], preprocessing)
    with pytest.raises(UserError, match="no column atr"):
        make_inputs(frame.drop(columns="atr"), preprocessing)
