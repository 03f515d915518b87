"""Calibrated intervals around any forecaster's forecasts: conformal prediction, an object a forecaster's forecasts
are given to (statsforecast's ConformalIntervals is the model), one class per method, each with the same
`intervals(calibration, forecasts)`:
- SplitConformal: one margin per step from the calibration samples' residuals (the validation split's);
- AdaptiveConformal: adaptive conformal inference (Gibbs & Candes 2021), its level moved after each outcome of the
  samples it makes intervals for, starting from the calibration samples' residuals.
The residuals are normalised by a volatility forecast, so the interval widens with it (Gibbs & Candes 2021). What
calibrates best across terciles of volatility is measured in docs/model-quality.md.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import JobError


@dataclass(frozen=True)
class Forecasts:
    """One forecaster's forecasts of a quantity over samples in time order, each (N, H): `lower` and `upper` (a
    point forecast: both the same; a quantile pair: conformalised quantile regression, Romano et al. 2019), the
    `actual` values, and a volatility forecast to normalise the residuals by (`scale`); `rows` (N,): the samples' first
    target rows (SplitWindows.first_target_rows), which say when each outcome is known: k rows after its origin at
    step k."""
    lower: np.ndarray
    upper: np.ndarray
    actual: np.ndarray
    scale: np.ndarray
    rows: np.ndarray

    @property
    def conformity(self) -> np.ndarray:
        """How far outside [lower, upper] each actual value fell (negative: inside), in units of the scale."""
        return conformity(self.lower, self.upper, self.actual, self.scale)


def conformity(lower: np.ndarray, upper: np.ndarray, actual: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """How far outside [lower, upper] each actual value fell (negative: inside), in units of `scale`."""
    return np.maximum(lower - actual, actual - upper) / scale


def widened(lower: np.ndarray, upper: np.ndarray, margin: np.ndarray,
            scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lower, upper] widened by a margin in units of `scale` on each side: the one place an interval is made from
    its margin (the methods here, and what a job serves: evaluation.serving)."""
    return lower - margin * scale, upper + margin * scale


@dataclass(frozen=True)
class Intervals:
    """The intervals a method made for the samples of `Forecasts`, and the margin of the next one."""
    lower: np.ndarray  # (N, H)
    upper: np.ndarray
    margin: np.ndarray  # (N, H): per sample and step, in units of the scale
    next_margin: np.ndarray  # (H,): the margin of an interval after the last sample (predict's)
    level: np.ndarray | None = None  # adaptive: per step, the coverage level once every outcome was known


@dataclass(frozen=True)
class SplitConformal:
    """Split conformal on the calibration samples: the margin of each step is the ceil((n + 1) x coverage)-th
    smallest of the n calibration samples' conformity scores, the same for every sample after them; exchangeable
    samples are covered at least `coverage` of the time (at most 1 / (n + 1) more)."""
    name: ClassVar[str] = "split"
    coverage: float = 0.8

    def intervals(self, calibration: Forecasts, forecasts: Forecasts) -> Intervals:
        margin = self.margin(calibration.conformity)
        return Intervals(*widened(forecasts.lower, forecasts.upper, margin, forecasts.scale),
                         np.broadcast_to(margin, forecasts.lower.shape), margin)

    def margin(self, scores: np.ndarray) -> np.ndarray:
        """Per step, the margin of these calibration scores (axis 0)."""
        n = len(scores)
        rank = math.ceil((n + 1) * self.coverage)
        if rank > n:
            raise JobError(f"conformal calibration: {n} samples are too few for a {self.coverage:.0%} interval "
                           f"(at least {math.ceil(self.coverage / (1 - self.coverage))})")
        return np.sort(scores, axis=0)[rank - 1]

    def settings(self) -> dict:
        """What the intervals' scores record of the method (results.IntervalScores)."""
        return {"method": self.name}


@dataclass(frozen=True)
class AdaptiveConformal:
    """Adaptive conformal inference (Gibbs & Candes 2021) over samples in time order, each step k on its own: the
    miscoverage level alpha_t starts at 1 - coverage and moves by gamma x (1 - coverage - err) as each outcome
    becomes known, err = 1 where it fell outside the interval made for it. A sample's margin is the
    ceil((n + 1) x (1 - alpha_t))-th smallest of the n conformity scores known at its origin: the calibration
    samples' and those of the earlier samples whose step-k outcome is known by then, k rows after their origin. The
    set grows; on the 48 shared series a rolling window of the latest 500 to 1500 scores covers the same. A rank past
    the n scores (alpha_t at or below 1 / (n + 1), where the paper's interval is infinite) is clipped to the largest
    score, one below 1 to the smallest: every interval is finite."""
    name: ClassVar[str] = "adaptive"
    coverage: float = 0.8
    gamma: float = 0.005

    def intervals(self, calibration: Forecasts, forecasts: Forecasts) -> Intervals:
        scores, rows = forecasts.conformity, np.asarray(forecasts.rows)
        known_scores = calibration.conformity
        margin, level, end_margin = np.empty(scores.shape), np.empty(scores.shape[1]), np.empty(scores.shape[1])
        for k in range(scores.shape[1]):
            known, alpha, told = sorted(known_scores[:, k].tolist()), 1 - self.coverage, 0
            missed = np.zeros(len(scores), bool)
            # per origin, how many samples' outcomes at step k + 1 are known; after the last, all of them
            known_by = [*np.searchsorted(rows, rows - (k + 1), side="right"), len(scores)]
            for i, outcomes in enumerate(known_by):
                for j in range(told, outcomes):
                    bisect.insort(known, scores[j, k])
                    alpha += self.gamma * (1 - self.coverage - missed[j])
                told = outcomes
                chosen = known[min(max(math.ceil((len(known) + 1) * (1 - alpha)), 1), len(known)) - 1]
                if i < len(scores):
                    margin[i, k], missed[i] = chosen, scores[i, k] > chosen
            level[k], end_margin[k] = 1 - alpha, chosen
        return Intervals(*widened(forecasts.lower, forecasts.upper, margin, forecasts.scale), margin, end_margin,
                         level)

    def settings(self) -> dict:
        return {"method": self.name, "gamma": self.gamma}


Conformal = AdaptiveConformal | SplitConformal
METHODS = {method.name: method for method in (AdaptiveConformal, SplitConformal)}  # evaluation.interval.method
