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

from .config import CANDLE
from .errors import JobError
from .windows import HeadTarget, Preprocessing, SplitWindows

# Inference (validation, test predictions) keeps no activations for gradients, so a large batch costs little
# memory and saves per-step dispatch: a job's validation passes take about half the time they take at batch 64.
INFERENCE_BATCH_SIZE = 1024


def predict_prices(model: keras.Model, split: SplitWindows, preprocessing: Preprocessing,
                   batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """Head -> predictions in price units, shaped like that head's targets in `split.y`."""
    return preprocessing.to_prices(predict_fixed_batches(model, split.x, batch_size), split.last_close)


def predict_fixed_batches(model: keras.Model, x: np.ndarray,
                          batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """model outputs for `x`, fed in batches of one fixed size (the last one zero-padded).

    Each new input length would otherwise trace the predict function again (about 0.1 s a job on CPU);
    with one batch shape, one trace serves every job of the same model.
    """
    padded = np.concatenate([x, np.zeros(((-len(x)) % batch_size, *x.shape[1:]), dtype=x.dtype)])
    batches = [model.predict_on_batch(padded[i:i + batch_size]) for i in range(0, len(padded), batch_size)]
    return {name: np.concatenate([b[name] for b in batches])[:len(x)] for name in batches[0]}


SHRINK_GRID = np.linspace(0.0, 1.0, 21)


def choose_shrink(outputs: dict[str, np.ndarray], split: SplitWindows, preprocessing: Preprocessing) -> Preprocessing:
    """The preprocessing with each head's shrink factor (Preprocessing.shrunk) chosen on `split`, the
    validation split: the factor of SHRINK_GRID whose forecasts of the head's price levels (a candle's body:
    open and close) have the lowest MAE in price units. 0 where validation finds no deviation from "no
    change" worth keeping. Heads without framed price levels keep 1."""
    factors = {}
    for head in preprocessing.heads:
        positions = preprocessing.head_positions(head)
        judged = [head.columns.index(c) for c in ("open", "close")] if head.candle else \
            [i for i, p in enumerate(positions) if preprocessing.framing.level[p] > 0]
        if not judged:
            continue
        actual = split.y_raw[head.name][..., judged]
        errors = [np.mean(np.abs(preprocessing.head_prices(replace(head, shrink=float(factor)), outputs[head.name],
                                                           split.last_close)[..., judged] - actual))
                  for factor in SHRINK_GRID]
        factors[head.name] = float(SHRINK_GRID[int(np.argmin(errors))])
    return preprocessing.with_shrink(factors)


def evaluate(predicted: dict[str, np.ndarray], test: SplitWindows, preprocessing: Preprocessing,
             unshrunk: dict[str, np.ndarray] | None = None) -> dict:
    """Metrics on the test split, per head, for the model's predictions (`predict_prices` of the test
    split) and for persistence; and the job's headline (see headline()). `unshrunk`: the same predictions
    with every shrink factor 1 (the network's output as it is), whose close skill is reported beside."""
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
        scores = {"model": model, "persistence": baseline, "skill": skill(model["mae"], baseline["mae"])}
        scores["shrink"] = head.shrink
        if close is not None:
            scores["close"] = close_scores(predicted[head.name][..., close], actual[..., close], last_close)
            if unshrunk is not None:
                scores["close"]["skill_unshrunk"] = close_scores(unshrunk[head.name][..., close],
                                                                 actual[..., close], last_close)["skill"]
        if set(CANDLE) <= set(head.columns):
            scores["inconsistent_candles"] = {"model": inconsistent_share(predicted[head.name], head),
                                              "actual": inconsistent_share(actual, head)}
        heads[head.name] = scores
    return {"heads": heads, "headline": headline(heads, preprocessing.heads), "n_test": len(test)}


def headline(heads: dict[str, dict], order: tuple[HeadTarget, ...]) -> dict:
    """What a job is judged by: the close of the first head that predicts it (its skill over every step,
    direction accuracy next to the majority-class rate), else the first head's skill over its columns."""
    with_close = [h.name for h in order if "close" in heads[h.name]]
    if not with_close:
        name = order[0].name
        scores = heads[name]
        return {"head": name, "column": None, "shrink": scores["shrink"], "skill": scores["skill"],
                "mae": scores["model"]["mae"], "persistence_mae": scores["persistence"]["mae"],
                "direction_accuracy": None, "majority_rate": None}
    name = with_close[0]
    close = heads[name]["close"]
    return {"head": name, "column": "close", "shrink": heads[name]["shrink"],
            **{k: close[k] for k in ("skill", "mae", "persistence_mae", "direction_accuracy", "majority_rate")}}


def skill(mae: float, persistence_mae: float) -> float | None:
    """1 - MAE / MAE of persistence; None where persistence is exact (nothing moved)."""
    return 1 - mae / persistence_mae if persistence_mae > 0 else None


def close_scores(pred: np.ndarray, actual: np.ndarray, last_close: np.ndarray) -> dict:
    """The close against persistence (the last close), over every horizon step and per step; direction
    accuracy next to the rates of up / down moves and the majority-class rate. Arrays (N,) or (N, horizon)."""
    pred, actual = pred.reshape(len(pred), -1), actual.reshape(len(actual), -1)  # (N, steps)
    last = last_close[:, None]
    model_error, persistence_error = np.abs(pred - actual), np.abs(last - actual)
    moves = np.sign(actual - last)
    rates = {"up_move_rate": float(np.mean(moves > 0)), "down_move_rate": float(np.mean(moves < 0))}
    return {
        "mae": float(model_error.mean()), "persistence_mae": float(persistence_error.mean()),
        "skill": skill(float(model_error.mean()), float(persistence_error.mean())),
        "skill_by_step": [skill(float(m), float(p)) for m, p in zip(model_error.mean(axis=0),
                                                                    persistence_error.mean(axis=0))],
        "direction_accuracy": float(np.mean(np.sign(pred - last) == moves)),
        **rates, "majority_rate": max(*rates.values(), 1 - sum(rates.values())),
    }


def inconsistent_share(candles: np.ndarray, head: HeadTarget) -> float:
    """The share of candles (samples x steps) with high < max(open, close) or low > min(open, close)."""
    o, h, low, c = (candles[..., head.columns.index(column)] for column in CANDLE)
    return float(np.mean((h < np.maximum(o, c)) | (low > np.minimum(o, c))))


def metrics(pred: np.ndarray, actual: np.ndarray, last_close: np.ndarray | None = None,
            close_index: int | None = None) -> dict[str, float | None]:
    """MAE, RMSE, MAPE (percent) and direction accuracy of `pred` against `actual`, in their own units.

    Arrays are (N, ..., C). Direction accuracy, given the last input close (N,) and the position of
    close on the last axis, is the share of samples and steps where sign(pred - last_close) equals
    sign(actual - last_close); None without them. MAPE is None where some actual value is 0.
    """
    if pred.shape != actual.shape:
        raise JobError(f"evaluation: predictions of shape {pred.shape} against targets of shape {actual.shape}")
    if not np.isfinite(pred).all():
        raise JobError("evaluation: the model's test predictions are not all finite (in price units)")
    error = pred - actual
    result = {
        "mae": float(np.mean(np.abs(error))),
        "rmse": float(np.sqrt(np.mean(error**2))),
        "mape": float(np.mean(np.abs(error / actual)) * 100) if np.all(actual != 0) else None,
        "direction_accuracy": None,
    }
    if last_close is not None:
        if close_index is None:
            raise ValueError("metrics: last_close needs close_index, the position of close on the last axis")
        reference = last_close.reshape(len(last_close), *[1] * (pred.ndim - 2))
        same_sign = np.sign(pred[..., close_index] - reference) == np.sign(actual[..., close_index] - reference)
        result["direction_accuracy"] = float(np.mean(same_sign))
    return result
