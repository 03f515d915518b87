"""Baselines for what candles make predictable - the size of the coming candles, the distance from the last
close to their high and low - and for the close's return, fitted per job from its candles (docs/model-quality.md,
"The baselines"). They are scored by trainer.evaluation.scores; trainer.evaluation.intervals calibrates an
interval around any of them, or around the network.

An origin is a sample's last input row t, its close C the last close; the sample's targets are rows
t+1 .. t+H (SplitWindows.first_target_rows holds t+1). At each origin and step k = 1..H the quantities are
    high    ln(high[t+k] / C)          the high excursion
    low     ln(C / low[t+k])           the low excursion
    range   ln(high[t+k] / low[t+k])   the log range
    return  ln(close[t+k] / C)
A quantity at step k is known k rows after its origin: a forecast at origin t reads its values at origins
<= t - k and the candles up to row t, never a target row.

Point forecasts (Baselines.forecast), named by Baseline, fitted on the train split's samples, any parameter chosen
on the validation split's:
    no_change    0: high = low = close = C
    persistence  the latest known value of the same quantity (at step 1: the last candle's own excursion,
                 range or return; at step k the return ln(C / close[t-k]). The close's guardrail, evaluate's
                 persistence, is no_change)
    ewma         its exponentially weighted mean over the known values; alpha per quantity and step chosen
                 from ALPHAS by MAE on validation
    har_tod      the range: exp of a least-squares fit of ln range[t+k] on ln range[t], its mean over the last
                 day and the last week (in candles of the timeframe) and the train split's mean ln range at
                 candle t+k's time of day (HAR, Corsi 2009; on ranges Clements & Preve 2021): the median range,
                 which MAE asks for. The high and low: that range times the train median of excursion / range
                 forecast (an excursion is a share of its candle's range).
    har_tod_rms  the range only: har_tod x exp(s^2), s^2 the train residual variance of ln range per step - the
                 root mean square of a log-normal range, which QLIKE asks for (MAE asks for the median)
    har_tod_level, har_tod_level_rms
                 har_tod and har_tod_rms put on their level on validation, per step, as the network's forecasts are
                 (evaluate): times the factor with the lowest MAE (mae_factor), or QLIKE (qlike_factor), there
    harx, harx_rms, harx_level, harx_level_rms
                 HAR-X: the same, with the inputs the network reads beyond HAR's terms among the regressors
                 (HARX_INPUTS at the origin: the volume surprise, the market's range), least squares on the train
                 split as HAR's own; present only where the frame holds at least one of them (the families'
                 configs: what a linear model makes of the network's extra information, the bar for what the
                 network adds beyond it)
Quantile forecasts (Baselines.quantile_forecasts) of every quantity at `levels`:
    static       quantiles of the train samples' values
    ewma_scaled  the EWMA volatility times validation quantiles of the values divided by it
Volatility forecasts (Baselines.volatility) of the k-step return: "ewma" (RiskMetrics: sqrt(k x EWMA of squared
one-candle returns), alpha 0.06, i.e. lambda 0.94 - an alpha chosen on the same validation split as the
quantiles covers the test split worse), "har" (Parkinson from the har_tod ranges: sqrt(sum over steps 1..k of
range^2 / (4 ln 2))) and "har_ewma", the geometric mean of the two (a combination of two volatility forecasts
whose errors differ). Any one normalises the residuals of a conformal interval (trainer.evaluation.intervals);
"har_ewma" is the one whose intervals cover evenly across terciles of volatility (docs/model-quality.md).
No GARCH: `arch` is not a dependency.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd

from .. import heads
from ..data import store
from ..data.validate import timeframe_delta
from ..errors import JobError
from ..heads import quantities
from .names import Baseline

QUANTITIES = ("high", "low", "range", "return")
EXCURSIONS = ("high", "low")
ALPHAS = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5)
LEVELS = (0.1, 0.5, 0.9)
RISKMETRICS_ALPHA = 0.06  # of the EWMA of squared returns: RiskMetrics' lambda = 0.94
DAY, WEEK = pd.Timedelta(days=1), pd.Timedelta(days=7)
HAR_TERMS = ("intercept", "last", "day", "week", "time_of_day")
# What the network reads beyond HAR's terms, which HAR-X adds as regressors (../shared/docs/forecasting.md: the
# information beyond HAR): feature columns, where the config has them
HARX_INPUTS = ("volume_surprise", "market_range")
VOLATILITY_NAMES = {"ewma": "the EWMA volatility (RiskMetrics)", "har": "HAR's volatility",
                    "har_ewma": "the geometric mean of HAR's and the EWMA volatility"}  # Baselines.volatility's


@dataclass(frozen=True, eq=False)
class Baselines:
    """One job's fitted baselines (fit_baselines). Every array is held at every origin of the job's rows, so
    any split's samples - or the forecast after the last row (rows = [len(frame)]) - are a row selection:
    `rows` are first target rows (origin + 1), as SplitWindows.first_target_rows."""
    horizon: int
    levels: tuple[float, ...]
    floor: float  # the smallest positive range of the train split: a flat candle's range, for logs and QLIKE
    values: dict[str, np.ndarray]  # quantity -> (T, H) actual values; NaN past the last row
    points: dict[Baseline, dict[str, np.ndarray]]  # baseline -> quantity -> (T, H) point forecasts
    ewma_alphas: dict[str, np.ndarray]  # quantity -> (H,) chosen on validation
    har_coefficients: np.ndarray  # (H, 5): HAR_TERMS per step, of ln range
    time_of_day: np.ndarray  # (slots,) the train split's mean ln range per time-of-day slot
    har_log_variance: np.ndarray  # (H,) train residual variance of ln range (Baseline.HAR_TOD_RMS)
    excursion_shares: dict[str, np.ndarray]  # "high" / "low" -> (H,) median excursion / HAR_TOD's range
    volatilities: dict[str, np.ndarray]  # "ewma" / "har" / "har_ewma" -> (T, H) volatility of the k-step return
    static: dict[str, np.ndarray]  # quantity -> (L, H) train quantiles
    scaled: dict[str, np.ndarray]  # quantity -> (L, H) validation quantiles of value / ewma volatility
    timeframe: str = "1h"
    harx_fit: dict[str, np.ndarray] | None = None  # HAR-X's "coefficients" (H, 5 + E), "log_variance", "high", "low"
    harx_inputs: tuple[str, ...] = ()  # its extra regressors (HARX_INPUTS the frame had), in its coefficients' order
    first: int = 0  # the origin its (T, H) arrays start at (since): rows before it are not held

    def since(self, row: int) -> Baselines:
        """The same baselines, their arrays held from the origin of first target row `row` on: what the samples from
        there (a job's validation and test splits) read, a third of a job's rows, for the host worker that evaluates
        it (run.host)."""
        start = row - 1 - self.first

        def cut(arrays: dict) -> dict:
            return {key: value[start:] for key, value in arrays.items()}
        return replace(self, values=cut(self.values), points={name: cut(v) for name, v in self.points.items()},
                       volatilities=cut(self.volatilities), first=row - 1)

    @property
    def har_tod(self) -> Har:
        """HAR + time of day alone, to forecast after any candles (predict)."""
        return Har(self.timeframe, self.floor, self.har_coefficients, self.time_of_day, self.excursion_shares,
                   self.har_log_variance)

    @property
    def harx(self) -> Har | None:
        """HAR-X alone, to forecast after any feature rows holding its inputs (predict); None without it."""
        if self.harx_fit is None:
            return None
        fit = self.harx_fit
        return Har(self.timeframe, self.floor, fit["coefficients"], self.time_of_day,
                   {q: fit[q] for q in EXCURSIONS}, fit["log_variance"], self.harx_inputs)

    def _at(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Arrays held at every origin (from `first`) -> those of the samples whose first target rows are `rows`."""
        origins = np.asarray(rows) - 1 - self.first
        if origins.size and origins.min() < 0:
            raise ValueError(f"baselines held from origin {self.first} on: none at {origins.min() + self.first}")
        return values[origins]

    def har_inputs(self) -> np.ndarray:
        """(T, H, 3) HAR + time of day's forecasts after every row: the median high and low excursions and the
        root-mean-square range (HAR_TOD, HAR_TOD_RMS), which a HAR head starts from (Preprocessing.forecast_inputs):
        causal, fitted on the train split. Row t holds the forecast made at origin t."""
        return np.stack([self.points[Baseline.HAR_TOD]["high"], self.points[Baseline.HAR_TOD]["low"],
                         self.points[Baseline.HAR_TOD_RMS]["range"]], axis=-1)

    def actual(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """quantity -> (N, H) the samples' actual values."""
        return {q: self._at(v, rows) for q, v in self.values.items()}

    def forecast(self, rows: np.ndarray) -> dict[Baseline, dict[str, np.ndarray]]:
        """baseline -> quantity -> (N, H) point forecasts (HAR_TOD: high, low and range; HAR_TOD_RMS: range)."""
        return {name: {q: self._at(v, rows) for q, v in by_quantity.items()}
                for name, by_quantity in self.points.items()}

    def quantile_forecasts(self, rows: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """"static" / "ewma_scaled" -> quantity -> (L, N, H) quantile forecasts at self.levels, ordered."""
        vol = self._at(self.volatilities["ewma"], rows)
        return {"static": {q: np.repeat(s[:, None], len(vol), axis=1) for q, s in self.static.items()},
                "ewma_scaled": {q: s[:, None] * vol for q, s in self.scaled.items()}}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Its fitted values as named float64 arrays (nested dicts flattened, "points/har_tod/range"): what a cache
        entry holds, beside the arguments it was fitted with (from_arrays takes them back)."""
        flat = {"floor": np.asarray(self.floor),  # HAR-X's inputs by their place in HARX_INPUTS: numbers only
                "harx_inputs": np.asarray([HARX_INPUTS.index(c) for c in self.harx_inputs], np.float64)}
        for field, value in vars(self).items():
            if isinstance(value, np.ndarray):
                flat[field] = value
            elif isinstance(value, dict):
                for name, inner in value.items():
                    flat |= {f"{field}/{name}/{q}": v for q, v in inner.items()} if isinstance(inner, dict) \
                        else {f"{field}/{name}": inner}
        return flat

    @classmethod
    def from_arrays(cls, flat: dict[str, np.ndarray], timeframe: str, horizon: int,
                    levels: Sequence[float]) -> Baselines:
        """What to_arrays gives, and the arguments the fit was made with."""
        fields: dict = {"horizon": horizon, "levels": tuple(levels), "timeframe": timeframe,
                        "floor": float(flat["floor"]),
                        "harx_inputs": tuple(HARX_INPUTS[int(i)] for i in flat["harx_inputs"])}
        for key, value in flat.items():
            field, *path = key.split("/")
            if field in fields and not path:
                continue
            if not path:
                fields[field] = value
            elif field == "points":
                fields.setdefault(field, {}).setdefault(Baseline(path[0]), {})[path[1]] = value
            else:
                fields.setdefault(field, {})[path[0]] = value
        return cls(**fields)

    def volatility(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """"ewma" / "har" / "har_ewma" -> (N, H) volatility forecasts of the k-step return (normalisers of a conformal
        interval's residuals)."""
        return {name: self._at(v, rows) for name, v in self.volatilities.items()}


@dataclass(frozen=True)
class Har:
    """HAR + time of day as fitted on a job's train split (Baselines.har): what `predict` needs to forecast the
    range and the excursions of the candles after the last one it is given (a job directory's har.json)."""
    timeframe: str
    floor: float
    coefficients: np.ndarray  # (H, 5) of HAR_TERMS, per step, of ln range
    time_of_day: np.ndarray  # (slots,) the train split's mean ln range per time-of-day slot
    shares: dict[str, np.ndarray]  # "high" / "low" -> (H,) median excursion / range
    log_variance: np.ndarray  # (H,) of ln range about it (Baseline.HAR_TOD_RMS)
    inputs_beyond: tuple[str, ...] = ()  # HAR-X: the feature columns among its regressors (coefficients 5 on)

    def inputs(self, frame: pd.DataFrame) -> np.ndarray:
        """(1, H, 3) what a HAR head reads after the last row of `frame`, as Baselines.har_inputs holds it."""
        forecast = self.forecast(frame)
        return np.stack([forecast["high"], forecast["low"], forecast["range_rms"]], axis=-1)[None]

    def forecast(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """After the last row of `frame` (candles: high, low, close; UTC times; the last week of them is used,
        fewer where there are fewer): "range", "high", "low" (medians: HAR_TOD) and "range_rms" (HAR_TOD_RMS) ->
        (H,), and "volatility" -> "ewma" / "har" / "har_ewma" -> (H,) of the k-step return (the EWMA's start-up weight
        after a week of candles: 0.94^168 at 1h, 3e-5)."""
        week = frame.iloc[-(round(WEEK / timeframe_delta(self.timeframe)) + 1):]
        times, high, low, close = _candles(week)
        log_range = np.log(np.maximum(np.log(high / low), self.floor))
        delta = timeframe_delta(self.timeframe)
        origin = np.array([len(log_range) - 1])
        extra = None
        if self.inputs_beyond:
            missing = [c for c in self.inputs_beyond if c not in week.columns]
            if missing:
                raise JobError(f"HAR-X reads {', '.join(missing)}, which the rows given lack")
            extra = week[list(self.inputs_beyond)].to_numpy(dtype=np.float64)
        log_har = np.array([_har_design(log_range, times, delta, self.time_of_day, k + 1, extra)[origin]
                            @ coefficients for k, coefficients in enumerate(self.coefficients)])[:, 0]
        har_range = np.exp(log_har)
        squared = pd.Series(np.diff(np.log(close)) ** 2)
        variance = squared.ewm(alpha=RISKMETRICS_ALPHA, adjust=False).mean().to_numpy()[-1:] if len(squared) else \
            np.zeros(1)
        volatility = {name: v[0] for name, v in _volatilities(variance[None], har_range[None], self.floor).items()}
        return {"range": har_range, "range_rms": har_range * np.exp(self.log_variance),
                **{q: self.shares[q] * har_range for q in EXCURSIONS}, "volatility": volatility}

    def to_dict(self) -> dict:
        return {"timeframe": self.timeframe, "floor": self.floor, "terms": [*HAR_TERMS, *self.inputs_beyond],
                "coefficients": self.coefficients.tolist(), "time_of_day": self.time_of_day.tolist(),
                "shares": {q: v.tolist() for q, v in self.shares.items()}, "log_variance": self.log_variance.tolist()}

    @classmethod
    def from_dict(cls, values: dict) -> Har:
        if set(values) != {"timeframe", "floor", "terms", "coefficients", "time_of_day", "shares", "log_variance"}:
            raise ValueError(f"expected the keys of a fitted HAR + time of day, got {', '.join(sorted(values))}")
        terms = tuple(values["terms"])
        if terms[:len(HAR_TERMS)] != HAR_TERMS:
            raise ValueError(f"expected HAR's terms {', '.join(HAR_TERMS)} first, got {', '.join(terms)}")
        return cls(values["timeframe"], float(values["floor"]), np.asarray(values["coefficients"], np.float64),
                   np.asarray(values["time_of_day"], np.float64),
                   {q: np.asarray(values["shares"][q], np.float64) for q in EXCURSIONS},
                   np.asarray(values["log_variance"], np.float64), terms[len(HAR_TERMS):])


# What a stored fit depends on besides its candles and arguments: this code and the libraries it calls
_FIT_VERSION = store.make_key(Path(__file__).read_bytes(), Path(heads.__file__).read_bytes(),
                              *(version(package) for package in ("numpy", "pandas")))


def cached_baselines(cache: Path, frame: pd.DataFrame, timeframe: str, horizon: int, train_rows: np.ndarray,
                     val_rows: np.ndarray) -> Baselines:
    """fit_baselines, stored under `cache`/baselines by a key of everything the fit depends on (the frame's times,
    high, low and close, the arguments, this code and its libraries): a job prepared again - a resume, another
    epoch budget, the same candles in another run - reads the fit back, bit for bit. `frame`: a feature frame (a UTC
    DatetimeIndex)."""
    train_rows, val_rows = (np.asarray(rows, np.int64) for rows in (train_rows, val_rows))
    columns = ["high", "low", "close", *(c for c in HARX_INPUTS if c in frame.columns)]
    key = store.make_key(store.frame_digest(frame, columns), timeframe, str(horizon), train_rows, val_rows,
                         _FIT_VERSION)
    directory = cache / "baselines"
    stored = store.load_arrays(directory, key)
    if stored is not None:
        return Baselines.from_arrays(stored, timeframe, horizon, LEVELS)
    fitted = fit_baselines(frame, timeframe, horizon, train_rows, val_rows)
    store.save_arrays(directory, key, fitted.to_arrays())
    return fitted


def fit_baselines(frame: pd.DataFrame, timeframe: str, horizon: int, train_rows: np.ndarray, val_rows: np.ndarray,
                  levels: Sequence[float] = LEVELS, volatility_alpha: float = RISKMETRICS_ALPHA) -> Baselines:
    """Fit every baseline on a job's rows. `frame`: the rows the windows were cut from (candles or the feature
    frame: high, low, close; a UTC DatetimeIndex or a timestamp column); `train_rows`, `val_rows`: the first
    target rows of the train and validation samples (SplitWindows.first_target_rows); `volatility_alpha`: the EWMA's
    of squared returns, in the volatility forecasts (jobs use RiskMetrics'; bench-baselines checks others on
    validation)."""
    times, high, low, close = _candles(frame)
    train, val = np.asarray(train_rows) - 1, np.asarray(val_rows) - 1  # origins
    if len(train) == 0 or len(val) == 0 or train[0] < 0:
        raise JobError(f"baselines: need train and validation samples after the first row (got {len(train)} "
                       f"train, {len(val)} validation)")
    values = _values(high, low, close, horizon)
    train_end = train[-1] + horizon + 1  # the train split's rows: its samples' inputs and targets
    row_range = np.log(high / low)
    moved = row_range[:train_end][row_range[:train_end] > 0]
    if len(moved) == 0:
        raise JobError("baselines: no candle of the train split has high > low; nothing to scale a range by")
    floor = float(moved.min())
    log_range = np.log(np.maximum(row_range, floor))

    alphas, ewma = _chosen_ewma(np.stack([values[q] for q in QUANTITIES], axis=1), val)
    delta = timeframe_delta(timeframe)
    time_of_day, har_coefficients, log_har = _fit_har(log_range, times, delta, train, train_end, horizon)
    har_log_variance, shares, har, har_rms = _range_forecasts(log_har, log_range, values, train)
    har_range = har["range"]
    extra = [c for c in HARX_INPUTS if c in frame.columns]
    harx, harx_fit = {}, None
    if extra:
        _, harx_coefficients, log_harx = _fit_har(log_range, times, delta, train, train_end, horizon,
                                                  frame[extra].to_numpy(dtype=np.float64))
        harx_variance, harx_shares, harx_points, harx_rms = _range_forecasts(log_harx, log_range, values, train)
        harx_fit = {"coefficients": harx_coefficients, "log_variance": harx_variance, **harx_shares}
        harx = {Baseline.HARX: harx_points, Baseline.HARX_RMS: {"range": harx_rms},
                Baseline.HARX_LEVEL: {q: f * mae_factor(f[val], values[q][val]) for q, f in harx_points.items()},
                Baseline.HARX_LEVEL_RMS: {"range": harx_rms * qlike_factor(harx_rms[val], values["range"][val],
                                                                           floor)}}
    levels = tuple(levels)
    variance = _ewma(values["return"][:, :1] ** 2, volatility_alpha)  # (T, 1) of the one-candle return
    volatilities = _volatilities(variance, har_range, floor)
    return Baselines(
        horizon=horizon, levels=levels, floor=floor, values=values,
        points={Baseline.NO_CHANGE: {q: np.zeros_like(v) for q, v in values.items()},
                Baseline.PERSISTENCE: {q: _known(v) for q, v in values.items()},
                Baseline.EWMA: dict(zip(QUANTITIES, np.moveaxis(ewma, 1, 0))),
                Baseline.HAR_TOD: har, Baseline.HAR_TOD_RMS: {"range": har_rms},
                # HAR put on its level on validation, per step, as the network's forecasts are there
                # (serving.Serving): its medians by mae_factor, its root-mean-square range by qlike_factor
                Baseline.HAR_TOD_LEVEL: {q: f * mae_factor(f[val], values[q][val]) for q, f in har.items()},
                Baseline.HAR_TOD_LEVEL_RMS: {"range": har_rms * qlike_factor(har_rms[val], values["range"][val],
                                                                             floor)}, **harx},
        ewma_alphas=dict(zip(QUANTITIES, alphas)), har_coefficients=har_coefficients, time_of_day=time_of_day,
        har_log_variance=har_log_variance, excursion_shares=shares,
        volatilities=volatilities,
        static={q: np.quantile(v[train], levels, axis=0) for q, v in values.items()},
        scaled={q: np.quantile(v[val] / volatilities["ewma"][val], levels, axis=0) for q, v in values.items()},
        timeframe=timeframe, harx_fit=harx_fit, harx_inputs=tuple(extra),
    )


# ----------------------------------------------------------------------------- combination
WEIGHTS = np.linspace(0.0, 1.0, 21).round(2)  # 0.3, not 0.30000000000000004, in metrics.json


def combination_weights(forecasts: Sequence[np.ndarray], actual: np.ndarray,
                        loss: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Per step (axis 1), the weights of `forecasts` (each (N, H)) - on WEIGHTS' grid, none negative, summing to 1 -
    whose weighted sum has the lowest loss on these (validation) samples: (len(forecasts), H). `loss(forecast,
    actual)`: per step (H,), by default the MAE (a median's). Each forecast alone is one of the choices, so the
    combination's loss there is never above any one's; where several are as good, the one with more weight on the
    later forecasts (the baselines, after the network) is kept. A combination of forecasts whose errors differ beats
    each (Bates & Granger 1969); a few weights per step are too few parameters for the validation split to
    overfit."""
    stacked = np.stack(forecasts)  # (F, N, H)
    steps = round(1 / WEIGHTS[1])
    grid = np.array([(*head, steps - sum(head)) for head in itertools.product(range(steps + 1),
                                                                             repeat=len(forecasts) - 1)
                     if sum(head) <= steps], dtype=np.float64) / steps  # (C, F), in the order of the first weights
    loss = loss or (lambda forecast, truth: np.mean(np.abs(forecast - truth), axis=0))
    errors = np.stack([loss(np.tensordot(w, stacked, axes=1), actual) for w in grid])  # (C, H)
    return grid[np.argmin(errors, axis=0)].T.round(2)


# ----------------------------------------------------------------------------- levels
def mae_factor(forecast: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Per step (axis 1), the a > 0 whose a x forecast has the lowest MAE on these samples: the median of actual /
    forecast weighted by forecast (forecasts > 0 only; 1 where there is none)."""
    factors = np.ones(forecast.shape[1])
    for k in range(forecast.shape[1]):
        f, y = forecast[:, k], actual[:, k]
        f, y = f[f > 0], y[f > 0]
        if len(f):
            order = np.argsort(y / f)
            weight = np.cumsum(f[order])
            factors[k] = (y / f)[order][np.searchsorted(weight, weight[-1] / 2)]
    return factors


def qlike_factor(forecast: np.ndarray, actual: np.ndarray, floor: float) -> np.ndarray:
    """Per step (axis 1), the a > 0 whose a x forecast (a root mean square) has the lowest QLIKE on these samples:
    the root mean square of actual / forecast (both floored)."""
    return np.sqrt(np.mean((np.maximum(actual, floor) / np.maximum(forecast, floor)) ** 2, axis=0))


# ----------------------------------------------------------------------------- fitting
def _candles(frame: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """UTC open times (ns since the epoch) and high, low, close of a candle frame; one line on what is wrong."""
    if isinstance(frame.index, pd.DatetimeIndex):
        times = frame.index
    elif "timestamp" in frame.columns:
        times = pd.DatetimeIndex(pd.to_datetime(frame["timestamp"], utc=True))
    else:
        raise JobError("baselines: the candles have no times (a DatetimeIndex or a timestamp column)")
    missing = [c for c in ("high", "low", "close") if c not in frame.columns]
    if missing:
        raise JobError(f"baselines: the candles have no column {', '.join(missing)}")
    prices = frame[["high", "low", "close"]].to_numpy(dtype=np.float64)
    if not (prices > 0).all():  # also NaN
        row, col = np.argwhere(~(prices > 0))[0]
        raise JobError(f"baselines: {('high', 'low', 'close')[col]} is {prices[row, col]:g} at {times[row]}; "
                       "prices must be positive")
    return (times.as_unit("ns").asi8, *prices.T)


def _values(high: np.ndarray, low: np.ndarray, close: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
    """quantity -> (T, H): the value at every origin (row) t and step k at [t, k - 1]; NaN past the last row."""
    ahead = np.arange(len(close))[:, None] + np.arange(1, horizon + 1)
    inside = ahead < len(close)
    at = np.minimum(ahead, len(close) - 1)
    return {q: np.where(inside, v, np.nan) for q, v in quantities(high[at], low[at], close[at], close).items()}


def _known(values: np.ndarray) -> np.ndarray:
    """(T, ..., H) values at every origin -> at [t, ..., k - 1] the value of step k at origin t - k, the latest
    one known at origin t (NaN where t < k)."""
    known = np.full(values.shape, np.nan)
    for k in range(1, values.shape[-1] + 1):
        known[k:, ..., k - 1] = values[:-k, ..., k - 1]
    return known


def _smoothed(values: np.ndarray, alpha: float) -> np.ndarray:
    """(T, ..., H) -> the exponentially weighted mean of each column at every row (pandas' ewm, adjust=False)."""
    return pd.DataFrame(values.reshape(len(values), -1)).ewm(alpha=alpha, adjust=False).mean().to_numpy() \
        .reshape(values.shape)


def _ewma(values: np.ndarray, alpha: float) -> np.ndarray:
    """(T, ..., H) -> the exponentially weighted mean of each column's known values at every origin."""
    return _known(_smoothed(values, alpha))


def _chosen_ewma(values: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, ..., H): per column, the alpha of ALPHAS whose EWMA has the lowest MAE at the validation origins
    (shaped like a row), and that EWMA (T, ..., H). A validation origin t's EWMA of step k is the mean at row t - k
    (_known): read there, for every alpha, before the chosen one is shifted whole."""
    steps = np.arange(1, values.shape[-1] + 1)
    at = np.asarray(val)[:, None] - steps  # (V, H): the row each validation origin's step reads
    column = values.shape[1:]
    alphas, lowest, chosen = np.full(column, ALPHAS[0]), np.full(column, np.inf), np.empty(values.shape)
    for alpha in ALPHAS:
        smoothed = _smoothed(values, alpha)
        known = np.stack([smoothed[at[:, k], ..., k] for k in range(len(steps))], axis=-1)  # (V, ..., H)
        error = np.abs(known - values[val]).mean(axis=0)
        better = error < lowest
        alphas[better], lowest[better] = alpha, error[better]
        chosen[:, better] = smoothed[:, better]
    return alphas, _known(chosen)


def _range_forecasts(log_fitted: np.ndarray, log_range: np.ndarray, values: dict[str, np.ndarray],
                     train: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """A fitted ln range (T, H) -> its residual variance per step on the train origins, the excursions' shares of
    the range (the train median of excursion / range, per step: an excursion is a share of its candle's range), the
    median forecasts of the range and of the excursions (the range times those shares), and the root-mean-square
    range (x exp(variance): a log-normal range's)."""
    horizon = log_fitted.shape[1]
    variance = np.var(log_range[train[:, None] + np.arange(1, horizon + 1)] - log_fitted[train], axis=0)
    median = np.exp(log_fitted)
    shares = {q: np.median(values[q][train] / median[train], axis=0) for q in EXCURSIONS}
    points = {"range": median, **{q: shares[q] * median for q in EXCURSIONS}}
    return variance, shares, points, median * np.exp(variance)


def _fit_har(log_range: np.ndarray, times: np.ndarray, delta: pd.Timedelta, train: np.ndarray, train_end: int,
             horizon: int, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HAR + time of day, one least-squares fit per step on the train origins: the train split's mean ln range
    per time-of-day slot (slots of the timeframe in a day), the coefficients (H, 5) of HAR_TERMS (_har_design)
    and the fitted ln range (T, H) at every origin. `extra` (T, E): more regressors at each origin (HAR-X)."""
    slot = (times % DAY.value) // delta.value
    counts = np.bincount(slot[:train_end], minlength=math.ceil(DAY / delta))
    sums = np.bincount(slot[:train_end], weights=log_range[:train_end], minlength=len(counts))
    time_of_day = np.where(counts > 0, sums / np.maximum(counts, 1), log_range[:train_end].mean())
    coefficients, fitted = np.empty((horizon, len(HAR_TERMS))), np.empty((len(log_range), horizon))
    if extra is not None:
        coefficients = np.empty((horizon, len(HAR_TERMS) + extra.shape[1]))
    for k in range(horizon):
        design = _har_design(log_range, times, delta, time_of_day, k + 1, extra)
        coefficients[k] = np.linalg.lstsq(design[train], log_range[train + k + 1], rcond=None)[0]
        fitted[:, k] = design @ coefficients[k]
    return time_of_day, coefficients, fitted


def _har_design(log_range: np.ndarray, times: np.ndarray, delta: pd.Timedelta, time_of_day: np.ndarray,
                step: int, extra: np.ndarray | None = None) -> np.ndarray:
    """(T, 5) HAR_TERMS at every origin for the candle `step` rows ahead: 1, the last ln range, its means over
    the last day and week (as many candles as there are at the start), the mean at that candle's time of day; and
    HAR-X's `extra` regressors (T, E) at the origin after them."""
    day, week = (max(1, round(span / delta)) for span in (DAY, WEEK))
    series = pd.Series(log_range)
    target_slot = ((times + step * delta.value) % DAY.value) // delta.value
    return np.column_stack([np.ones(len(log_range)), log_range, series.rolling(day, min_periods=1).mean(),
                            series.rolling(week, min_periods=1).mean(), time_of_day[target_slot],
                            *([] if extra is None else [extra])])




def _volatilities(variance: np.ndarray, har_range: np.ndarray, floor: float) -> dict[str, np.ndarray]:
    """(N, 1) EWMA variance of the one-candle return and (N, H) har_tod ranges -> "ewma", "har", "har_ewma":
    (N, H) volatilities of the k-step return (module docstring)."""
    ewma = np.maximum(np.sqrt(variance * np.arange(1, har_range.shape[1] + 1)), floor)
    har = np.sqrt(np.cumsum(har_range**2, axis=1) / (4 * math.log(2)))
    return {"ewma": ewma, "har": har, "har_ewma": np.sqrt(ewma * har)}
