"""Forecast the next candles from a trained job, local or published on the Hub.

A job directory is self-describing: config.yaml says which features to compute, preprocessing.json
how to scale them and which columns each head predicts. The forecast follows the last candle given.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ValidationError

from ..config import ConfigError, FeaturesConfig, RunConfig, TrainConfig, load_config, validate_config
from ..data import load_candles, read_candles_file
from ..data.features import compute_features
from ..data.validate import timeframe_delta
from ..data.windows import Preprocessing
from ..errors import UserError, first_line
from ..evaluation.baselines import HAR_FILE, Har, quantities
from ..evaluation.evaluate import COMBINED
from ..evaluation.results import JobMetrics
from ..model.device import setup
from ..run.artifacts import MANIFEST, STAGING_PREFIX, jobs_dir, verify

PREPROCESSING = "preprocessing.json"
CONFIG = "config.yaml"


class CandleRecord(BaseModel):
    """The next candle's high, low and range MAE skill vs HAR + time of day on the test split, the network's
    weight beside HAR in them, and how often the 80 % interval held the close (JobSummary's columns)."""
    high_skill_har: float | None
    low_skill_har: float | None
    range_skill_har: float | None
    network_weight: float | None
    interval_coverage: float | None


class TrackRecord(BaseModel):
    """How a job's model did on its held-out test split (metrics.json's headline), and whether it was worse
    than persistence: what a forecast is worth. `candles`: None without a candle head (or before 0.2)."""
    head: str
    column: str | None
    skill: float | None
    mae: float
    persistence_mae: float
    test_range: list[str]
    worse_than_persistence: bool
    candles: CandleRecord | None


@dataclass(frozen=True)
class Prediction:
    """A forecast from a trained job, with what it was made from and the model's track record."""
    symbol: str
    timeframe: str
    model: str  # the reference given (an hf:// one completed with symbol and timeframe)
    candles_source: str | None  # where the candles came from (their attrs["source"])
    synthetic: bool  # made from synthetic candles: a demonstration, not a market
    last_candle: pd.Timestamp  # open time of the last candle given; the forecast follows it
    forecast: pd.DataFrame  # predict_next's frame
    test_skill: TrackRecord

    def as_dict(self) -> dict:
        """JSON-ready, as `cryptotrain predict --json` prints it."""
        return {
            "symbol": self.symbol, "timeframe": self.timeframe, "model": self.model,
            "last_candle": self.last_candle.isoformat(), "source": self.candles_source,
            "synthetic": self.synthetic,
            "test_skill": self.test_skill.model_dump(),
            "forecast": [{"timestamp": t.isoformat(), **row} for t, row in zip(self.forecast.index,
                                                                               self.forecast.to_dict("records"))],
        }


@dataclass(frozen=True)
class JobConfig:
    """A job's config.yaml, read once: the sections forecasting needs, which a job saved by an earlier version
    still passes, and the whole run config where this version reads it (for the job's own candles)."""
    features: FeaturesConfig
    train: TrainConfig
    run: RunConfig | None
    problem: str | None = None  # why `run` is None: the config error, one line

    @classmethod
    def read(cls, job_dir: Path) -> JobConfig:
        return _job_file(job_dir, CONFIG, cls._from_file)

    @classmethod
    def _from_file(cls, path: Path) -> JobConfig:
        saved = yaml.safe_load(path.read_text())
        features, train = FeaturesConfig.model_validate(saved["features"]), TrainConfig.model_validate(saved["train"])
        try:
            return cls(features, train, validate_config(saved, path))
        except ConfigError as exc:
            return cls(features, train, None, str(exc))


def predict_job(model_ref: str, symbol: str | None, timeframe: str | None, data_path: Path | None,
                config_path: str | None) -> Prediction:
    """`cryptotrain predict`: the forecast of a job (a job directory, a run directory with symbol and
    timeframe, or an hf:// reference) from the candles of `data_path`, else `config_path`'s data source, else
    the job's own."""
    if _is_hub_repo(model_ref) and symbol and timeframe:
        model_ref = f"{model_ref.rstrip('/')}/{symbol}/{timeframe}"
    job_dir = resolve_job_dir(model_ref, symbol, timeframe)
    if verify(job_dir) is None:
        raise UserError(f"{model_ref}: its files do not match {MANIFEST} (incomplete or changed); train the job again")
    prep = _job_file(job_dir, PREPROCESSING, Preprocessing.from_file)
    for given, own, option in ((symbol, prep.symbol, "--symbol"), (timeframe, prep.timeframe, "--timeframe")):
        if given is not None and given != own:
            raise UserError(f"{option} {given}: the model {model_ref} is for {prep.symbol} {prep.timeframe}")
    config = JobConfig.read(job_dir)
    candles = _candles(config, prep, data_path, config_path)
    forecast = predict_next(job_dir, candles, config)
    return Prediction(prep.symbol, prep.timeframe, model_ref, candles.attrs.get("source"),
                      bool(candles.attrs.get("synthetic")), candles.index[-1], forecast, track_record(job_dir))


def track_record(job_dir: Path) -> TrackRecord:
    """The job's TrackRecord, from its metrics.json."""
    metrics = _job_file(job_dir, "metrics.json", JobMetrics.from_file)
    line = metrics.headline
    candles = None if metrics.candles is None else CandleRecord.model_validate(
        metrics.summary().model_dump(include=set(CandleRecord.model_fields)))
    return TrackRecord(**line.model_dump(include={"head", "column", "skill", "mae", "persistence_mae"}),
                       test_range=metrics.test_range, worse_than_persistence=line.worse_than_persistence,
                       candles=candles)


def predict_next(job_dir: Path, candles: pd.DataFrame, config: JobConfig) -> pd.DataFrame:
    """The next `horizon` candles after the last of `candles`: index = their open times (UTC), columns =
    the heads' columns in price units ("head.column" where two heads share a column). `config`: the job's."""
    prep = _job_file(job_dir, PREPROCESSING, Preprocessing.from_file)
    x, last_close = prep.make_inputs(compute_features(candles, config.features))
    setup(config.train)  # before TensorFlow touches a GPU: memory growth, threads
    model = _job_file(job_dir, "model.keras", _read_model)
    outputs = {name: np.asarray(value) for name, value in model(x, training=False).items()}
    prices = prep.to_prices(prep.point(outputs), last_close)
    horizon, heads = prep.horizon, prep.heads
    all_columns = [c for head in heads for c in head.columns]
    shared = len(set(all_columns)) < len(all_columns)
    columns = {}
    for head in heads:
        steps = prices[head.name].reshape(horizon, len(head.columns))  # (1, horizon, C) or (1, C)
        quantiles = prep.head_prices(head, outputs[head.name], last_close).reshape(
            horizon, len(head.quantiles), len(head.columns)) if head.quantiles else None
        for i, column in enumerate(head.columns):
            name = f"{head.name}.{column}" if shared else column
            columns[name] = steps[:, i]
            for j, level in enumerate(head.quantiles):  # a quantile head: each level, e.g. close_q10
                columns[f"{name}_q{level * 100:g}"] = quantiles[:, j, i]
    if (job_dir / HAR_FILE).is_file():
        columns |= _expected_candles(job_dir, prep, prices, candles)
    step = timeframe_delta(prep.timeframe)
    index = pd.DatetimeIndex([candles.index[-1] + step * k for k in range(1, horizon + 1)], name="timestamp")
    return pd.DataFrame(columns, index=index)


def _expected_candles(job_dir: Path, prep: Preprocessing, prices: dict[str, np.ndarray],
                      candles: pd.DataFrame) -> dict[str, np.ndarray]:
    """The candle head's expected high, low and range as evaluation scored them (the network's combined with
    HAR + time of day's, the weights chosen on validation; each a median forecast of its own, so the range,
    high / low - 1 in percent, is not expected_high / expected_low - 1) and the 80 % interval of the close (the
    network's close widened by the validation margin x the volatility it was calibrated with): "expected_high",
    "expected_low", "expected_range_pct", "close_80_low", "close_80_high"."""
    har = _job_file(job_dir, HAR_FILE, lambda path: Har.from_dict(json.loads(path.read_text())))
    scores = _job_file(job_dir, "metrics.json", JobMetrics.from_file).candles
    head = next(h for h in prep.heads if h.name == scores.head)
    candle = prices[head.name].reshape(prep.horizon, len(head.columns))
    high, low, close = (candle[:, head.columns.index(c)] for c in ("high", "low", "close"))
    last_close = float(candles["close"].iloc[-1])
    network = quantities(high[None], low[None], close[None], np.array([last_close]))
    baseline = har.forecast(candles)
    weight = {q: np.asarray(getattr(scores, q).network_weight) for q in COMBINED}
    combined = {q: weight[q] * network[q][0] + (1 - weight[q]) * baseline[q][:len(weight[q])] for q in COMBINED}
    volatility = baseline["volatility"][scores.interval.normaliser]  # "har" in runs of earlier versions
    spread = np.asarray(scores.interval.margin) * volatility[:len(scores.interval.margin)]
    return {"expected_high": last_close * np.exp(combined["high"]),
            "expected_low": last_close * np.exp(-combined["low"]),
            "expected_range_pct": 100 * np.expm1(combined["range"]),
            "close_80_low": last_close * np.exp(network["return"][0] - spread),
            "close_80_high": last_close * np.exp(network["return"][0] + spread)}


def resolve_job_dir(model_ref: str, symbol: str | None, timeframe: str | None) -> Path:
    """A job directory from a job directory, a run directory + symbol/timeframe, or an hf:// reference
    to the job's folder."""
    if model_ref.startswith("hf://"):
        from .hub import download_job

        return download_job(model_ref)
    path = Path(model_ref)
    if (path / PREPROCESSING).is_file():
        return path
    if not (path / CONFIG).is_file():
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


def _candles(config: JobConfig, prep: Preprocessing, data_path: Path | None, config_path: str | None) -> pd.DataFrame:
    """The candles to forecast from: --data, else --config's data source, else the job's own."""
    symbol, timeframe = prep.symbol, prep.timeframe
    if data_path is not None:
        return read_candles_file(data_path, timeframe)
    if config_path is not None:
        return load_candles(load_config(config_path), symbol, timeframe)
    if config.run is None:
        raise UserError(config.problem)
    return load_candles(config.run, symbol, timeframe)


def _job_file(job_dir: Path, name: str, read):
    """`read(job_dir / name)`; a file that is there but cannot be read as what it should be (garbage, a
    truncated copy, a format this version does not know) is one line of bad input naming it."""
    try:
        return read(job_dir / name)
    except UserError:  # read's own line
        raise
    except Exception as exc:  # json, yaml, zip, h5, pydantic, a missing key: whatever the garbage trips
        if isinstance(exc, ValidationError):  # its first problem, not "14 validation errors for JobMetrics"
            first = exc.errors()[0]
            reason = f"{'.'.join(map(str, first['loc'])) or 'the file'}: {first['msg']}"
        else:
            reason = first_line(exc) or type(exc).__name__
        raise UserError(f"{job_dir / name}: cannot be read ({type(exc).__name__}: {reason}); train the job "
                        "again, or download it again") from None


def _read_model(path: Path) -> keras.Model:
    if not zipfile.is_zipfile(path):  # Keras would call it "File not found"
        raise ValueError("not a .keras (zip) file")
    with zipfile.ZipFile(path) as archive:
        holders = _code_holders(json.loads(archive.read("config.json")))
    if holders:  # Keras's safe mode would refuse it too, in a paragraph that says nothing of this file
        raise UserError(f"{path}: holds Python code (in {', '.join(holders)}), which loading the model would run, "
                        "so it is refused (Keras's safe mode); a model cryptotrain trains holds none: this one was "
                        "made or changed elsewhere")
    return keras.saving.load_model(path, compile=False)


def _code_holders(config: object, holder: str = "the model") -> list[str]:
    """What in a .keras file's config.json holds Python code (Keras writes a Python function's bytecode as a
    "__lambda__" object), e.g. ["Lambda 'doubled'"]: each object with a name around such code, once."""
    if isinstance(config, list):
        return list(dict.fromkeys(found for item in config for found in _code_holders(item, holder)))
    if not isinstance(config, dict):
        return []
    if config.get("class_name") == "__lambda__":
        return [holder]
    inner = config.get("config")
    if "class_name" in config and isinstance(inner, dict) and "name" in inner:
        holder = f"{config['class_name']} '{inner['name']}'"
    return _code_holders(list(config.values()), holder)


