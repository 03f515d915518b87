"""Feature frame -> chronological train/val/test windows, scaled with statistics of the train split only.

A sample is `lookback` input rows followed by `horizon` target rows. It belongs to the split that holds
all of its target rows; its inputs may reach back into the previous split (that past is known when
predicting), never forward. So the train samples read train rows only: nothing after the train split
can change them, nor the scaler, which is fit on the train rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from .config import RunConfig, Split
from .errors import JobError, UserError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True, eq=False)
class Scaler:
    """Per-column affine scaling: x_scaled = (x - offset) / scale."""
    kind: str  # "standard" (mean / std) or "minmax" (min / max - min, to [0, 1])
    columns: tuple[str, ...]
    offset: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, kind: str, columns: Sequence[str], values: np.ndarray) -> Scaler:
        """Fit on `values` (rows x columns), e.g. the train split's rows only."""
        if kind == "standard":
            offset, spread = values.mean(axis=0), values.std(axis=0)
        elif kind == "minmax":
            offset, spread = values.min(axis=0), np.ptp(values, axis=0)
        else:
            raise UserError(f"window.scaler: unknown scaler '{kind}' (standard or minmax)")
        # A constant column has no spread; scale 1 keeps it finite instead of dividing by zero.
        return cls(kind, tuple(columns), offset, np.where(spread == 0, 1.0, spread))

    def transform(self, frame_or_array: pd.DataFrame | np.ndarray, columns: Sequence[str] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """Scale `columns` (default: all the scaler's columns, in its order); float32 for the model.
        `out`: a float64 array to compute in, e.g. the input itself when it is no longer needed."""
        columns = self.columns if columns is None else tuple(columns)
        positions = self._positions(columns)
        if isinstance(frame_or_array, pd.DataFrame):
            frame_or_array = frame_or_array[list(columns)].to_numpy()
        scaled = np.subtract(frame_or_array, self.offset[positions], dtype=np.float64, out=out)
        scaled /= self.scale[positions]
        return scaled.astype(np.float32)

    def inverse(self, values: np.ndarray, columns: Sequence[str]) -> np.ndarray:
        """Back to the original units (float64); the last axis of `values` holds `columns`."""
        positions = self._positions(columns)
        return np.asarray(values, dtype=np.float64) * self.scale[positions] + self.offset[positions]

    def to_dict(self) -> dict:
        # float64 -> Python float -> JSON -> float64 is exact (shortest round-trip repr).
        return {"kind": self.kind, "columns": list(self.columns),
                "offset": self.offset.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Scaler:
        return cls(d["kind"], tuple(d["columns"]),
                   np.asarray(d["offset"], dtype=np.float64), np.asarray(d["scale"], dtype=np.float64))

    def _positions(self, columns: Sequence[str]) -> list[int]:
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise UserError(f"scaler: no column {', '.join(unknown)} (it scales {', '.join(self.columns)})")
        return [self.columns.index(c) for c in columns]


@dataclass(frozen=True)
class HeadTarget:
    """What one model head predicts: its columns, and its output shape without the batch axis."""
    name: str
    columns: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class SplitWindows:
    x: np.ndarray  # (N, lookback, F) float32, scaled; a read-only view into one scaled array
    y: dict[str, np.ndarray]  # head -> (N, *head output shape) float32, scaled
    # The same targets in raw (price) units, float64: metrics must not inherit float32 rounding
    # (a flat candle must stay exactly flat for direction accuracy).
    y_raw: dict[str, np.ndarray]
    last_inputs: dict[str, np.ndarray]  # head -> (N, C) raw values of its columns at the last input step
    target_times: np.ndarray  # (N,) datetime64[ns] (UTC) of each sample's first target step
    # (N,) int32: the row of Windows.rows holding each sample's first target step. Sample i is rows
    # first_target_rows[i] - lookback .. - 1 as input, then `horizon` rows of the heads' columns.
    first_target_rows: np.ndarray


@dataclass(frozen=True, eq=False)
class Windows:
    train: SplitWindows
    val: SplitWindows
    test: SplitWindows
    scaler: Scaler
    lookback: int
    horizon: int
    heads: tuple[HeadTarget, ...]
    split_rows: dict[str, dict]  # split -> {"first", "last": ISO timestamps of its rows, "rows": count}
    rows: np.ndarray  # (T, F) float32: every row, scaled; each split's x and y are windows of it

    def preprocessing(self) -> dict:
        """Everything needed to predict from a raw feature frame (see make_inputs); JSON-serialisable."""
        return {
            "input_columns": list(self.scaler.columns),
            "scaler": self.scaler.to_dict(),
            "lookback": self.lookback,
            "horizon": self.horizon,
            "heads": [{"name": h.name, "columns": list(h.columns), "target_shape": list(h.shape)}
                      for h in self.heads],
            "splits": self.split_rows,
        }


def make_windows(frame: pd.DataFrame, cfg: RunConfig, target_shapes: dict[str, tuple[int, ...]]) -> Windows:
    """Split, scale and window a feature frame; each head's targets get exactly `target_shapes[head]`
    (the model's output shape without the batch axis)."""
    lookback, horizon = cfg.window.lookback, cfg.window.horizon
    columns = cfg.features.columns
    heads = _head_targets(cfg, target_shapes)
    raw = _finite_values(frame, columns, JobError)
    bounds = _split_bounds(len(frame), cfg.window.split)
    scaler = Scaler.fit(cfg.window.scaler, columns, raw[:bounds[1]])  # the train rows only
    head_positions = {h.name: [columns.index(c) for c in h.columns] for h in heads}
    head_raw = {name: raw[:, positions] for name, positions in head_positions.items()}  # copies
    scaled = scaler.transform(raw, out=raw)  # raw is not needed any more: scale in its memory

    inputs = sliding_window_view(scaled, lookback, axis=0).transpose(0, 2, 1)  # [i]: rows i .. i+lookback-1
    head_scaled = {name: scaled[:, positions] for name, positions in head_positions.items()}
    times = np.asarray(frame.index.values, dtype="datetime64[ns]")

    splits = {}
    for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:]):
        first, last = max(start, lookback), end - horizon  # the first target row of its first/last sample
        if last < first:
            raise JobError(
                f"{len(frame)} feature rows are too few for lookback {lookback} + horizon {horizon}: the "
                f"{split} split ({end - start} rows) holds no complete window; use more rows or a shorter window"
            )
        rows = slice(first, last + 1)
        splits[split] = SplitWindows(
            x=inputs[first - lookback:last - lookback + 1],
            y={h.name: _targets(head_scaled[h.name], horizon, rows, h.shape) for h in heads},
            y_raw={h.name: _targets(head_raw[h.name], horizon, rows, h.shape) for h in heads},
            last_inputs={h.name: head_raw[h.name][first - 1:last] for h in heads},
            target_times=times[rows],
            first_target_rows=np.arange(first, last + 1, dtype=np.int32),
        )
    split_rows = {
        split: {"first": frame.index[start].isoformat(), "last": frame.index[end - 1].isoformat(),
                "rows": end - start}
        for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:])
    }
    return Windows(**splits, scaler=scaler, lookback=lookback, horizon=horizon, heads=heads,
                   split_rows=split_rows, rows=scaled)


def make_inputs(frame: pd.DataFrame, preprocessing: dict) -> np.ndarray:
    """The model input (1, lookback, F) for forecasting after the LAST row of `frame`."""
    lookback, columns = preprocessing["lookback"], preprocessing["input_columns"]
    if len(frame) < lookback:
        raise UserError(f"predicting needs the last {lookback} feature rows; the data gives {len(frame)}")
    raw = _finite_values(frame.iloc[-lookback:], columns, UserError)
    return Scaler.from_dict(preprocessing["scaler"]).transform(raw, columns)[np.newaxis]


def _head_targets(cfg: RunConfig, target_shapes: dict[str, tuple[int, ...]]) -> tuple[HeadTarget, ...]:
    """Each head's target shape: (horizon, C) per step, or (C,) when horizon is 1; nothing else fits."""
    horizon = cfg.window.horizon
    heads = []
    for i, head in enumerate(cfg.heads):
        shape = tuple(target_shapes.get(head.name, ()))
        n = len(head.columns)
        fitting = [(horizon, n)] + ([(n,)] if horizon == 1 else [])
        if shape not in fitting:
            raise UserError(
                f"heads[{i}] '{head.name}': model output shape {shape or 'missing'} does not fit window.horizon "
                f"{horizon} x {n} column(s); expected {' or '.join(map(str, fitting))}"
            )
        heads.append(HeadTarget(head.name, tuple(head.columns), shape))
    return tuple(heads)


def _targets(values: np.ndarray, horizon: int, rows: slice, shape: tuple[int, ...]) -> np.ndarray:
    """For each sample whose first target row is in `rows`: that row and the next horizon - 1 rows of
    `values` (T, C), in the head's output shape."""
    windows = sliding_window_view(values, horizon, axis=0).transpose(0, 2, 1)[rows]  # (n, horizon, C)
    return np.ascontiguousarray(windows).reshape(len(windows), *shape)


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
