"""The section of a run's config that the evaluation stage reads (EvaluationConfig); config.RunConfig assembles it
with the others."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..specs import Strict
from .intervals import METHODS, AdaptiveConformal, SplitConformal


class IntervalConfig(Strict):
    """How the 80 % interval of the close's return is calibrated (evaluate.candle_scores; predict shows it after
    the latest candles). "adaptive": adaptive conformal inference (Gibbs & Candes 2021), its level moved by
    `gamma` after each outcome of the test split, starting from the validation split's residuals; predict uses
    the level it ended at. "split": split conformal on the validation split, one margin throughout (`gamma`
    unused). Both normalise the residuals by a volatility forecast (evaluate.INTERVAL_NORMALISER)."""
    method: Literal[tuple(METHODS)] = "adaptive"
    gamma: float = Field(0.005, gt=0, lt=1)

    def conformal(self, coverage: float) -> AdaptiveConformal | SplitConformal:
        """The method, set up for intervals of this coverage."""
        return METHODS[self.method](coverage, **{k: v for k, v in self.model_dump().items()
                                                 if k in METHODS[self.method].__dataclass_fields__})


class EvaluationConfig(Strict):
    interval: IntervalConfig = IntervalConfig()
