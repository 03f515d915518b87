"""Test-split predictions in price units -> metrics per head, next to baselines that mean something.

Persistence repeats the last input candle over the horizon; skill = 1 - MAE_model / MAE_persistence,
so a positive skill is a model that beats "nothing changes". Direction accuracy (did the close move the
way the model said?) is set beside the majority-class rate: the accuracy of always answering the most
frequent of up / down / flat in the test split (persistence would score the share of flat closes only).
The headline of a job is the close: its skill over every horizon step, per step too.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..data.windows import HeadTarget, Preprocessing, SplitWindows
from ..errors import JobError
from ..heads import CANDLE
from . import scores as score
from .baselines import Baseline, Baselines, qlike_factor
from .intervals import Conformal, Forecasts, Intervals
from .results import (
    CandleScores,
    CloseScores,
    Evaluation,
    Headline,
    HeadScores,
    IntervalCoverage,
    IntervalScores,
    MeanRangeScores,
    QuantileScores,
    QuantityScores,
    Scores,
    ValidationSkill,
)
from .serving import SOURCES, Serving
from .settings import EvaluationConfig

SHRINK_GRID = np.linspace(0.0, 1.0, 21).round(2)


def choose_shrink(outputs: dict[str, np.ndarray],
                  split: SplitWindows, preprocessing: Preprocessing) -> tuple[Preprocessing, dict[str, float | None]]:
    """The preprocessing with each head's shrink factor (Preprocessing.shrunk: its mix of the network and the head's
    own persistence) chosen on `split`, the validation split: the factor of SHRINK_GRID whose forecasts of the
    head's judged columns (Head.judged: every column; a candle's body, open and close) have the lowest MAE in their
    raw units - kept only where its gain over the head's persistence (factor 0: each column's last value; a candle's
    body at the last close) is significant (significant_gain), else 0: validation found the network no better than
    repeating the last value. -> that preprocessing, and per head the validation gain of the best factor: 1 - its
    MAE / persistence's (None where persistence was exact)."""
    factors, gains = {}, {}
    for head in preprocessing.heads:
        errors = shrink_errors(outputs, split, preprocessing, head)
        best = int(np.argmin(errors.mean(axis=1)))
        gain = errors[0] - errors[best]
        factors[head.name] = float(SHRINK_GRID[best]) if significant_gain(gain, preprocessing.horizon) else 0.0
        gains[head.name] = score.skill(float(errors[best].mean()), float(errors[0].mean()))
    return preprocessing.with_shrink(factors), gains


def shrink_errors(outputs: dict[str, np.ndarray], split: SplitWindows, preprocessing: Preprocessing,
                  head: HeadTarget) -> np.ndarray:
    """(factors, N): each factor of SHRINK_GRID's absolute error of the head's judged columns on each sample of
    `split`, in their raw units (the mean over those columns and the steps)."""
    judged = head.spec.judged()
    actual = split.y_raw[head.name][..., judged]
    return np.stack([np.abs(preprocessing.head_prices(replace(head, shrink=float(factor)), outputs[head.name],
                                                      split.last)[..., judged] - actual)
                     .reshape(len(actual), -1).mean(axis=1) for factor in SHRINK_GRID])


def significant_gain(gain: np.ndarray, block: int) -> bool:
    """Whether per-sample gains (N,) in time order are positive beyond chance and not in one stretch only: their
    mean at least two standard errors above 0, the errors of means over blocks of `block` consecutive samples
    (samples whose horizons overlap are not independent; blocks of a horizon's length nearly are), and positive
    in each half (a gain made in one episode of the validation split is not one to expect on the next)."""
    blocks = gain[:len(gain) // block * block].reshape(-1, block).mean(axis=1)
    if len(blocks) < 2 or not blocks.mean() > 0 or not all(half.mean() > 0 for half in np.array_split(blocks, 2)):
        return False
    return bool(blocks.mean() >= 2 * blocks.std(ddof=1) / np.sqrt(len(blocks)))


def evaluate(predicted: dict[str, np.ndarray], test: SplitWindows, preprocessing: Preprocessing,
             unshrunk: dict[str, np.ndarray] | None = None,
             outputs: dict[str, np.ndarray] | None = None,
             validation_gains: dict[str, float | None] | None = None) -> Evaluation:
    """Metrics on the test split, per head, for the model's predictions (`predict_prices` of the test
    split) and for persistence; and the job's headline (see headline()). `unshrunk`: the same predictions
    with every shrink factor 1 (the network's output as it is), whose skill (and the close's) is reported beside.
    `outputs`: every head's outputs in prices, whose quantile forecasts (Head.quantile_forecasts: a quantile head's
    (N, ..., Q, C)) quantile_scores scores. `validation_gains`: choose_shrink's, kept beside each head's factor."""
    heads = {}
    for head in preprocessing.heads:
        actual = test.y_raw[head.name]
        last = test.last_inputs[head.name]  # (N, C)
        # (N, C) -> (N, 1, C) for per-step targets, so that it repeats over the horizon.
        persistence = np.broadcast_to(last.reshape(len(last), *[1] * (actual.ndim - 2), -1), actual.shape)
        close = head.columns.index("close") if "close" in head.columns else None
        last_close = last[:, close] if close is not None else None
        model = metrics(predicted[head.name], actual, last_close, close)
        baseline = metrics(persistence, actual)
        close_of = None
        if close is not None:
            close_of = close_scores(predicted[head.name][..., close], actual[..., close], last_close)
            if unshrunk is not None:
                close_of = close_of.model_copy(update={"skill_unshrunk": close_scores(
                    unshrunk[head.name][..., close], actual[..., close], last_close).skill})
        quantiles = None if outputs is None else head.spec.quantile_forecasts(outputs[head.name])
        heads[head.name] = HeadScores(
            model=model, persistence=baseline, skill=score.skill(model.mae, baseline.mae), shrink=head.shrink,
            validation_gain=(validation_gains or {}).get(head.name),
            skill_unshrunk=None if unshrunk is None else
            score.skill(metrics(unshrunk[head.name], actual).mae, baseline.mae),
            close=close_of,
            quantiles=None if quantiles is None else quantile_scores(quantiles[1], actual, quantiles[0]),
            inconsistent_candles={"model": inconsistent_share(predicted[head.name], head),
                                  "actual": inconsistent_share(actual, head)}
            if set(CANDLE) <= set(head.columns) else None)
    return Evaluation(heads=heads, headline=headline(heads, preprocessing.heads), n_test=len(test))


def headline(heads: dict[str, HeadScores], order: tuple[HeadTarget, ...]) -> Headline:
    """What a job is judged by: the close of the first head that predicts it (its skill over every step,
    direction accuracy next to the majority-class rate), else the first head's skill over its columns."""
    name = next((h.name for h in order if heads[h.name].close is not None), None)
    if name is None:
        scores = heads[order[0].name]
        return Headline(head=order[0].name, shrink=scores.shrink, skill=scores.skill, mae=scores.model.mae,
                        persistence_mae=scores.persistence.mae)
    close = heads[name].close
    return Headline(head=name, column="close", shrink=heads[name].shrink, skill=close.skill, mae=close.mae,
                    persistence_mae=close.persistence_mae, direction_accuracy=close.direction_accuracy,
                    majority_rate=close.majority_rate)


def close_scores(pred: np.ndarray, actual: np.ndarray, last_close: np.ndarray) -> CloseScores:
    """The close against persistence (the last close), over every horizon step and per step; direction
    accuracy next to the rates of up / down moves and the majority-class rate. Arrays (N,) or (N, horizon)."""
    pred, actual = pred.reshape(len(pred), -1), actual.reshape(len(actual), -1)  # (N, steps)
    last = last_close[:, None]
    model_error, persistence_error = np.abs(pred - actual), np.abs(last - actual)
    moves = np.sign(actual - last)
    up, down = float(np.mean(moves > 0)), float(np.mean(moves < 0))
    return CloseScores(
        mae=float(model_error.mean()), persistence_mae=float(persistence_error.mean()),
        skill=score.skill(float(model_error.mean()), float(persistence_error.mean())),
        skill_by_step=[score.skill(float(m), float(p)) for m, p in zip(model_error.mean(axis=0),
                                                                 persistence_error.mean(axis=0))],
        direction_accuracy=float(np.mean(np.sign(pred - last) == moves)),
        up_move_rate=up, down_move_rate=down, majority_rate=max(up, down, 1 - up - down))


def quantile_scores(forecast: np.ndarray, actual: np.ndarray, levels: tuple[float, ...]) -> QuantileScores:
    """A quantile head's forecasts (N, ..., Q, C) in prices against the actual values (N, ..., C): the pinball
    loss of each level (price units, every step and column), how often each level was above the actual value
    (its level, when calibrated), and the share inside the outermost pair (their nominal coverage beside)."""
    actual = actual[..., None, :]
    below = np.mean(actual <= forecast, axis=tuple(i for i in range(forecast.ndim) if i != forecast.ndim - 2))
    inside = (actual[..., 0, :] >= forecast[..., 0, :]) & (actual[..., 0, :] <= forecast[..., -1, :])
    return QuantileScores(levels=list(levels),
                          pinball=[score.pinball(forecast[..., i, :], actual[..., 0, :], level)
                                   for i, level in enumerate(levels)],
                          below=below.tolist(), coverage=float(inside.mean()), nominal=levels[-1] - levels[0])


def inconsistent_share(candles: np.ndarray, head: HeadTarget) -> float:
    """The share of candles (samples x steps) with high < max(open, close) or low > min(open, close)."""
    o, h, low, c = (candles[..., head.columns.index(column)] for column in CANDLE)
    return float(np.mean((h < np.maximum(o, c)) | (low > np.minimum(o, c))))


def metrics(pred: np.ndarray, actual: np.ndarray, last_close: np.ndarray | None = None,
            close_index: int | None = None) -> Scores:
    """MAE, RMSE, MAPE (percent) and direction accuracy of `pred` against `actual`, in their own units.

    Arrays are (N, ..., C). Direction accuracy, given the last input close (N,) and the position of
    close on the last axis, is the share of samples and steps where sign(pred - last_close) equals
    sign(actual - last_close); None without them. MAPE is None where some actual value is 0.
    """
    if pred.shape != actual.shape:
        raise JobError(f"evaluation: predictions of shape {pred.shape} against targets of shape {actual.shape}")
    if not np.isfinite(pred).all():
        raise JobError("evaluation: the model's test predictions are not all finite (in price units)")
    direction = None
    if last_close is not None:
        if close_index is None:
            raise ValueError("metrics: last_close needs close_index, the position of close on the last axis")
        reference = last_close.reshape(len(last_close), *[1] * (pred.ndim - 2))
        same_sign = np.sign(pred[..., close_index] - reference) == np.sign(actual[..., close_index] - reference)
        direction = float(np.mean(same_sign))
    error = pred - actual
    return Scores(mae=float(np.mean(np.abs(error))), rmse=float(np.sqrt(np.mean(error**2))),
                  mape=float(np.mean(np.abs(error / actual)) * 100) if np.all(actual != 0) else None,
                  direction_accuracy=direction)


# ----------------------------------------------------------------------------- the size of the coming candles
# Compared at the next candle (and over the horizon) with the baselines that fit each quantity.
# HAR-X (HAR + time of day with the network's extra inputs, linear) where the job's frame has them
_RANGE_BASELINES = (Baseline.PERSISTENCE, Baseline.EWMA, Baseline.HAR_TOD, Baseline.HAR_TOD_LEVEL, Baseline.HARX_LEVEL)
POINT_BASELINES = {"high": (Baseline.NO_CHANGE, *_RANGE_BASELINES), "low": (Baseline.NO_CHANGE, *_RANGE_BASELINES),
                   "range": _RANGE_BASELINES}  # no change's range 0 is no forecast
# The root-mean-square range forecasts QLIKE scores, next to the network's: HAR's as fitted on train and on its level,
# HAR-X's on its level
RMS_BASELINES = (Baseline.HAR_TOD_RMS, Baseline.HAR_TOD_LEVEL_RMS, Baseline.HARX_LEVEL_RMS)
INTERVAL = 0.8  # the nominal coverage of the reported interval of the close's return
INTERVAL_LEVELS = (0.1, 0.9)  # the quantiles of the baselines' intervals of that coverage
INTERVAL_NORMALISER = "har_ewma"  # the volatility forecast the conformal residuals are divided by (baselines)
COMBINED = ("high", "low", "range")  # the quantities forecast as the network's combined with HAR's


def candle_head(preprocessing: Preprocessing) -> HeadTarget | None:
    """The first head that forecasts the high, the low and the close (the candles candle_scores judges)."""
    return next((h for h in preprocessing.heads if {"high", "low", "close"} <= set(h.columns)), None)


def candle_scores(head: HeadTarget, network: dict[str, np.ndarray], val_network: dict[str, np.ndarray],
                  test: SplitWindows, val: SplitWindows, fitted: Baselines,
                  settings: EvaluationConfig) -> tuple[CandleScores, dict[str, np.ndarray], Serving]:
    """A candle head's forecasts of the high excursion ln(high / C), the low excursion ln(C / low) and the log
    range ln(high / low) (C: the last close) next to the baselines of each (MAE skill; for the range QLIKE skill
    too, of its root-mean-square forecast, at the next candle and for the mean range over the steps), and the 80 %
    interval of the close's return: the head's close widened by conformal margins as settings.interval says (its
    coverage overall and by tercile of the volatility the residuals are normalised by, INTERVAL_NORMALISER; its
    pinball loss next to the static and EWMA-scaled quantiles'). `network`, `val_network`: the head's forecasts of
    the size of the coming candles on the test and validation samples (Preprocessing.candle_quantities): "high",
    "low", "range", "return", each (N, steps).

    What users get is what the job's Serving (fitted here on validation) serves: the network's forecasts put on their
    level there, blended with HAR-X's (where the job has it) and HAR + time of day's (evaluation.serving); its scores
    are the "model"'s, the network's own (on its level) beside ("network", "network_skill"). -> the scores; per test
    sample and step what users get (log units): "expected_high", "expected_low" (the excursions' medians),
    "expected_range" (the range's median, what MAE scores), "expected_range_rms" (what QLIKE scores), "interval_low",
    "interval_high" (the 80 % interval of the return), "interval_margin" (its margin, in units of the volatility it
    was normalised by: adaptive conformal's moves along the test split), and the network's own range beside its
    candles: "network_range" (median), "network_range_rms"; and the Serving."""
    steps = network["range"].shape[1]
    actual = {q: v[:, :steps] for q, v in fitted.actual(test.first_target_rows).items()}
    val_actual = {q: v[:, :steps] for q, v in fitted.actual(val.first_target_rows).items()}
    forecasts = {name: {q: v[:, :steps] for q, v in by_quantity.items()}
                 for name, by_quantity in fitted.forecast(test.first_target_rows).items()}
    val_forecasts = {name: {q: v[:, :steps] for q, v in by_quantity.items()}
                     for name, by_quantity in fitted.forecast(val.first_target_rows).items()}
    method = settings.interval.conformal(INTERVAL)
    scale = fitted.volatility(test.first_target_rows)[INTERVAL_NORMALISER][:, :steps]
    intervals = _conformal(network["return"], val_network["return"], actual["return"], scale, test, val, fitted,
                           method)
    serving = Serving.fit(val_network, served_sources(val_forecasts), val_actual, fitted.floor, INTERVAL_NORMALISER,
                          intervals.next_margin)
    served = serving.served(network, served_sources(forecasts), intervals.margin, scale)
    interval = _interval_scores(served["interval_low"], served["interval_high"], actual["return"], scale, intervals,
                                test, fitted, method)
    val_served = serving.served(val_network, served_sources(val_forecasts))
    model = {q: served[f"expected_{q}"] for q in COMBINED}
    network, val_network = serving.network_on_level(network), serving.network_on_level(val_network)
    rms_baselines = [name for name in RMS_BASELINES if name in forecasts]
    rms_of = {"model": served["expected_range_rms"], "network": network["range_rms"],
              **{name: forecasts[name]["range"] for name in rms_baselines}}
    qlikes = {name: {"qlike": score.qlike(f[:, 0], actual["range"][:, 0], fitted.floor),
                     "qlike_horizon": score.qlike(f, actual["range"], fitted.floor)} for name, f in rms_of.items()}
    scores = {}
    for quantity, names in POINT_BASELINES.items():
        names = [name for name in names if name in forecasts]
        own = score.point_scores(model[quantity], actual[quantity], quantity, fitted.floor)
        alone = score.point_scores(network[quantity], actual[quantity], quantity, fitted.floor)
        of = {name: score.point_scores(forecasts[name][quantity], actual[quantity], quantity, fitted.floor)
              for name in names}
        errors = {name: np.abs(f[quantity][:, 0] - actual[quantity][:, 0])
                  for name, f in {"network": network, **{name: forecasts[name] for name in names}}.items()}
        qlike_skill = {}
        if quantity == "range":  # QLIKE scores the root-mean-square range, MAE the median
            own, alone = own.model_copy(update=qlikes["model"]), alone.model_copy(update=qlikes["network"])
            losses = {name: score.qlike_losses(rms_of[name][:, 0], actual["range"][:, 0], fitted.floor)
                      for name in ("network", *rms_baselines)}
            qlike_skill = {"qlike_skill": {name: score.skill(own.qlike, qlikes[name]["qlike"])
                                           for name in rms_baselines},
                           "network_qlike_skill": {name: score.skill(alone.qlike, qlikes[name]["qlike"])
                                                   for name in rms_baselines},
                           "network_qlike_p": {name: score.diebold_mariano(losses["network"], losses[name])
                                               for name in rms_baselines},
                           "rms_weights": serving.rms_weights}
        weights = serving.weights[quantity]
        scores[quantity] = QuantityScores(
            **own.model_dump(), baselines=of,
            skill={name: score.skill(own.mae, b.mae) for name, b in of.items()},
            skill_horizon={name: score.skill(own.mae_horizon, b.mae_horizon) for name, b in of.items()},
            network=alone, network_skill={name: score.skill(alone.mae, b.mae) for name, b in of.items()},
            network_p={name: score.diebold_mariano(errors["network"], errors[name]) for name in of},
            network_weight=weights["network"], weights=weights, **qlike_skill)
    mean_range = None
    if steps > 1:
        val_rms_of = {"model": val_served["expected_range_rms"], "network": val_network["range_rms"],
                      Baseline.HAR_TOD_RMS: val_forecasts[Baseline.HAR_TOD_RMS]["range"]}
        mean = {name: _mean_range_qlike(rms_of[name], f, actual["range"], val_actual["range"], fitted.floor)
                for name, f in val_rms_of.items()}
        mean_range = MeanRangeScores(steps=steps, qlike=mean["model"], network_qlike=mean["network"],
                                     har_qlike=mean[Baseline.HAR_TOD_RMS],
                                     qlike_skill=score.skill(mean["model"], mean[Baseline.HAR_TOD_RMS]),
                                     network_qlike_skill=score.skill(mean["network"], mean[Baseline.HAR_TOD_RMS]))
    validation = _validation_skill(val_network, val_actual, val_forecasts, fitted.floor)
    served |= {"interval_margin": intervals.margin, "network_range": network["range"],
               "network_range_rms": network["range_rms"]}
    return CandleScores(head=head.name, steps=steps, **scores, mean_range=mean_range, interval=interval,
                        validation=validation), served, serving


def served_sources(forecasts: dict[Baseline, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    """The baselines' forecasts as Serving blends them (evaluation.serving.SOURCES): HAR-X's, where the job has it,
    and HAR + time of day's, each's medians ("high", "low", "range") with its root-mean-square range ("range_rms")."""
    return {str(name): {**forecasts[name], "range_rms": forecasts[RMS_OF[name]]["range"]}
            for name in map(Baseline, SOURCES) if name in forecasts}


def _validation_skill(network: dict[str, np.ndarray], actual: dict[str, np.ndarray],
                      har: dict[Baseline, dict[str, np.ndarray]], floor: float) -> ValidationSkill:
    """The network's forecasts of the next candle on validation, put on their level there, against HAR + time of day
    put on its own (results.ValidationSkill)."""
    bar, bar_rms = har[Baseline.HAR_TOD_LEVEL], har[Baseline.HAR_TOD_LEVEL_RMS]

    def mae(forecasts: dict[str, np.ndarray], quantity: str) -> float:
        return score.mae(forecasts[quantity][:, 0], actual[quantity][:, 0])

    return ValidationSkill(
        range_qlike=score.skill(score.qlike(network["range_rms"][:, 0], actual["range"][:, 0], floor),
                                score.qlike(bar_rms["range"][:, 0], actual["range"][:, 0], floor)),
        range_mae=score.skill(mae(network, "range"), mae(bar, "range")),
        high_low_mae=score.skill(mae(network, "high") + mae(network, "low"), mae(bar, "high") + mae(bar, "low")))


def _mean_range_qlike(forecast: np.ndarray, val_forecast: np.ndarray, actual: np.ndarray, val_actual: np.ndarray,
                      floor: float) -> float | None:
    """QLIKE of the mean range over the steps forecast as the mean of the steps' root-mean-square ranges, times
    the factor that minimises its QLIKE on validation (the root mean square of a mean is not the mean of the
    root mean squares); every forecast scored so gets the same treatment."""
    mean, val_mean = np.maximum(actual.mean(axis=1), floor), np.maximum(val_actual.mean(axis=1), floor)
    factor = qlike_factor(val_forecast.mean(axis=1, keepdims=True), val_mean[:, None], floor)[0]
    return score.qlike(forecast.mean(axis=1) * factor, mean, floor)


# Each served baseline's root-mean-square range (Serving blends them: served_sources)
RMS_OF = {Baseline.HARX: Baseline.HARX_RMS, Baseline.HAR_TOD: Baseline.HAR_TOD_RMS}


def _conformal(model: np.ndarray, val_model: np.ndarray, actual: np.ndarray, scale: np.ndarray, test: SplitWindows,
               val: SplitWindows, fitted: Baselines, method: Conformal) -> Intervals:
    """The method's margins (trainer.evaluation.intervals) around the network's close on the test samples,
    calibrated on the validation samples, the residuals in units of HAR's volatility forecast (INTERVAL_NORMALISER)."""
    steps = model.shape[1]
    val_scale = fitted.volatility(val.first_target_rows)[INTERVAL_NORMALISER][:, :steps]
    val_actual = fitted.actual(val.first_target_rows)["return"][:, :steps]
    return method.intervals(Forecasts(val_model, val_model, val_actual, val_scale, val.first_target_rows),
                            Forecasts(model, model, actual, scale, test.first_target_rows))


def _interval_scores(low: np.ndarray, high: np.ndarray, actual: np.ndarray, scale: np.ndarray, intervals: Intervals,
                     test: SplitWindows, fitted: Baselines, method: Conformal) -> IntervalScores:
    """The scores of the interval served on the test samples ([low, high] of the return: what Serving made of the
    method's margins) next to the static and EWMA-scaled quantiles' of the same coverage."""
    steps = low.shape[1]
    quantiles = fitted.quantile_forecasts(test.first_target_rows)
    at = [fitted.levels.index(level) for level in INTERVAL_LEVELS]
    bounds = {name: tuple(quantiles[name]["return"][i, :, :steps] for i in at) for name in ("static", "ewma_scaled")}

    def scored(low: np.ndarray, high: np.ndarray) -> IntervalCoverage:
        covered = score.coverage(low[:, 0], high[:, 0], actual[:, 0], scale[:, 0])
        return IntervalCoverage(coverage=covered.overall, coverage_by_tercile=covered.terciles,
                                coverage_horizon=float(np.mean((actual >= low) & (actual <= high))),
                                pinball=float(np.mean([score.pinball(b[:, 0], actual[:, 0], level)
                                                       for b, level in zip((low, high), INTERVAL_LEVELS)])))

    own, of = scored(low, high), {name: scored(*pair) for name, pair in bounds.items()}
    return IntervalScores(**own.model_dump(), nominal=INTERVAL, normaliser=INTERVAL_NORMALISER,
                          margin=intervals.next_margin.tolist(), baselines=of,
                          pinball_skill={name: score.skill(own.pinball, b.pinball) for name, b in of.items()},
                          level=None if intervals.level is None else intervals.level.tolist(),
                          **method.settings())
