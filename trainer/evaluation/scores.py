"""How forecasts are scored (docs/model-quality.md, "How a job is scored"): MAE and skill, QLIKE for the range, the
pinball loss for quantiles, coverage for intervals (overall and by tercile of the forecast volatility). Plain numpy
over forecasts and actual values, whoever made the forecasts (the network, a baseline of
trainer.evaluation.baselines)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .results import PointScores


def mae(forecast: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(forecast - actual)))


def skill(error: float, baseline_error: float | None) -> float | None:
    """1 - error / the baseline's error (MAE, QLIKE): positive beats the baseline; None where the baseline is
    exact or has no score."""
    return 1 - error / baseline_error if baseline_error else None


def qlike(forecast: np.ndarray, actual: np.ndarray, floor: float) -> float | None:
    """Mean QLIKE of range forecasts, r - ln r - 1 with r = actual^2 / forecast^2 (Patton 2011); an actual
    below `floor` (a flat candle) counts as the floor. None where some forecast is not positive: a range of 0
    (no_change) has an infinite QLIKE, so there is no QLIKE skill against no change."""
    return None if not np.all(forecast > 0) else float(np.mean(qlike_losses(forecast, actual, floor)))


def qlike_losses(forecast: np.ndarray, actual: np.ndarray, floor: float) -> np.ndarray:
    """Each sample's QLIKE (see qlike); forecasts must be positive."""
    ratio = (np.maximum(actual, floor) / forecast) ** 2
    return ratio - np.log(ratio) - 1


def diebold_mariano(loss: np.ndarray, baseline_loss: np.ndarray) -> float | None:
    """Two-sided p-value of the Diebold-Mariano test that a forecast and a baseline have the same expected loss,
    from their losses per sample (N,) in time order: the mean loss difference over its long-run standard error
    (Newey-West, Bartlett weights up to lag floor(2 N ^ (1/3)): the differences of forecasts whose errors cluster in
    time, like volatility's, are autocorrelated), against the normal distribution. It is somewhat liberal on
    persistent differences: on AR(1) ones (phi 0.6, N 600 to 3,000) it rejected a true null 8-9 % of the time at
    5 % (a t-test taking the samples as independent: 37 %; the usual lag, 4 (N / 100) ^ (2 / 9): 10 %). None for
    fewer than 30 samples or losses that differ by rounding at most."""
    loss, baseline_loss = np.asarray(loss, dtype=float), np.asarray(baseline_loss, dtype=float)
    n = len(loss)
    if n < 30 or np.allclose(loss, baseline_loss, rtol=1e-9, atol=0):  # the same forecasts, but for rounding
        return None
    difference = baseline_loss - loss
    centred = difference - difference.mean()
    lags = int(2 * n ** (1 / 3))
    variance = centred @ centred / n + sum(2 * (1 - k / (lags + 1)) * (centred[k:] @ centred[:-k]) / n
                                           for k in range(1, lags + 1))
    if not variance > 0:
        return None
    return float(math.erfc(abs(difference.mean()) / math.sqrt(variance / n) / math.sqrt(2)))


def pinball(forecast: np.ndarray, actual: np.ndarray, level: float) -> float:
    """Mean pinball (quantile) loss of forecasts of the `level` quantile."""
    error = actual - forecast
    return float(np.mean(np.maximum(level * error, (level - 1) * error)))


class Coverage(NamedTuple):
    overall: float
    terciles: list[float]  # by tercile of the forecast volatility, low to high


def coverage(lower: np.ndarray, upper: np.ndarray, actual: np.ndarray, scale: np.ndarray) -> Coverage:
    """The share of actual values inside [lower, upper], overall and by tercile of `scale` (the forecast
    volatility, low to high; terciles of the values given: pass one step at a time)."""
    inside = (actual >= lower) & (actual <= upper)
    tercile = np.digitize(scale, np.quantile(scale, [1 / 3, 2 / 3]))
    return Coverage(float(inside.mean()), [float(inside[tercile == i].mean()) for i in range(3)])


def point_scores(forecast: np.ndarray, actual: np.ndarray, quantity: str, floor: float) -> PointScores:
    """One forecast (N, H) of `quantity`: MAE at the next candle, over every step and per step; for the range
    also QLIKE at the next candle and over every step (None for a forecast of 0: see qlike)."""
    errors = np.abs(forecast - actual).mean(axis=0)
    ranges = {"qlike": qlike(forecast[:, 0], actual[:, 0], floor), "qlike_horizon": qlike(forecast, actual, floor)} \
        if quantity == "range" else {}
    return PointScores(mae=float(errors[0]), mae_horizon=float(errors.mean()), mae_by_step=errors.tolist(), **ranges)
