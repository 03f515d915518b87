"""Conformal intervals (trainer/evaluation/intervals.py) around any forecaster's forecasts: split conformal covers its
nominal rate overall and by volatility tercile (normalised); adaptive conformal keeps its coverage where the
volatility jumps, its level moving after each outcome once it is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.errors import JobError
from trainer.evaluation.intervals import AdaptiveConformal, Forecasts, SplitConformal
from trainer.evaluation.scores import coverage


def around(centre: float, actual: np.ndarray, scale: np.ndarray | float = 1.0,
           spread: np.ndarray | float = 0.0) -> Forecasts:
    """Forecasts [centre - spread, centre + spread] of `actual` (N, H); `scale` normalises the residuals, `scale` and
    `spread` per sample (N,) or one for all; the samples one row apart."""
    actual = np.asarray(actual, float).reshape(len(actual), -1)

    def per_sample(value: np.ndarray | float) -> np.ndarray:
        return np.broadcast_to(np.reshape(value, (-1, 1)) if np.ndim(value) else value, actual.shape)

    spread = per_sample(spread)
    return Forecasts(centre - spread, centre + spread, actual, per_sample(scale), np.arange(len(actual)) + 10_000)


def test_split_conformal_covers_its_nominal_rate_overall_and_by_volatility_tercile():
    rng = np.random.default_rng(11)
    n_cal, n_test, nominal, centre = 20_000, 30_000, 0.8, 0.2

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:  # heteroscedastic, heavy-tailed: centre + sigma x t(5)
        sigma = np.exp(rng.normal(0, 0.6, n))
        return centre + sigma * rng.standard_t(5, n), sigma

    (cal, cal_sigma), (test, test_sigma) = draw(n_cal), draw(n_test)

    def tolerance(n: int) -> float:
        """4 sd of the coverage of n test samples: binomial given the calibration, whose own error is Beta."""
        return 4 * math.sqrt(nominal * (1 - nominal) * (1 / n_cal + 1 / n))

    method = SplitConformal(nominal)
    for name, spread in {"point": 0.0, "quantile pair, too narrow (CQR)": 0.3}.items():
        made = method.intervals(around(centre, cal, cal_sigma, spread * cal_sigma),
                                around(centre, test, test_sigma, spread * test_sigma))
        covered = coverage(made.lower[:, 0], made.upper[:, 0], test, test_sigma)
        assert abs(covered.overall - nominal) < tolerance(n_test), (name, covered)
        for share in covered.terciles:
            assert abs(share - nominal) < tolerance(n_test // 3), (name, covered)
        assert (made.margin == made.next_margin).all() and made.level is None  # one margin throughout

    # Not normalised: the same rate overall, but too wide when calm and too narrow when wild.
    plain = method.intervals(around(centre, cal), around(centre, test))
    covered = coverage(plain.lower[:, 0], plain.upper[:, 0], test, test_sigma)
    assert abs(covered.overall - nominal) < tolerance(n_test)
    low_vol, _, high_vol = covered.terciles
    assert low_vol > nominal + 0.1 and high_vol < nominal - 0.1, covered


def test_adaptive_conformal_keeps_its_coverage_where_the_volatility_jumps_and_split_does_not():
    """The returns' volatility doubles mid-test while the forecast of it does not: split conformal's margin, fixed
    on calibration, covers half the time after the jump; adaptive conformal's level rises until it covers 80 %
    again, and over the whole test split it covers within Gibbs & Candes' bound (max(alpha, 1 - alpha) + gamma)
    / (gamma T) of 80 %, at step 1 and at step 2 (whose outcomes it learns a row later)."""
    rng = np.random.default_rng(5)
    n_cal, n_test, nominal, gamma = 2000, 6000, 0.8, 0.005

    def draw(n: int, jump: int) -> tuple[np.ndarray, np.ndarray]:  # returns (n, 2 steps), their forecast sigma (n, 2)
        sigma = np.exp(rng.normal(0, 0.5, n))
        true_sigma = sigma * np.where(np.arange(n) >= jump, 2.0, 1.0)
        return true_sigma[:, None] * rng.standard_normal((n, 2)), np.repeat(sigma[:, None], 2, axis=1)

    (cal, cal_sigma), (test, sigma) = draw(n_cal, n_cal), draw(n_test, n_test // 2)
    after = slice(n_test // 2, None)
    calibration, forecasts = around(0.0, cal, cal_sigma[:, 0]), around(0.0, test, sigma[:, 0])

    def covered(made) -> np.ndarray:
        return (test >= made.lower) & (test <= made.upper)

    split = SplitConformal(nominal).intervals(calibration, forecasts)
    assert (covered(split)[after].mean(axis=0) < 0.55).all() and (covered(split).mean(axis=0) < 0.7).all()

    adaptive = AdaptiveConformal(nominal, gamma).intervals(calibration, forecasts)
    inside = covered(adaptive)
    bound = (nominal + gamma) / (gamma * n_test)
    assert (abs(inside.mean(axis=0) - nominal) < bound).all(), inside.mean(axis=0)
    assert (inside[after].mean(axis=0) > 0.77).all(), inside[after].mean(axis=0)
    assert (adaptive.level > 0.85).all() and (adaptive.next_margin > 1.5 * split.next_margin).all()


def test_the_adaptive_level_moves_after_each_outcome_once_it_is_known():
    """Each miss raises the coverage level by gamma x 0.8 and each hit lowers it by gamma x 0.2, from the moment
    the outcome is known: a step-1 outcome at the next origin, a step-2 outcome an origin later. The margin is the
    level's rank among the scores known; where the level passes the largest one it stays there, finite."""
    calibration = around(0.0, np.repeat(np.linspace(0, 1, 101)[:, None], 2, axis=1))  # 101 scores, 0.01 apart
    outcomes = around(0.0, np.repeat(np.r_[np.full(10, 5.0), np.zeros(30)][:, None], 2, axis=1))  # 10 misses, 30 hits
    adaptive = AdaptiveConformal(0.8, 0.005).intervals(calibration, outcomes)
    assert adaptive.level == pytest.approx([0.8 + 0.005 * (10 * 0.8 - 30 * 0.2)] * 2)
    margin = adaptive.margin
    # the first: rank ceil(102 x 0.8) = 82 of the calibration's scores; at step 1 the second knows one miss more
    assert margin[0] == pytest.approx([0.81, 0.81]) and margin[1, 0] == pytest.approx(0.82)  # ceil(103 x 0.804)
    assert margin[1, 1] == margin[0, 1] < margin[2, 1]  # at step 2 the first miss is known an origin later
    assert (np.diff(margin[:11], axis=0) >= 0).all() and (np.diff(margin[12:], axis=0) <= 0).all()

    clipped = AdaptiveConformal(0.8, 0.1).intervals(calibration, outcomes)  # the level passes 1 after three misses
    assert np.isfinite(clipped.margin).all() and clipped.margin[4, 0] == 5.0  # the largest score known


def test_too_few_calibration_samples_for_the_coverage_is_one_line():
    with pytest.raises(JobError, match="3 samples are too few for a 80% interval"):
        SplitConformal(0.8).intervals(around(0.0, np.ones(3)), around(0.0, np.ones(3)))
