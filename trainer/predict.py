"""Forecast the next candles from a trained job, local or published on the Hub.

A job directory is self-describing: config.yaml says which features to compute, preprocessing.json
how to scale them and which columns each head predicts. The forecast follows the last candle given.
"""
from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import yaml

from .artifacts import MANIFEST, STAGING_PREFIX, headline, jobs_dir, verify
from .config import FeaturesConfig, TrainConfig, load_config
from .data import load_candles, read_candles_file
from .data.validate import timeframe_delta
from .device import setup
from .errors import UserError
from .features import compute_features
from .windows import Preprocessing

PREPROCESSING = "preprocessing.json"


def predict_command(model_ref: str, symbol: str | None, timeframe: str | None, data_path: Path | None,
                    config_path: str | None, as_json: bool) -> None:
    """`cryptotrain predict`: print the forecast as a table, or as JSON."""
    if _is_hub_repo(model_ref) and symbol and timeframe:
        model_ref = f"{model_ref.rstrip('/')}/{symbol}/{timeframe}"
    job_dir = resolve_job_dir(model_ref, symbol, timeframe)
    if verify(job_dir) is None:
        raise UserError(f"{model_ref}: its files do not match {MANIFEST} (incomplete or changed); train the job again")
    prep = _preprocessing(job_dir)
    for given, own, option in ((symbol, prep["symbol"], "--symbol"), (timeframe, prep["timeframe"], "--timeframe")):
        if given is not None and given != own:
            raise UserError(f"{option} {given}: the model {model_ref} is for {prep['symbol']} {prep['timeframe']}")
    candles = _candles(job_dir, prep, data_path, config_path)
    forecast = predict_next(job_dir, candles)
    last = candles.index[-1]
    record = track_record(job_dir)
    if as_json:
        print(json.dumps({
            "symbol": prep["symbol"], "timeframe": prep["timeframe"], "model": model_ref,
            "last_candle": last.isoformat(), "source": candles.attrs.get("source"),
            "synthetic": bool(candles.attrs.get("synthetic")),
            "test_skill": record,
            "forecast": [{"timestamp": t.isoformat(), **row} for t, row in zip(forecast.index,
                                                                               forecast.to_dict("records"))],
        }, indent=1))
    else:
        synthetic = " (SYNTHETIC candles: a demonstration, not a market)" if candles.attrs.get("synthetic") else ""
        _print_table(forecast, f"{prep['symbol']} {prep['timeframe']}: the next {len(forecast)} candle(s) after "
                               f"{last:%Y-%m-%d %H:%M} UTC, from {candles.attrs.get('source')}{synthetic}")
        print(_track_record_text(record))


def track_record(job_dir: Path) -> dict:
    """How this job's model did on its held-out test split (metrics.json's headline), and whether it was
    worse than persistence: what a forecast is worth."""
    metrics = json.loads((job_dir / "metrics.json").read_text())
    line = headline(metrics)
    return {"head": line["head"], "column": line["column"], "skill": line["skill"], "mae": line["mae"],
            "persistence_mae": line["persistence_mae"], "test_range": metrics["test_range"],
            "worse_than_persistence": line["skill"] is not None and line["skill"] < 0}


def _track_record_text(record: dict) -> str:
    what = f"{record['head']}.{record['column']}" if record["column"] else record["head"]
    skill = "n/a" if record["skill"] is None else f"{record['skill']:+.3f}"
    text = (f"On its test split ({record['test_range'][0][:10]} to {record['test_range'][1][:10]}) this model's "
            f"{what} MAE was {record['mae']:.6g} against persistence's {record['persistence_mae']:.6g}: skill {skill}.")
    if record["worse_than_persistence"]:
        text += " It was WORSE than persistence: repeating the last candle forecast better than this model."
    return text


def predict_next(job_dir: Path, candles: pd.DataFrame) -> pd.DataFrame:
    """The next `horizon` candles after the last of `candles`: index = their open times (UTC), columns =
    the heads' columns in price units ("head.column" where two heads share a column)."""
    saved = _preprocessing(job_dir)
    prep = Preprocessing.from_dict(saved)
    # Only the sections predicting needs: a job saved by an earlier version need not pass today's whole schema.
    saved_config = yaml.safe_load((job_dir / "config.yaml").read_text())
    x, last_close = prep.make_inputs(compute_features(candles, FeaturesConfig.model_validate(saved_config["features"])))
    setup(TrainConfig.model_validate(saved_config["train"]))  # before TensorFlow touches a GPU: memory growth, threads
    model = keras.saving.load_model(job_dir / "model.keras", compile=False)
    outputs = {name: np.asarray(value) for name, value in model(x, training=False).items()}
    prices = prep.to_prices(outputs, last_close)
    horizon, heads = prep.horizon, prep.heads
    all_columns = [c for head in heads for c in head.columns]
    shared = len(set(all_columns)) < len(all_columns)
    columns = {}
    for head in heads:
        steps = prices[head.name].reshape(horizon, len(head.columns))  # (1, horizon, C) or (1, C)
        for i, column in enumerate(head.columns):
            columns[f"{head.name}.{column}" if shared else column] = steps[:, i]
    step = timeframe_delta(saved["timeframe"])
    index = pd.DatetimeIndex([candles.index[-1] + step * k for k in range(1, horizon + 1)], name="timestamp")
    return pd.DataFrame(columns, index=index)


def resolve_job_dir(model_ref: str, symbol: str | None, timeframe: str | None) -> Path:
    """A job directory from a job directory, a run directory + symbol/timeframe, or an hf:// reference
    to the job's folder."""
    if model_ref.startswith("hf://"):
        from .hub import download_job  # the Hub client is only needed for hf:// references

        return download_job(model_ref)
    path = Path(model_ref)
    if (path / PREPROCESSING).is_file():
        return path
    if not (path / "config.yaml").is_file():
        raise UserError(f"{model_ref}: not a job directory (no {PREPROCESSING}); pass a job directory, a run "
                        "directory with --symbol and --timeframe, or hf://NS/NAME/SYMBOL/TIMEFRAME")
    finished = sorted(d.name for d in jobs_dir(path).glob("*") if not d.name.startswith(STAGING_PREFIX)
                      and (d / PREPROCESSING).is_file())
    listed = ", ".join(finished) or "none"
    if not (symbol and timeframe):
        raise UserError(f"{model_ref}: a run directory; pass --symbol and --timeframe (finished jobs: {listed})")
    if f"{symbol}_{timeframe}" not in finished:
        raise UserError(f"{model_ref}: no finished job {symbol}_{timeframe} in this run (finished jobs: {listed})")
    return jobs_dir(path) / f"{symbol}_{timeframe}"


def _is_hub_repo(model_ref: str) -> bool:
    """hf://NS/NAME, without a folder: the job's folder comes from --symbol and --timeframe."""
    return model_ref.startswith("hf://") and len(model_ref.removeprefix("hf://").strip("/").split("/")) == 2


def _candles(job_dir: Path, prep: dict, data_path: Path | None, config_path: str | None) -> pd.DataFrame:
    """The candles to forecast from: --data, else --config's data source, else the job's own."""
    symbol, timeframe = prep["symbol"], prep["timeframe"]
    if data_path is not None:
        return read_candles_file(data_path, timeframe)
    cfg = load_config(config_path if config_path is not None else job_dir / "config.yaml")
    return load_candles(cfg, symbol, timeframe)


def _preprocessing(job_dir: Path) -> dict:
    return json.loads((job_dir / PREPROCESSING).read_text())


def _print_table(forecast: pd.DataFrame, title: str) -> None:
    # pandas' plain text never truncates a number to fit a narrow (or non-)terminal, unlike a rich table.
    table = forecast.set_axis(forecast.index.strftime("%Y-%m-%d %H:%M").rename("open time (UTC)"))
    print(f"{title}\n{table.to_string(float_format=lambda value: f'{value:.8g}')}")
