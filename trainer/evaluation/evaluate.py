"""Test-split predictions in price units -> metrics per head, next to baselines that mean something.

Persistence repeats the last input candle over the horizon; skill = 1 - MAE_model / MAE_persistence,
so a positive skill is a model that beats "nothing changes". Direction accuracy (did the close move the
way the model said?) is set beside the majority-class rate: the accuracy of always answering the most
frequent of up / down / flat in the test split (persistence would score the share of flat closes only).
The headline of a job is the close: its skill over every horizon step, per step too.
"""
from __future__ import annotations

from dataclasses import replace

import keras
import numpy as np

from ..data.settings import CANDLE
from ..data.windows import HeadTarget, Preprocessing, SplitWindows
from ..errors import JobError
from ..model.training import INFERENCE_BATCH_SIZE
from . import baselines
from .baselines import EXCURSIONS, Baselines, mae_factor, qlike_factor
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
)
from .settings import EvaluationConfig, IntervalConfig


def predict_prices(model: keras.Model, split: SplitWindows, preprocessing: Preprocessing,
                   batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """Head -> predictions in price units, shaped like that head's targets in `split.y`."""
    return preprocessing.to_prices(predict_fixed_batches(model, split.x, batch_size), split.last_close)


def predict_fixed_batches(model: keras.Model, x: np.ndarray | dict[str, np.ndarray],
                          batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """model outputs for `x` (an array, or a dict of arrays of one length: SplitWindows.x), fed in batches of one
    fixed size (the last one zero-padded).

    Each new input length would otherwise trace the predict function again (about 0.1 s a job on CPU);
    with one batch shape, one trace serves every job of the same model.
    """
    arrays = x if isinstance(x, dict) else {None: x}
    n = len(next(iter(arrays.values())))
    padded = {k: np.concatenate([v, np.zeros(((-n) % batch_size, *v.shape[1:]), dtype=v.dtype)])
              for k, v in arrays.items()}

    def batch(i: int):
        part = {k: v[i:i + batch_size] for k, v in padded.items()}
        return part if isinstance(x, dict) else part[None]

    batches = [model.predict_on_batch(batch(i)) for i in range(0, n + (-n) % batch_size, batch_size)]
    return {name: np.concatenate([b[name] for b in batches])[:n] for name in batches[0]}


SHRINK_GRID = np.linspace(0.0, 1.0, 21)


def choose_shrink(outputs: dict[str, np.ndarray], split: SplitWindows, preprocessing: Preprocessing) -> Preprocessing:
    """The preprocessing with each head's shrink factor (Preprocessing.shrunk) chosen on `split`, the
    validation split: the factor of SHRINK_GRID whose forecasts of the head's price levels (a candle's body:
    open and close) have the lowest MAE in price units - kept only where its gain over "no change" (factor 0)
    is significant (significant_gain), else 0: validation found no deviation from "no change" worth keeping.
    Heads without framed price levels, and quantile heads, keep 1."""
    factors = {}
    for head in preprocessing.heads:
        positions = preprocessing.head_positions(head)
        judged = [head.columns.index(c) for c in ("open", "close")] if head.candle else \
            [i for i, p in enumerate(positions) if preprocessing.framing.level[p] > 0]
        if not judged or head.quantiles:  # a quantile head's spread is its own: never shrunk
            continue
        actual = split.y_raw[head.name][..., judged]
        errors = np.stack([np.abs(preprocessing.head_prices(replace(head, shrink=float(factor)), outputs[head.name],
                                                            split.last_close)[..., judged] - actual)
                           .reshape(len(actual), -1).mean(axis=1) for factor in SHRINK_GRID])  # (factors, N)
        best = int(np.argmin(errors.mean(axis=1)))
        gain = errors[0] - errors[best]
        factors[head.name] = float(SHRINK_GRID[best]) if significant_gain(gain, preprocessing.horizon) else 0.0
    return preprocessing.with_shrink(factors)


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
             quantiles: dict[str, np.ndarray] | None = None) -> Evaluation:
    """Metrics on the test split, per head, for the model's predictions (`predict_prices` of the test
    split) and for persistence; and the job's headline (see headline()). `unshrunk`: the same predictions
    with every shrink factor 1 (the network's output as it is), whose close skill is reported beside.
    `quantiles`: every head's outputs in prices, a quantile head's (N, ..., Q, C) scored by quantile_scores."""
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
        heads[head.name] = HeadScores(
            model=model, persistence=baseline, skill=baselines.skill(model.mae, baseline.mae), shrink=head.shrink,
            close=close_of,
            quantiles=quantile_scores(quantiles[head.name], actual, head.quantiles)
            if head.quantiles and quantiles is not None else None,
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
        skill=baselines.skill(float(model_error.mean()), float(persistence_error.mean())),
        skill_by_step=[baselines.skill(float(m), float(p)) for m, p in zip(model_error.mean(axis=0),
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
                          pinball=[baselines.pinball(forecast[..., i, :], actual[..., 0, :], level)
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
POINT_BASELINES = {"high": ("no_change", "persistence", "ewma", "har_tod", "har_tod_level"),
                   "low": ("no_change", "persistence", "ewma", "har_tod", "har_tod_level"),
                   "range": ("persistence", "ewma", "har_tod", "har_tod_level")}  # no change's range 0 is no forecast
INTERVAL = 0.8  # the nominal coverage of the reported interval of the close's return
INTERVAL_LEVELS = (0.1, 0.9)  # the quantiles of the baselines' intervals of that coverage
INTERVAL_NORMALISER = "har_ewma"  # the volatility forecast the conformal residuals are divided by (baselines)
COMBINED = ("high", "low", "range")  # the quantities forecast as the network's combined with HAR's


def candle_head(preprocessing: Preprocessing) -> HeadTarget | None:
    """The first head that forecasts the high, the low and the close (the candles candle_scores judges)."""
    return next((h for h in preprocessing.heads if {"high", "low", "close"} <= set(h.columns)), None)


def candle_scores(head: HeadTarget, test_prices: np.ndarray, test: SplitWindows, val_prices: np.ndarray,
                  val: SplitWindows, fitted: Baselines, settings: EvaluationConfig,
                  range_rms: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[CandleScores, dict[str, np.ndarray]]:
    """A candle head's forecasts of the high excursion ln(high / C), the low excursion ln(C / low) and the log
    range ln(high / low) (C: the last close) next to the baselines of each (MAE skill; for the range QLIKE skill
    too, of its root-mean-square forecast vs HAR's, at the next candle and for the mean range over the steps), and
    the 80 % interval of the close's return: the head's close widened by conformal margins as settings.interval
    says - adaptive conformal inference over the test split starting from the validation split's residuals, or
    split conformal on the validation split -, the residuals normalised by INTERVAL_NORMALISER (its coverage
    overall and by tercile of that volatility, its pinball loss next to the static and EWMA-scaled quantiles').
    `*_prices`: the head's price forecasts (N, steps, C) of the test and validation samples. `range_rms`: a HAR
    head's range output (test, validation), its root-mean-square range forecasts (N, steps)
    (Preprocessing.range_forecast).

    What users get (the scores, and the forecasts served: `served`) is the network's combined with HAR + time of
    day's (combine_with_har), its weight chosen on validation; the network's own scores are kept beside ("network",
    "network_skill"). -> the scores, and per test sample and step what users get (log units): "expected_high",
    "expected_low" (the excursions' medians), "expected_range" (the range's median, what MAE scores),
    "expected_range_rms" (what QLIKE scores), "interval_low", "interval_high" (the 80 % interval of the return),
    and the network's own range beside its candles: "network_range" (median), "network_range_rms"."""
    steps = test_prices.reshape(len(test_prices), -1, len(head.columns)).shape[1]
    actual = {q: v[:, :steps] for q, v in fitted.actual(test.first_target_rows).items()}
    val_actual = {q: v[:, :steps] for q, v in fitted.actual(val.first_target_rows).items()}
    forecasts = {name: {q: v[:, :steps] for q, v in by_quantity.items()}
                 for name, by_quantity in fitted.forecast(test.first_target_rows).items()}
    val_har_rms = fitted.forecast(val.first_target_rows)["har_tod_rms"]["range"][:, :steps]
    network, val_network = _quantities(head, test_prices, test), _quantities(head, val_prices, val)
    rms, val_rms, factors = _range_medians(network, val_network, val_actual, fitted.floor, range_rms)
    weights, model = combine_with_har(network, val_network, forecasts["har_tod"], fitted, val)
    served_rms = weights["range"] * rms + (1 - weights["range"]) * forecasts["har_tod_rms"]["range"]
    rms_of = {"model": served_rms, "network": rms, "har_tod_rms": forecasts["har_tod_rms"]["range"]}
    qlikes = {name: {"qlike": baselines.qlike(f[:, 0], actual["range"][:, 0], fitted.floor),
                     "qlike_horizon": baselines.qlike(f, actual["range"], fitted.floor)}
              for name, f in {**rms_of, "har_tod_level_rms": forecasts["har_tod_level_rms"]["range"]}.items()}
    scores = {}
    for quantity, names in POINT_BASELINES.items():
        own = baselines.point_scores(model[quantity], actual[quantity], quantity, fitted.floor)
        alone = baselines.point_scores(network[quantity], actual[quantity], quantity, fitted.floor)
        of = {name: baselines.point_scores(forecasts[name][quantity], actual[quantity], quantity, fitted.floor)
              for name in names}
        qlike_skill = network_qlike_skill = network_qlike_skill_level = None
        if quantity == "range":  # QLIKE scores the root-mean-square range, MAE the median
            own, alone = own.model_copy(update=qlikes["model"]), alone.model_copy(update=qlikes["network"])
            qlike_skill = baselines.skill(own.qlike, qlikes["har_tod_rms"]["qlike"])
            network_qlike_skill = baselines.skill(alone.qlike, qlikes["har_tod_rms"]["qlike"])
            network_qlike_skill_level = baselines.skill(alone.qlike, qlikes["har_tod_level_rms"]["qlike"])
        scores[quantity] = QuantityScores(
            **own.model_dump(), baselines=of,
            skill={name: baselines.skill(own.mae, b.mae) for name, b in of.items()},
            skill_horizon={name: baselines.skill(own.mae_horizon, b.mae_horizon) for name, b in of.items()},
            qlike_skill=qlike_skill, network=alone,
            network_skill={name: baselines.skill(alone.mae, b.mae) for name, b in of.items()},
            network_qlike_skill=network_qlike_skill, network_qlike_skill_level=network_qlike_skill_level,
            network_weight=weights[quantity].tolist() if quantity in weights else None)
    mean_range = None
    if steps > 1:
        val_rms_of = {"model": weights["range"] * val_rms + (1 - weights["range"]) * val_har_rms, "network": val_rms,
                      "har_tod_rms": val_har_rms}
        mean = {name: _mean_range_qlike(f, val_rms_of[name], actual["range"], val_actual["range"], fitted.floor)
                for name, f in rms_of.items()}
        mean_range = MeanRangeScores(steps=steps, qlike=mean["model"], network_qlike=mean["network"],
                                     har_qlike=mean["har_tod_rms"],
                                     qlike_skill=baselines.skill(mean["model"], mean["har_tod_rms"]),
                                     network_qlike_skill=baselines.skill(mean["network"], mean["har_tod_rms"]))
    interval, (lower, upper) = _interval_scores(network["return"], val_network["return"], actual["return"], test,
                                                val, fitted, settings.interval)
    served = {"expected_high": model["high"], "expected_low": model["low"], "expected_range": model["range"],
              "expected_range_rms": served_rms, "interval_low": lower, "interval_high": upper,
              "network_range": network["range"], "network_range_rms": rms}
    return CandleScores(head=head.name, steps=steps, **scores, mean_range=mean_range, interval=interval,
                        **factors), served


def _range_medians(network: dict[str, np.ndarray], val_network: dict[str, np.ndarray],
                   val_actual: dict[str, np.ndarray], floor: float, range_rms: tuple[np.ndarray, np.ndarray] | None
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, list | dict | None]]:
    """The network's range as two forecasts: its median (what MAE scores), put in network["range"] and
    val_network["range"], and its root mean square (what QLIKE scores), returned (test, validation). Each is the
    network's forecast times the per-step factor that scores best on validation, as the network's other choices
    (its epoch, the close's shrink) are made there; HAR + time of day, the bar, stays as fitted on the train split
    (har_tod_level, the stricter bar, is HAR put on its level so). A HAR head forecasts the root mean square
    (range_rms): that times qlike_factor is the root mean square, and that times mae_factor its median; its high
    and low excursions, one correction of the volatility away from the range's, are put on their own medians the
    same way (in network and val_network). A free candle's range is a median: its root mean square is that times
    qlike_factor. -> also the factors as CandleScores keeps them: range_rms_ratio (root mean square / median),
    and a HAR head's range_rms_factor and excursion_factors."""
    if range_rms is None:
        median, val_median = (np.maximum(n["range"], floor) for n in (network, val_network))
        factor = qlike_factor(val_median, val_actual["range"], floor)
        return median * factor, val_median * factor, {"range_rms_ratio": factor.tolist()}
    calibration = qlike_factor(range_rms[1], val_actual["range"], floor)
    rms, val_rms = (r * calibration for r in range_rms)
    factors = {"range": mae_factor(val_rms, val_actual["range"]),
               **{q: mae_factor(val_network[q], val_actual[q]) for q in EXCURSIONS}}
    for q in EXCURSIONS:
        network[q], val_network[q] = network[q] * factors[q], val_network[q] * factors[q]
    network["range"], val_network["range"] = rms * factors["range"], val_rms * factors["range"]
    return rms, val_rms, {"range_rms_ratio": (1 / factors["range"]).tolist(),
                          "range_rms_factor": calibration.tolist(),
                          "excursion_factors": {q: factors[q].tolist() for q in EXCURSIONS}}


def _mean_range_qlike(forecast: np.ndarray, val_forecast: np.ndarray, actual: np.ndarray, val_actual: np.ndarray,
                      floor: float) -> float | None:
    """QLIKE of the mean range over the steps forecast as the mean of the steps' root-mean-square ranges, times
    the factor that minimises its QLIKE on validation (the root mean square of a mean is not the mean of the
    root mean squares); every forecast scored so gets the same treatment."""
    mean, val_mean = np.maximum(actual.mean(axis=1), floor), np.maximum(val_actual.mean(axis=1), floor)
    factor = qlike_factor(val_forecast.mean(axis=1, keepdims=True), val_mean[:, None], floor)[0]
    return baselines.qlike(forecast.mean(axis=1) * factor, mean, floor)


def combine_with_har(network: dict[str, np.ndarray], val_network: dict[str, np.ndarray], har: dict[str, np.ndarray],
                     fitted: Baselines, val: SplitWindows) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The high and low excursions and the range as w x the network's + (1 - w) x HAR + time of day's, w per
    quantity and step chosen on validation (baselines.combination_weights; 0: the network adds nothing to HAR
    there), like the close's shrink toward no change. Each is a median forecast of its own: the range's is not
    the high's plus the low's (the median of a sum is not the sum of the medians). -> (weights per quantity
    (H,), the combined quantities of the test samples). `har`: HAR's forecasts of the test samples."""
    steps = network["range"].shape[1]
    val_har = {q: v[:, :steps] for q, v in fitted.forecast(val.first_target_rows)["har_tod"].items()}
    val_actual = {q: v[:, :steps] for q, v in fitted.actual(val.first_target_rows).items()}
    weights = {q: baselines.combination_weights(val_network[q], val_har[q], val_actual[q]) for q in COMBINED}
    return weights, {**network, **{q: weights[q] * network[q] + (1 - weights[q]) * har[q] for q in COMBINED}}


def _quantities(head: HeadTarget, prices: np.ndarray, split: SplitWindows) -> dict[str, np.ndarray]:
    candles = prices.reshape(len(prices), -1, len(head.columns))
    high, low, close = (candles[..., head.columns.index(c)] for c in ("high", "low", "close"))
    return baselines.quantities(high, low, close, split.last_close)


def _interval_scores(model: np.ndarray, val_model: np.ndarray, actual: np.ndarray, test: SplitWindows,
                     val: SplitWindows, fitted: Baselines,
                     settings: IntervalConfig) -> tuple[IntervalScores, tuple[np.ndarray, np.ndarray]]:
    """The interval's scores, and its bounds of the return (N, steps) of the test samples."""
    steps = model.shape[1]
    scale = fitted.volatility(test.first_target_rows)[INTERVAL_NORMALISER][:, :steps]
    val_scale = fitted.volatility(val.first_target_rows)[INTERVAL_NORMALISER][:, :steps]
    val_actual = fitted.actual(val.first_target_rows)["return"][:, :steps]
    if settings.method == "split":
        conformal = baselines.calibrate(val_model, val_model, val_actual, val_scale, INTERVAL)
        margin, adaptive = conformal.margin, {}
    else:
        conformal = baselines.adapt(baselines.conformity(val_model, val_model, val_actual, val_scale),
                                    baselines.conformity(model, model, actual, scale), test.first_target_rows,
                                    INTERVAL, settings.gamma)
        margin, adaptive = conformal.end_margin, {"gamma": settings.gamma, "level": conformal.level.tolist()}
    lower, upper = conformal.interval(model, model, scale)
    bounds = {}
    quantiles = fitted.quantiles(test.first_target_rows)
    for name in ("static", "ewma_scaled"):
        at = [fitted.levels.index(level) for level in INTERVAL_LEVELS]
        bounds[name] = tuple(quantiles[name]["return"][i, :, :steps] for i in at)

    def scored(low: np.ndarray, high: np.ndarray) -> IntervalCoverage:
        covered = baselines.coverage(low[:, 0], high[:, 0], actual[:, 0], scale[:, 0])
        return IntervalCoverage(coverage=covered.overall, coverage_by_tercile=covered.terciles,
                                coverage_horizon=float(np.mean((actual >= low) & (actual <= high))),
                                pinball=float(np.mean([baselines.pinball(b[:, 0], actual[:, 0], level)
                                                       for b, level in zip((low, high), INTERVAL_LEVELS)])))

    model_scores, of = scored(lower, upper), {name: scored(*pair) for name, pair in bounds.items() if name != "model"}
    return IntervalScores(**model_scores.model_dump(), nominal=INTERVAL, normaliser=INTERVAL_NORMALISER,
                          margin=margin.tolist(), baselines=of,
                          pinball_skill={name: baselines.skill(model_scores.pinball, b.pinball)
                                         for name, b in of.items()},
                          method=settings.method, **adaptive), (lower, upper)
