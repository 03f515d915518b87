"""How a job's framed values are scaled per column for the model: one class per kind (`window.scaler`), each
saying which statistics it fits (over values, or over every window of rows without materialising them) and how
they become an offset and a scale. `Scaler.kinds`: every kind by its name, which config.WindowConfig accepts and
a saved scaler (preprocessing.json) names.

A new kind is one class here: a subclass of Scaler with its `kind`, `statistics`, `window_statistics`,
`affine` and `pooled`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import pandas as pd

from ..errors import UserError


class Framing(Protocol):
    """What fit_windows reads of a window's framing (windows.Framing, which imports this module): its columns and
    which of them are framed as levels and as differences."""
    columns: tuple[str, ...]

    def masks(self, columns: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]: ...


def float32(values: np.ndarray) -> np.ndarray:
    """`values` as contiguous float32 for the model. A value beyond float32's range becomes ±inf without numpy's
    overflow warning: the job then fails with its one line naming the candle file (never counted as done)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(values, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class Scaler:
    """Per-column affine scaling: x_scaled = (x - offset) / scale, of the kind its class is."""
    kinds: ClassVar[dict[str, type[Scaler]]] = {}
    kind: ClassVar[str]
    columns: tuple[str, ...]
    offset: np.ndarray
    scale: np.ndarray

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        Scaler.kinds[cls.kind] = cls

    @staticmethod
    def of(kind: str) -> type[Scaler]:
        """The class of a kind (`window.scaler`, a saved scaler's "kind"); a ValueError for a kind this version
        does not know."""
        if kind not in Scaler.kinds:
            raise ValueError(f"unknown scaler '{kind}' ({' or '.join(Scaler.kinds)})")
        return Scaler.kinds[kind]

    @classmethod
    def fit(cls, columns: Sequence[str], values: np.ndarray, anchored: Sequence[bool] = (),
            shared: bool = False) -> Scaler:
        """Fit on `values` (..., columns), e.g. the train samples only.

        `anchored` columns (a flag per column) keep offset 0, so that 0 stays 0 ("no change" for a value
        relative to the last close): their scale is their typical magnitude (`affine`). `shared`: the anchored
        columns get one scale (`pooled`), so that an order between them (a candle's high above its close) holds
        in scaled units too."""
        values = np.asarray(values, dtype=np.float64).reshape(-1, len(columns))
        return cls._of(columns, cls.statistics(values), anchored, shared)

    @classmethod
    def fit_windows(cls, framing: Framing, rows: np.ndarray, length: int, anchor: np.ndarray,
                    positions: Sequence[int] | None = None, anchored: Sequence[bool] = (),
                    shared: bool = False) -> Scaler:
        """What `fit` gives on every window rows[i : i + length] (i = 0 .. len(anchor) - 1) framed against
        its anchor[i], without materialising the windows: O(rows x columns), not O(windows x length x
        columns). `rows`: encoded rows (len(anchor) + length - 1, C) of the columns at `positions` among the
        framing's (default: all of them)."""
        level, difference = (mask > 0 for mask in framing.masks(positions))
        columns = framing.columns if positions is None else [framing.columns[p] for p in positions]
        with np.errstate(over="ignore", invalid="ignore"):  # absurd candles: not finite, refused naming the file
            statistics = cls.window_statistics(level, difference, rows, length, anchor)
            return cls._of(columns, statistics, anchored, shared)

    @classmethod
    def statistics(cls, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The kind's two statistics per column of values (N, C)."""
        raise NotImplementedError(f"scaler {cls.kind} has no statistics()")

    @classmethod
    def window_statistics(cls, level: np.ndarray, difference: np.ndarray, rows: np.ndarray, length: int,
                          anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The same statistics of the framed values of every window (see fit_windows); `level` and `difference`
        flag the columns framed so."""
        raise NotImplementedError(f"scaler {cls.kind} has no window_statistics()")

    @classmethod
    def affine(cls, first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The statistics -> per column the offset, the spread (the scale), and the scale from zero of an
        anchored column."""
        raise NotImplementedError(f"scaler {cls.kind} has no affine()")

    @classmethod
    def pooled(cls, from_zero: np.ndarray) -> float:
        """One scale from zero for shared anchored columns."""
        raise NotImplementedError(f"scaler {cls.kind} has no pooled()")

    @classmethod
    def _of(cls, columns: Sequence[str], statistics: tuple[np.ndarray, np.ndarray], anchored: Sequence[bool],
            shared: bool) -> Scaler:
        offset, spread, from_zero = cls.affine(*statistics)
        anchored = np.zeros(len(columns), bool) if len(anchored) == 0 else np.asarray(anchored, dtype=bool)
        if shared and anchored.any():
            from_zero[anchored] = cls.pooled(from_zero[anchored])
        offset, spread = np.where(anchored, 0.0, offset), np.where(anchored, from_zero, spread)
        # A constant column has no spread; scale 1 keeps it finite instead of dividing by zero.
        return cls(tuple(columns), offset, np.where(spread == 0, 1.0, spread))

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
        return float32(scaled)

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
        return Scaler.of(d["kind"])(tuple(d["columns"]), np.asarray(d["offset"], dtype=np.float64),
                                    np.asarray(d["scale"], dtype=np.float64))

    def _positions(self, columns: Sequence[str]) -> list[int]:
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise UserError(f"scaler: no column {', '.join(unknown)} (it scales {', '.join(self.columns)})")
        return [self.columns.index(c) for c in columns]


class StandardScaler(Scaler):
    """Mean and standard deviation; an anchored column's scale is its root mean square."""
    kind: ClassVar[str] = "standard"

    @classmethod
    def statistics(cls, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return values.mean(axis=0), values.std(axis=0)

    @classmethod
    def window_statistics(cls, level: np.ndarray, difference: np.ndarray, rows: np.ndarray, length: int,
                          anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From sums over each window (prefix sums), equal to `statistics`' to float rounding (about 1e-11 of the
        std)."""
        return _window_moments(level, difference, rows, length, anchor)

    @classmethod
    def affine(cls, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return mean, std, np.sqrt(mean**2 + std**2)  # the root mean square

    @classmethod
    def pooled(cls, from_zero: np.ndarray) -> float:
        return np.sqrt(np.mean(from_zero**2))


class MinMaxScaler(Scaler):
    """To [0, 1] by minimum and maximum; an anchored column to [-1, 1] by its largest magnitude."""
    kind: ClassVar[str] = "minmax"

    @classmethod
    def statistics(cls, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return values.min(axis=0), values.max(axis=0)

    @classmethod
    def window_statistics(cls, level: np.ndarray, difference: np.ndarray, rows: np.ndarray, length: int,
                          anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The very values `statistics` finds on the windows (see _window_extremes)."""
        return _window_extremes(level, difference, rows, length, anchor)

    @classmethod
    def affine(cls, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return low, high - low, np.maximum(-low, high)  # the largest magnitude

    @classmethod
    def pooled(cls, from_zero: np.ndarray) -> float:
        return from_zero.max()


def _window_extremes(level: np.ndarray, difference: np.ndarray, rows: np.ndarray, length: int,
                     anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the minimum and maximum of the framed values of every window (see Scaler.fit_windows);
    `level` and `difference` flag the columns framed so.

    Row t is in windows t - length + 1 .. t (those there are), so the extremes over every (window, row) are
    extremes over rows, each framed against the extreme anchors of its windows: a level's framed value
    (value - anchor) is smallest against the largest anchor; a difference's (value * ratio, ratio = exp(-anchor)
    > 0) against the smallest ratio, or the largest for a negative value. Rounding is monotone, so these are
    the very extremes of framing every window, with no (windows, length) array."""
    low, high = rows.min(axis=0), rows.max(axis=0)  # unframed columns: those of every row the windows hold
    if level.any():
        lowest, highest = (_over_windows(reduce, anchor, length)[:, None] for reduce in (np.minimum, np.maximum))
        values = rows[:, level]
        low[level], high[level] = (values - highest).min(axis=0), (values - lowest).max(axis=0)
    if difference.any():
        ratio = np.exp(-anchor)
        lowest, highest = (_over_windows(reduce, ratio, length)[:, None] for reduce in (np.minimum, np.maximum))
        values = rows[:, difference]
        low[difference] = (values * np.where(values < 0, highest, lowest)).min(axis=0)
        high[difference] = (values * np.where(values < 0, lowest, highest)).max(axis=0)
    return low, high


def _over_windows(reduce: np.ufunc, per_window: np.ndarray, length: int) -> np.ndarray:
    """`reduce` (np.minimum, np.maximum) of a value per window over the windows that hold each row:
    (N,) -> (N + length - 1,), row t over windows t - length + 1 .. t. Padded with the first and last
    windows' own values, which those rows' windows include anyway."""
    return _sliding(reduce, np.pad(per_window, length - 1, mode="edge"), length)


def _sliding(reduce: np.ufunc, values: np.ndarray, length: int) -> np.ndarray:
    """`reduce` over every `length` consecutive values (T,), an array that is overwritten -> a view of it
    (T - length + 1,). By doubling, in place: O(T log length). Value i of `reduced` reduces values
    i .. i + span - 1; with span <= length < 2 span at the end, two overlapping spans cover each window."""
    reduced, span = values, 1
    while 2 * span <= length:  # numpy reads the overlapping right-hand side before writing
        reduced = reduce(reduced[:-span], reduced[span:], out=reduced[:-span])
        span *= 2
    windows = len(values) - length + 1
    return reduce(reduced[:windows], reduced[length - span:], out=reduced[:windows])


def _window_moments(level: np.ndarray, difference: np.ndarray, rows: np.ndarray, length: int,
                    anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the mean and std of the framed values of every window (see Scaler.fit_windows), from sums;
    `level` and `difference` flag the columns framed so.

    With y = row - k (k: the first row, or 0 for price differences), S and Q each window's sums of y and y^2
    (prefix sums), the framed values' sum and sum of squares over every (window, row) are, per column:
      others       sum S, sum Q                                   (framed: y + k; the mean gets k back)
      levels       sum S - length sum b, sum Q - 2 sum b S + length sum b^2   (framed: y - b, b = anchor - k,
                   written centred + d: centred = anchor - the first anchor, d = the first anchor - k)
      differences  sum r S, sum r^2 Q                             (framed: r y, r = exp(-anchor))
    each sum over windows a product with a vector of them. k keeps the sums near the values' own spread: a log
    price of 11 squared would cost the variance of a 1 % log ratio six digits."""
    k = np.where(difference, 0.0, rows[0])
    y = rows - k
    sums, squares = _window_sums(y, length), _window_sums(np.square(y, out=y), length)
    windows = len(anchor)
    total, total_squares = np.ones(windows) @ sums, np.ones(windows) @ squares
    if level.any():
        centred, d = anchor - anchor[0], anchor[0] - k
        b_sum = centred.sum() + windows * d
        b_squares = centred @ centred + 2 * d * centred.sum() + windows * d**2
        b_times_s = centred @ sums + d * total
        total_squares = np.where(level, total_squares - 2 * b_times_s + length * b_squares, total_squares)
        total = np.where(level, total - length * b_sum, total)
    if difference.any():
        ratio = np.exp(-anchor)
        total, total_squares = (np.where(difference, ratio @ sums, total),
                                np.where(difference, ratio**2 @ squares, total_squares))
    mean = total / (windows * length)
    variance = total_squares / (windows * length) - mean**2
    return mean + np.where(level, 0.0, k), np.sqrt(np.maximum(variance, 0.0))


def _window_sums(values: np.ndarray, length: int) -> np.ndarray:
    """Sum over every `length` consecutive rows of values (T, F) -> (T - length + 1, F), from prefix sums."""
    sums = np.cumsum(values, axis=0)
    sums[length:] -= sums[:-length]  # numpy reads the overlapping right-hand side before writing
    return sums[length - 1:]
