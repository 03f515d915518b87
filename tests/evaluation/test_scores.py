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
