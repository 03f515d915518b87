"""Test-split predictions in price units -> metrics per head, next to the persistence baseline.

Persistence repeats the last input candle over the horizon; skill = 1 - MAE_model / MAE_persistence,
so a positive skill is a model that beats "nothing changes".
"""
from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from .config import HeadConfig, RunConfig
from .errors import JobError
from .windows import HeadTarget, Scaler, SplitWindows, Windows

Head = HeadConfig | HeadTarget  # anything with a name and the columns it predicts
# Inference (validation, test predictions) keeps no activations for gradients, so a large batch costs little
# memory and saves per-step dispatch: a job's validation passes take about half the time they take at batch 64.
INFERENCE_BATCH_SIZE = 1024


def predict_prices(model: keras.Model, split: SplitWindows, windows_or_scaler: Windows | Scaler,
                   heads: Sequence[Head], batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """Head -> predictions in price units, shaped like that head's targets in `split.y`."""
    scaler = windows_or_scaler.scaler if isinstance(windows_or_scaler, Windows) else windows_or_scaler
    return to_prices(predict_fixed_batches(model, split.x, batch_size), scaler, heads)


def predict_fixed_batches(model: keras.Model, x: np.ndarray,
                          batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """model outputs for `x`, fed in batches of one fixed size (the last one zero-padded).

    Each new input length would otherwise trace the predict function again (about 0.1 s a job on CPU);
    with one batch shape, one trace serves every job of the same model.
    """
    padded = np.concatenate([x, np.zeros(((-len(x)) % batch_size, *x.shape[1:]), dtype=x.dtype)])
    batches = [model.predict_on_batch(padded[i:i + batch_size]) for i in range(0, len(padded), batch_size)]
    return {name: np.concatenate([b[name] for b in batches])[:len(x)] for name in batches[0]}


def to_prices(outputs: dict[str, np.ndarray], scaler: Scaler, heads: Sequence[Head]) -> dict[str, np.ndarray]:
    """Scaled model outputs (head -> array, last axis = the head's columns) -> price units."""
    return {head.name: scaler.inverse(outputs[head.name], head.columns) for head in heads}


def evaluate(predicted: dict[str, np.ndarray], windows: Windows, cfg: RunConfig) -> dict:
    """Metrics on the test split, per head, for the model's predictions (`predict_prices` of the test
    split) and for persistence."""
    test = windows.test
    heads = {}
    for head in cfg.heads:
        actual = test.y_raw[head.name]
        last = test.last_inputs[head.name]  # (N, C)
        # (N, C) -> (N, 1, C) for per-step targets, so that it repeats over the horizon.
        persistence = np.broadcast_to(last.reshape(len(last), *[1] * (actual.ndim - 2), -1), actual.shape)
        close = head.columns.index("close") if "close" in head.columns else None
        last_close = last[:, close] if close is not None else None
        scores = {"model": metrics(predicted[head.name], actual, last_close, close),
                  "persistence": metrics(persistence, actual, last_close, close)}
        baseline_mae = scores["persistence"]["mae"]
        scores["skill"] = 1 - scores["model"]["mae"] / baseline_mae if baseline_mae > 0 else None
        heads[head.name] = scores
    return {"heads": heads, "n_test": len(test.x)}


def metrics(pred: np.ndarray, actual: np.ndarray, last_close: np.ndarray | None = None,
            close_index: int | None = None) -> dict[str, float | None]:
    """MAE, RMSE, MAPE (percent) and direction accuracy of `pred` against `actual`, in their own units.

    Arrays are (N, ..., C). Direction accuracy, given the last input close (N,) and the position of
    close on the last axis, is the share of samples and steps where sign(pred - last_close) equals
    sign(actual - last_close); None without them. MAPE is None where some actual value is 0.
    """
    if pred.shape != actual.shape:
        raise JobError(f"evaluation: predictions of shape {pred.shape} against targets of shape {actual.shape}")
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
