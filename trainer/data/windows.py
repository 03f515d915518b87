"""Feature frame -> chronological train/val/test windows, framed and scaled with statistics of the train
split only; and back: model outputs -> prices, in one place (Preprocessing.to_prices).

A sample is `lookback` input rows followed by `horizon` target rows. It belongs to the split that holds
all of its target rows; its inputs may reach back into the previous split (that past is known when
predicting), never forward. So the train samples read train rows only: nothing after the train split
can change them, nor the scalers, which are fit on the train samples.

Framing (`window.relative_to`). With `last_close`, each window is seen relative to the close of its own
last input row (NLinear, Zeng et al. 2023; RevIN, Kim et al. 2022): a model of levels cannot forecast a
price outside the range it was trained on, a model of changes can.
- price levels (`framing` "level": the candle's prices, bb_upper, bb_lower) enter as log(value / last
  close); targets are the log return from the last close to each target candle. Their target scalers keep
  offset 0, so an all-zero model output is the "no change" forecast: every price at the last close.
- price differences ("difference": macd, signal, atr) enter divided by the last close.
- every other column (rsi, roc, bb_width_pct, bb_position, volatility, volume_norm, volume, ...) is unitless
  or not a price, and enters as it is.
With `relative_to: null` every column enters as it is: absolute levels, as the old scripts did.
Either way the framed values are then scaled per column (`window.scaler`, a class each in scalers.py), with
statistics of the train samples only. Framing uses nothing after a window's last input row.

Nothing here materialises the train windows: the scalers' statistics over every framed (window, row) come
from the rows (Scaler.fit_windows), and training frames its batches on the device (training.DeviceFeed).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import JobError, UserError
from ..heads import CANDLE, Head
from .indicators import Indicator
from .market import Reference
from .scalers import Scaler, float32
from .settings import Split, WindowConfig

SPLITS = ("train", "val", "test")


def framing(column: str) -> str:
    """How a column is framed relative to the last close: "level" (the candle's prices, and an indicator that is
    a price), "difference" (an indicator that is a difference of prices) or "unitless" (Indicator.framing)."""
    return "level" if column in CANDLE else getattr(Indicator.kinds.get(column), "framing", "unitless")


@dataclass(frozen=True, eq=False)
class Framing:
    """Which columns are framed relative to the last close, and how (see the module's docstring).

    Windows are cut from *encoded* rows: log(value) for price levels when relative, else the value. Then,
    with `anchor` = the encoded close of the window's last input row (log of the last close),
        framed = (encoded - anchor * level) * exp(-anchor * difference)
    i.e. log(value / last close) for levels, value / last close for differences, the value otherwise.
    With relative_to null both masks are 0 and framing is the identity."""
    relative_to: str | None
    columns: tuple[str, ...]

    @cached_property
    def level(self) -> np.ndarray:
        """1.0 for each column framed as a log ratio to the last close, else 0.0 (float32: for the device too)."""
        return np.asarray([self.relative_to is not None and framing(c) == "level" for c in self.columns], np.float32)

    @cached_property
    def difference(self) -> np.ndarray:
        """1.0 for each column framed as a ratio to the last close, else 0.0."""
        return np.asarray([self.relative_to is not None and framing(c) == "difference" for c in self.columns],
                          np.float32)

    @property
    def anchor_column(self) -> int:
        """Where the last close is read in the rows (any column when nothing is framed)."""
        return self.columns.index("close") if self.relative_to is not None else 0

    def encode(self, raw: np.ndarray, where: pd.Index) -> np.ndarray:
        """Raw rows (T, F) float64 -> encoded rows, in place."""
        levels = np.flatnonzero(self.level)
        not_positive = [(int(np.argmin(raw[:, c] > 0)), c) for c in levels if not (raw[:, c] > 0).all()]
        if not_positive:
            row, col = min(not_positive)
            raise JobError(f"feature frame: {self.columns[col]} is {raw[row, col]:g} at {where[row]}; a price "
                           "level must be positive to be framed relative to the last close (window.relative_to)")
        for c in levels:
            np.log(raw[:, c], out=raw[:, c])
        return raw

    def apply(self, encoded, anchor, exp: Callable = np.exp, columns: Sequence[int] | None = None):
        """Frame encoded values (..., C) against `anchor` (broadcastable to them), as a new array: TensorFlow on
        the training device (`exp` = tf.exp), or numpy. `columns`: positions of the C columns, default all."""
        if self.relative_to is None:  # nothing framed: not even an exp per value on the device's hot path
            return encoded
        level, difference = self.masks(columns)
        return (encoded - anchor * level) * exp(-anchor * difference)

    def masks(self, columns: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(level, difference) of the columns at these positions (default all)."""
        return (self.level, self.difference) if columns is None else \
            (self.level[list(columns)], self.difference[list(columns)])

    def frame(self, encoded: np.ndarray, anchor: np.ndarray, columns: Sequence[int] | None = None) -> np.ndarray:
        """apply on the host, in place in `encoded` (float64, returned): the same operations, with no array of
        the values' size per term. Windows (N, lookback, C) against anchors (N, 1, 1): the terms are (N, 1, C)."""
        if self.relative_to is not None:
            level, difference = self.masks(columns)
            anchor = np.array(anchor, dtype=np.float64)  # a copy: it may be a view of `encoded`
            encoded -= anchor * level
            encoded *= np.exp(-anchor * difference)
        return encoded

    def invert(self, framed: np.ndarray, last_close: np.ndarray, columns: Sequence[int]) -> np.ndarray:
        """Framed values (..., C) of `columns` back to raw units, float64; the inverse of apply, given the
        last close (broadcastable to them). Levels are last_close * exp(framed): a framed 0 is the last close
        exactly."""
        level, difference = self.level[list(columns)] > 0, self.difference[list(columns)] > 0
        framed = np.asarray(framed, dtype=np.float64)
        raw = np.where(difference, framed * last_close, framed)
        raw[..., level] = last_close * np.exp(framed[..., level])
        return raw


@dataclass(frozen=True)
class LastInputs:
    """What forecasts follow, raw: each sample's last input close (N,), which price levels are framed against, and
    each head's columns at its last input row (head -> (N, C)): that head's persistence."""
    close: np.ndarray
    heads: dict[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class HeadTarget:
    """A head fitted to a job: its kind and settings (trainer.heads), its targets' shape without the batch axis, how
    its framed targets are scaled, and the weight of its forecast against its own persistence (Preprocessing.shrunk;
    1: as the model says, 0: each column's last value)."""
    spec: Head
    shape: tuple[int, ...]
    scaler: Scaler
    shrink: float = 1.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.spec.columns)


@dataclass(frozen=True, eq=False)
class Preprocessing:
    """A job's serving contract: everything needed to turn raw feature rows into model inputs, and model outputs
    into prices. Saved as the job's preprocessing.json (to_dict / from_dict; run.jobdir writes and reads the file),
    with what it is for: the job's symbol and timeframe, its indicators (config.Indicator dumps) and the reference
    series of its market input (features.market)."""
    input_columns: tuple[str, ...]
    lookback: int
    horizon: int
    relative_to: str | None
    scaler: Scaler  # of the framed inputs
    heads: tuple[HeadTarget, ...]
    splits: dict[str, dict]  # split -> {"first", "last": ISO timestamps of its rows, "rows": count}
    symbol: str | None = None
    timeframe: str | None = None
    indicators: tuple[dict, ...] = ()
    market: tuple[Reference, ...] = ()

    @cached_property
    def framing(self) -> Framing:
        return Framing(self.relative_to, self.input_columns)

    def head_positions(self, head: HeadTarget) -> list[int]:
        return [self.input_columns.index(c) for c in head.columns]

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """The model inputs beside the windows, by name (trainer.heads: Head.input_shapes): none, or those the heads
        read."""
        return {name: shape for head in self.heads for name, shape in head.spec.input_shapes(self.horizon).items()}

    def forecast_inputs(self, har: np.ndarray | None) -> dict[str, np.ndarray]:
        """The inputs the heads read beside the windows (input_shapes) from HAR + time of day's forecasts (N, horizon,
        3) of each sample's high and low excursions and root-mean-square range (trainer.evaluation.baselines; None
        where there are none): each (N, *shape) float32, in the reading head's scaled units."""
        return {name: values for head in self.heads
                for name, values in head.spec.forecast_inputs(har, head.scaler.scale).items()}

    def model_inputs(self, x: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        """What the model is called with: the input windows (N, lookback, F) alone, or, where the heads read inputs
        beside them (`inputs`: forecast_inputs' of the same samples), a dict of them ("inputs") and those."""
        if not self.input_shapes:
            return x
        missing = [name for name in self.input_shapes if name not in inputs]
        if missing:
            raise JobError(f"the model reads {', '.join(missing)} beside the windows, which were not given")
        return {"inputs": x, **{name: inputs[name] for name in self.input_shapes}}

    def inputs(self, encoded_windows: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """Encoded input windows (N, lookback, F), a float64 copy that is framed and scaled in place, and their
        anchors (N,) -> the model input, float32."""
        framed = self.framing.frame(encoded_windows, anchor[:, None, None])
        return self.scaler.transform(framed, out=framed)

    def targets(self, head: HeadTarget, encoded_ahead: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """Encoded target rows (N, horizon, C) of a head's columns, a float64 copy that is framed and scaled in
        place -> scaled targets in its output shape."""
        framed = self.framing.frame(encoded_ahead, anchor[:, None, None], self.head_positions(head))
        return head.scaler.transform(framed, out=framed).reshape(len(framed), *head.shape)

    def point(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Model outputs -> each head's point forecast, shaped like its targets (a quantile head's median)."""
        return {head.name: head.spec.point(outputs[head.name]) for head in self.heads}

    def to_prices(self, outputs: dict[str, np.ndarray], last: LastInputs) -> dict[str, np.ndarray]:
        """Model outputs (head -> (N, *head shape), or a quantile head's (N, ..., Q, C)) -> the same in raw units
        (prices), float64 (every quantile framed and scaled as its column: their order is kept), each head mixed with
        its persistence as its factor says (shrunk). `last`: what the samples follow (the last close is unused when
        relative_to is null).
        The one place where outputs become prices: evaluation, predict, cards and the Hub all use it."""
        return {head.name: self.head_prices(head, outputs[head.name], last) for head in self.heads}

    def head_prices(self, head: HeadTarget, outputs: np.ndarray, last: LastInputs) -> np.ndarray:
        """One head's outputs in raw units (see to_prices)."""
        framed = self.shrunk(head, head.scaler.inverse(outputs, head.columns), last)
        close = np.reshape(last.close, (len(last.close), *[1] * (framed.ndim - 1)))
        return self.framing.invert(framed, close, self.head_positions(head))

    def shrunk(self, head: HeadTarget, framed: np.ndarray, last: LastInputs) -> np.ndarray:
        """A head's forecast, framed (unscaled), mixed with its persistence as its kind mixes them (Head.shrunk):
        head.shrink x the forecast + (1 - head.shrink) x each column's last value, framed alike."""
        if head.shrink == 1.0:
            return framed
        return head.spec.shrunk(framed, self.persistence(head, last), head.shrink)

    def persistence(self, head: HeadTarget, last: LastInputs) -> np.ndarray:
        """A head's persistence, framed as its forecasts are before scaling: each of its columns' last input value
        (N, C), shaped to broadcast over its targets ((N, 1, C) per step, or (N, C))."""
        positions = self.head_positions(head)
        values = np.array(last.heads[head.name], dtype=np.float64)
        level = self.framing.level[positions] > 0
        values[:, level] = np.log(values[:, level])
        anchor = np.log(last.close)[:, None] if self.relative_to is not None else 0.0
        framed = self.framing.frame(values, anchor, positions)
        return framed.reshape(len(framed), *[1] * (len(head.shape) - 1), len(positions))

    def candle_quantities(self, head: HeadTarget, outputs: dict[str, np.ndarray], prices: np.ndarray,
                          last_close: np.ndarray) -> dict[str, np.ndarray]:
        """The size of the coming candles that a head forecasting high, low and close forecasts
        (Head.candle_quantities): "high", "low", "range", "return", each (N, steps); `outputs`: the model's raw
        outputs, `prices`: the head's forecasts in prices."""
        return head.spec.candle_quantities(outputs, prices, last_close, head.scaler.scale)

    def with_shrink(self, factors: dict[str, float]) -> Preprocessing:
        """The same preprocessing with these heads' shrink factors."""
        return replace(self, heads=tuple(replace(h, shrink=factors.get(h.name, h.shrink)) for h in self.heads))

    def make_inputs(self, frame: pd.DataFrame) -> tuple[np.ndarray, LastInputs]:
        """The model input (1, lookback, F) for forecasting after the LAST row of `frame`, and what it follows
        (its last close and the heads' columns there) for to_prices."""
        if len(frame) < self.lookback:
            raise UserError(f"predicting needs the last {self.lookback} feature rows; the data gives {len(frame)}")
        window = frame.iloc[-self.lookback:]
        raw = _finite_values(window, self.input_columns, UserError)
        last = LastInputs(raw[-1:, self.framing.anchor_column].copy(),
                          {head.name: raw[-1:, self.head_positions(head)].copy() for head in self.heads})
        encoded = self.framing.encode(raw, window.index)
        return self.inputs(encoded[np.newaxis], encoded[-1:, self.framing.anchor_column]), last

    def to_dict(self) -> dict:
        return {
            "input_columns": list(self.input_columns),
            "relative_to": self.relative_to,
            "scaler": self.scaler.to_dict(),
            "lookback": self.lookback,
            "horizon": self.horizon,
            "heads": [{**h.spec.model_dump(mode="json"), "target_shape": list(h.shape), "shrink": h.shrink,
                       "scaler": h.scaler.to_dict()} for h in self.heads],
            "splits": self.splits,
            "symbol": self.symbol, "timeframe": self.timeframe, "indicators": list(self.indicators),
            "market": [reference.to_dict() for reference in self.market],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Preprocessing:
        """What to_dict gives (a job's preprocessing.json, read by run.jobdir)."""
        fitted = ("target_shape", "shrink", "scaler")
        heads = tuple(HeadTarget(Head.of({k: v for k, v in h.items() if k not in fitted}), tuple(h["target_shape"]),
                                 Scaler.from_dict(h["scaler"]), float(h["shrink"])) for h in d["heads"])
        return cls(tuple(d["input_columns"]), d["lookback"], d["horizon"], d["relative_to"],
                   Scaler.from_dict(d["scaler"]), heads, d["splits"], d["symbol"], d["timeframe"],
                   tuple(d["indicators"]), tuple(Reference.from_dict(r) for r in d["market"]))


@dataclass(frozen=True, eq=False)
class _Rows:
    """One job's rows, which every split's windows are views of."""
    encoded: np.ndarray  # (T, F) float64, see Framing
    raw: np.ndarray  # (T, R) float64: the feature values of the columns read back as they are
    raw_positions: tuple[int, ...]  # those R columns' positions among the F: the heads' and the anchor's
    preprocessing: Preprocessing
    # The inputs the heads read beside the windows at every row (Preprocessing.forecast_inputs; Windows.with_forecasts)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class SplitWindows:
    """The samples of one split. Sample i is rows first_target_rows[i] - lookback .. - 1 as input, then
    `horizon` rows of the heads' columns as targets. Arrays are computed when first asked for."""
    rows: _Rows
    first_target_rows: np.ndarray  # (N,) int32
    target_times: np.ndarray  # (N,) datetime64[ns] (UTC) of each sample's first target step

    def __len__(self) -> int:
        return len(self.first_target_rows)

    @cached_property
    def anchor(self) -> np.ndarray:
        """(N,) each sample's encoded anchor: the log of its last input close when relative."""
        return self.rows.encoded[self.first_target_rows - 1, self.rows.preprocessing.framing.anchor_column]

    @cached_property
    def last_close(self) -> np.ndarray:
        """(N,) each sample's last input close (raw), which to_prices turns framed outputs into prices with."""
        return self.rows.raw[self.first_target_rows - 1, self._raw([self.rows.preprocessing.framing.anchor_column])[0]]

    @cached_property
    def x(self) -> np.ndarray | dict[str, np.ndarray]:
        """The model inputs: (N, lookback, F) float32, or a dict of them and the inputs the heads read beside them
        (Preprocessing.model_inputs)."""
        prep = self.rows.preprocessing
        windows = sliding_window_view(self.rows.encoded, prep.lookback, axis=0).transpose(0, 2, 1)
        x = prep.inputs(windows[self.first_target_rows - prep.lookback], self.anchor)
        return prep.model_inputs(x, {name: values[self.first_target_rows - 1]
                                     for name, values in self.rows.inputs.items()})

    @cached_property
    def y(self) -> dict[str, np.ndarray]:
        """Head -> (N, *head output shape) float32: the scaled targets."""
        prep = self.rows.preprocessing
        return {h.name: prep.targets(h, self._ahead(self.rows.encoded, prep.head_positions(h)), self.anchor)
                for h in prep.heads}

    @cached_property
    def y_raw(self) -> dict[str, np.ndarray]:
        """The same targets in raw (price) units, float64: metrics must not inherit float32 rounding (a flat
        candle must stay exactly flat for direction accuracy)."""
        prep = self.rows.preprocessing
        return {h.name: self._ahead(self.rows.raw, self._raw(prep.head_positions(h))).reshape(len(self), *h.shape)
                for h in prep.heads}

    @cached_property
    def last_inputs(self) -> dict[str, np.ndarray]:
        """Head -> (N, C) raw values of its columns at the last input step (persistence's forecast)."""
        prep = self.rows.preprocessing
        return {h.name: self.rows.raw[(self.first_target_rows - 1)[:, None], self._raw(prep.head_positions(h))]
                for h in prep.heads}

    @property
    def last(self) -> LastInputs:
        """What the samples' forecasts follow (Preprocessing.to_prices): their last close and last_inputs."""
        return LastInputs(self.last_close, self.last_inputs)

    def _ahead(self, values: np.ndarray, positions: list[int]) -> np.ndarray:
        """(N, horizon, C): each sample's target rows of these columns of `values`, a copy."""
        steps = self.first_target_rows[:, None] + np.arange(self.rows.preprocessing.horizon)
        return values[steps[..., None], positions]

    def _raw(self, positions: Sequence[int]) -> list[int]:
        """Where the rows' raw values hold the columns at these positions among the input columns."""
        return [self.rows.raw_positions.index(p) for p in positions]


@dataclass(frozen=True, eq=False)
class Windows:
    train: SplitWindows
    val: SplitWindows
    test: SplitWindows
    preprocessing: Preprocessing
    rows: np.ndarray  # (T, F) float32: every encoded row, which the training device gathers windows from

    def with_forecasts(self, har: np.ndarray) -> Windows:
        """The same windows with the inputs the heads read beside them made from HAR + time of day's forecasts after
        each row (T, horizon, 3), fitted on the train split only and causal (trainer.evaluation.baselines;
        Preprocessing.forecast_inputs)."""
        rows = replace(self.train.rows, inputs=self.preprocessing.forecast_inputs(har))
        return replace(self, **{split: replace(getattr(self, split), rows=rows) for split in SPLITS})

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The inputs the heads read beside the windows at every row (T, *shape) each, which the training device
        gathers from (with_forecasts); none where they read none."""
        return self.train.rows.inputs


def make_windows(frame: pd.DataFrame, window: WindowConfig, columns: Sequence[str], heads: Sequence[Head],
                 target_shapes: dict[str, tuple[int, ...]]) -> Windows:
    """Split, frame, scale and window a feature frame; each head's targets get exactly `target_shapes[head]`
    (the model's output shape without the batch axis)."""
    lookback, horizon, columns = window.lookback, window.horizon, tuple(columns)
    shapes = _head_shapes(heads, horizon, target_shapes)
    framing = Framing(window.relative_to, columns)
    # Our own copy, column-major (as pandas holds a frame's values): the scalers' statistics run down columns.
    # The raw values are kept of the columns read back as they are only: the heads' targets and the anchor.
    encoded = np.asfortranarray(_finite_values(frame, columns, JobError))
    raw_positions = tuple(sorted({framing.anchor_column, *(columns.index(c) for h in heads for c in h.columns)}))
    raw = encoded[:, raw_positions]
    encoded = framing.encode(encoded, frame.index)
    bounds = _split_bounds(len(frame), window.split)
    times = frame.index.to_numpy(dtype="datetime64[ns]")  # UTC; not .values: pandas 3.1 deprecates it for a tz

    first_target_rows = {}
    for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:]):
        first, last = max(start, lookback), end - horizon  # the first target row of its first/last sample
        if last < first:
            raise JobError(
                f"{len(frame)} feature rows are too few for lookback {lookback} + horizon {horizon}: the "
                f"{split} split ({end - start} rows) holds no complete window; use more rows or a shorter window"
            )
        first_target_rows[split] = np.arange(first, last + 1, dtype=np.int32)

    # The scalers are fit on what the model sees of the train samples: their framed inputs and targets. The
    # train samples are consecutive: their input windows are rows train[0] - lookback .. train[-1] - 1, their
    # target windows (of `horizon` rows) rows train[0] .. train[-1] + horizon - 1, all framed against the same
    # anchors.
    train = first_target_rows["train"]
    anchor = encoded[train - 1, framing.anchor_column]
    kind = Scaler.of(window.scaler)
    scaler = kind.fit_windows(framing, encoded[train[0] - lookback:train[-1]], lookback, anchor)
    targets = []
    for head in heads:
        positions = [columns.index(c) for c in head.columns]
        head_scaler = kind.fit_windows(framing, encoded[train[0]:train[-1] + horizon, positions], horizon, anchor,
                                       positions, anchored=framing.level[positions] > 0, shared=head.shares_scale)
        targets.append(HeadTarget(head, shapes[head.name], head_scaler))

    split_rows = {
        split: {"first": frame.index[start].isoformat(), "last": frame.index[end - 1].isoformat(),
                "rows": end - start}
        for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:])
    }
    prep = Preprocessing(columns, lookback, horizon, window.relative_to, scaler, tuple(targets), split_rows)
    rows = _Rows(encoded, raw, raw_positions, prep)
    splits = {split: SplitWindows(rows, first_target_rows[split], times[first_target_rows[split]])
              for split in SPLITS}
    return Windows(**splits, preprocessing=prep, rows=float32(encoded))


def _head_shapes(heads: Sequence[Head], horizon: int,
                 target_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each head's target shape: (horizon, C) per step, or (C,) when horizon is 1; nothing else fits."""
    shapes = {}
    for i, head in enumerate(heads):
        shape = tuple(target_shapes.get(head.name, ()))
        n = len(head.columns)
        fitting = [(horizon, n)] + ([(n,)] if horizon == 1 else [])
        if shape not in fitting:
            raise UserError(
                f"heads[{i}] '{head.name}': model output shape {shape or 'missing'} does not fit window.horizon "
                f"{horizon} x {n} column(s); expected {' or '.join(map(str, fitting))}"
            )
        shapes[head.name] = shape
    return shapes


def _split_bounds(rows: int, split: Split) -> list[int]:
    """Row boundaries [0, train_end, val_end, rows] of the chronological split."""
    return [0, round(rows * split.train), round(rows * (split.train + split.val)), rows]


def _finite_values(frame: pd.DataFrame, columns: Sequence[str], error: type[Exception]) -> np.ndarray:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise error(f"feature frame has no column {', '.join(missing)}")
    # One numpy take from the frame's float64 block (pandas' own column selection costs 20 times more);
    # a take always copies, so the caller may overwrite the result without touching the frame.
    values = frame.to_numpy(dtype=np.float64)[:, frame.columns.get_indexer(columns)]
    finite = np.isfinite(values)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise error(f"feature frame: {columns[col]} is not finite at {frame.index[row]}")
    return values
