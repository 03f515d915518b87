"""Scores (trainer/evaluation/scores.py): MAE and skill, QLIKE of the range, the pinball loss, coverage by tercile."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.evaluation import scores


def test_scores():
    actual = np.array([[0.01, 0.02], [0.02, 0.04]])
    assert scores.mae(actual * 2, actual) == pytest.approx(0.0225)
    assert scores.qlike(actual, actual, 1e-4) == 0
    assert scores.qlike(actual * 2, actual, 1e-4) == pytest.approx(0.25 - math.log(0.25) - 1)
    assert scores.qlike(np.zeros_like(actual), actual, 1e-4) is None  # no change's range
    assert scores.pinball(np.zeros(2), np.array([1.0, -1.0]), 0.9) == pytest.approx((0.9 + 0.1) / 2)
    assert scores.skill(0.75, 1.0) == 0.25 and scores.skill(0.5, 0.0) is None and scores.skill(0.5, None) is None
    point = scores.point_scores(actual * 2, actual, "range", 1e-4)
    assert point.mae == pytest.approx(0.015) and point.mae_horizon == pytest.approx(0.0225)
    assert point.qlike == pytest.approx(point.qlike_horizon)
    covered = scores.coverage(np.zeros(6), np.ones(6), np.array([0.5, 2, 0.5, 0.5, 2, 0.5]), np.arange(6.0))
    assert covered == (pytest.approx(4 / 6), [0.5, 1.0, 0.5])


def _autocorrelated(rng: np.random.Generator, n: int, phi: float = 0.6) -> np.ndarray:
    """An AR(1) series: loss differences of forecasts whose errors cluster in time, as volatility's do."""
    shocks = rng.normal(size=n)
    out = np.empty(n)
    out[0] = shocks[0]
    for t in range(1, n):
        out[t] = phi * out[t - 1] + shocks[t]
    return out


def test_diebold_mariano_holds_its_size_on_autocorrelated_differences_and_finds_a_real_gain():
    rng = np.random.default_rng(0)
    base = rng.exponential(size=600)
    # no difference in expected loss, differences autocorrelated: rejected at 5 % not much more than 5 % of the time
    # (a t-test that takes the samples as independent rejects ~37 % of such draws)
    p_values = [scores.diebold_mariano(base + _autocorrelated(rng, 600), base) for _ in range(400)]
    assert 0.02 <= np.mean(np.array(p_values) < 0.05) <= 0.10
    # a forecast that is better by a small, steady amount: found, and the p-value is the same whichever side
    better = base - 0.5 + _autocorrelated(rng, 600)
    assert scores.diebold_mariano(better, base) < 0.01
    assert scores.diebold_mariano(base, better) == pytest.approx(scores.diebold_mariano(better, base))
    assert scores.diebold_mariano(base, base) is None and scores.diebold_mariano(base[:20], base[:20] + 1) is None
