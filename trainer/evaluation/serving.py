"""What a job serves of the size of the coming candles and of its close's interval: one recipe (Serving), fitted on
the job's validation split, kept in its directory (serving.json), and applied by the same call to every test window in
evaluation and to the latest candles in `predict`.

From the candle head's forecasts (Head.candle_quantities: the high and low excursions from the last close, the range
ln(high / low), the return; per sample and step) and its baselines' (HAR + time of day, and HAR-X where the job has
it: their medians, their root-mean-square ranges, HAR's volatility forecasts) it serves, in log units:
- expected_high, expected_low, expected_range: medians, what MAE scores. The network's put on their level on
  validation (each times the factor with the lowest MAE there: mae_factor), then blended with HAR-X's and HAR's, the
  weights per quantity and step those with the lowest MAE there (combination_weights: the network alone, a baseline
  alone, or a blend; never worse there than any of them);
- expected_range_rms: the range's root mean square, what QLIKE scores (the scale to size risk with). The network's
  range (floored at the train split's smallest) and HAR-X's and HAR's root-mean-square ranges, each put on its own
  level on validation (times the factor with the lowest QLIKE there: qlike_factor), blended with the weights that
  have the lowest QLIKE there;
- interval_low, interval_high: the close's 80 % interval of the return, the network's return ± margin x HAR's
  volatility forecast (`normaliser`); the margin is conformal's (evaluation.intervals), given with the forecasts:
  evaluation's moves along the test split (adaptive), predict's is the one of that time (predictions.npz), or after
  the test split the one it ended at (`margin`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from .baselines import combination_weights, mae_factor, qlike_factor
from .intervals import widened
from .scores import qlike_losses

# The quantities served as medians, and the sources of each blend beside the network (where the job has them)
MEDIANS = ("high", "low", "range")
SOURCES = ("harx", "har_tod")  # HAR-X, HAR + time of day (baselines.Baseline's values)

# A source's forecasts of a sample's coming candles, by quantity ((N, H) each): "high", "low", "range" (medians),
# "range_rms" (the root-mean-square range), "return" (the network's), "volatility" (HAR's, by normaliser: (N, H))
Quantities = dict[str, np.ndarray]


class Serving(BaseModel):
    """The recipe (the module's docstring): per step, the factors that put the network's forecasts on their level on
    validation, those of the baselines' root-mean-square ranges, the blend weights of each served quantity by source
    ("network", "harx", "har_tod"), the range's floor, and the interval's normaliser and last margin."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    floor: float  # the smallest range of the train split (HAR's): a forecast of 0 has no QLIKE
    median_factors: dict[str, list[float]]  # "high", "low", "range" -> the network's, per step
    rms_factor: list[float]  # the network's range, floored, to its root mean square's level
    rms_levels: dict[str, list[float]]  # each source's root-mean-square range to its level
    weights: dict[str, dict[str, list[float]]]  # "high", "low", "range" (medians) -> source -> per step
    rms_weights: dict[str, list[float]]  # the range's root mean square: source -> per step
    normaliser: str  # the volatility forecast (HAR's) the interval's margin is in units of
    margin: list[float]  # per step: the interval's margin after the last test window (predict's after the test split)

    @classmethod
    def fit(cls, network: Quantities, sources: dict[str, Quantities], actual: Quantities, floor: float,
            normaliser: str, margin: np.ndarray) -> Serving:
        """The recipe fitted on the validation samples: the network's and the sources' forecasts there, and what
        happened (`actual`: "high", "low", "range"); `margin`: the interval's margin after the test split."""
        median_factors = {q: mae_factor(network[q], actual[q]) for q in MEDIANS}
        rms_factor = qlike_factor(np.maximum(network["range"], floor), actual["range"], floor)
        rms_levels = {name: qlike_factor(forecast["range_rms"], actual["range"], floor)
                      for name, forecast in sources.items()}
        serving = cls(floor=floor, median_factors=_lists(median_factors), rms_factor=rms_factor.tolist(),
                      rms_levels=_lists(rms_levels), weights={}, rms_weights={}, normaliser=normaliser,
                      margin=np.asarray(margin, np.float64).tolist())
        own, levelled = serving.network_on_level(network), serving.sources_on_level(sources)
        names = ["network", *levelled]
        weights = {q: dict(zip(names, combination_weights([own[q], *(f[q] for f in levelled.values())], actual[q])))
                   for q in MEDIANS}
        chosen = combination_weights([own["range_rms"], *(f["range_rms"] for f in levelled.values())],
                                     actual["range"], loss=_qlike_by_step(floor))
        return serving.model_copy(update={"weights": {q: _lists(w) for q, w in weights.items()},
                                          "rms_weights": _lists(dict(zip(names, chosen)))})

    def network_on_level(self, network: Quantities) -> Quantities:
        """The network's high, low and range (medians) and its range's root mean square, put on their level."""
        return {**network, **{q: network[q] * np.asarray(self.median_factors[q]) for q in MEDIANS},
                "range_rms": np.maximum(network["range"], self.floor) * np.asarray(self.rms_factor)}

    def sources_on_level(self, sources: dict[str, Quantities]) -> dict[str, Quantities]:
        """Each source's forecasts, its root-mean-square range put on its level (its medians as fitted)."""
        return {name: {**forecast, "range_rms": forecast["range_rms"] * np.asarray(self.rms_levels[name])}
                for name, forecast in sources.items() if name in self.rms_levels}

    def served(self, network: Quantities, sources: dict[str, Quantities], margin: np.ndarray | None = None,
               volatility: np.ndarray | None = None) -> Quantities:
        """What users get, per sample and step (log units, the module's docstring), from the network's forecasts and
        the sources' (their medians and root-mean-square ranges, as fitted); the interval where the margin (default:
        the last one) and HAR's volatility forecast (normaliser's) are given."""
        own, levelled = self.network_on_level(network), self.sources_on_level(sources)
        served = {f"expected_{q}": _blend(self.weights[q], own[q], {n: f[q] for n, f in levelled.items()})
                  for q in MEDIANS}
        served["expected_range_rms"] = _blend(self.rms_weights, own["range_rms"],
                                              {n: f["range_rms"] for n, f in levelled.items()})
        if volatility is not None:
            low, high = widened(network["return"], network["return"],
                                np.asarray(self.margin if margin is None else margin), volatility)
            served |= {"interval_low": low, "interval_high": high}
        return served


def _blend(weights: dict[str, list[float]], network: np.ndarray, sources: dict[str, np.ndarray]) -> np.ndarray:
    """Σ weight x forecast, over the network and the sources the weights name."""
    total = np.asarray(weights["network"]) * network
    for name, weight in weights.items():
        if name != "network":
            total = total + np.asarray(weight) * sources[name]
    return total


def _qlike_by_step(floor: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The loss combination_weights minimises for a root-mean-square range: the mean QLIKE of each step."""
    return lambda forecast, actual: qlike_losses(forecast, actual, floor).mean(axis=0)


def _lists(by_name: dict[str, np.ndarray]) -> dict[str, list[float]]:
    return {name: np.asarray(values, np.float64).tolist() for name, values in by_name.items()}
