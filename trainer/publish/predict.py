"""Forecast the next candles from a trained job, local or published on the Hub.

A job directory is self-describing: config.yaml says which features to compute, preprocessing.json
how to scale them, which columns each head predicts and which reference series its market input reads (read
from the same data source as the job's own candles where they come from one). The forecast follows the last
candle given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pydantic import BaseModel

from ..config import load_config
from ..data import load_candles, read_candles_file
from ..data.features import compute_features
from ..data.market import apply_market
from ..data.validate import timeframe_delta
from ..data.windows import Preprocessing
from ..errors import JobError, UserError
from ..evaluation.baselines import Baseline, Har
from ..evaluation.evaluate import candle_head
from ..run.artifacts import STAGING_PREFIX, jobs_dir
from ..run.jobdir import MANIFEST, PREPROCESSING, JobConfig, JobDir
from ..run.rundir import CONFIG

if TYPE_CHECKING:
    import keras

    from ..evaluation.serving import Serving


class CandleRecord(BaseModel):
    """The next candle's high, low and range MAE skill vs HAR + time of day on its validation level, on the test
    split (results.BAR), the network's
    weight beside HAR in them, and how often the 80 % interval held the close (JobSummary's columns); how that
    interval was calibrated, which the forecast's close_80_low / _high follow: "split" or "adaptive", and for
    adaptive the next candle's level it ended the test split at (IntervalScores)."""
    high_skill_har: float | None
    low_skill_har: float | None
    range_skill_har: float | None
    network_weight: float | None
    interval_coverage: float | None
    interval_method: str
    interval_level: float | None


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
    last_candle: pd.Timestamp  # open time of the last candle used; the forecast follows it
    forecast: pd.DataFrame  # predict_next's frame
    test_skill: TrackRecord
    left_out: int = 0  # later candles given but not used: the market input's reference candles stop before them

    def as_dict(self) -> dict:
        """JSON-ready, as `cryptotrain predict --json` prints it."""
        return {
            "symbol": self.symbol, "timeframe": self.timeframe, "model": self.model,
            "last_candle": self.last_candle.isoformat(), "left_out": self.left_out, "source": self.candles_source,
            "synthetic": self.synthetic,
            "test_skill": self.test_skill.model_dump(),
            "forecast": [{"timestamp": t.isoformat(), **row} for t, row in zip(self.forecast.index,
                                                                               self.forecast.to_dict("records"))],
        }


def predict_job(model_ref: str, symbol: str | None, timeframe: str | None, data_path: Path | None,
                config_path: str | None) -> Prediction:
    """`cryptotrain predict`: the forecast of a job (a job directory, a run directory with symbol and
    timeframe, or an hf:// reference) from the candles of `data_path`, else `config_path`'s data source, else
    the job's own."""
    if _is_hub_repo(model_ref) and symbol and timeframe:
        model_ref = f"{model_ref.rstrip('/')}/{symbol}/{timeframe}"
    job_dir = resolve_job_dir(model_ref, symbol, timeframe)
    job = JobDir(job_dir)
    if job.verify() is None:
        raise UserError(f"{model_ref}: its files do not match {MANIFEST} (incomplete or changed); train the job again")
    prep = job.preprocessing()
    for given, own, option in ((symbol, prep.symbol, "--symbol"), (timeframe, prep.timeframe, "--timeframe")):
        if given is not None and given != own:
            raise UserError(f"{option} {given}: the model {model_ref} is for {prep.symbol} {prep.timeframe}")
    config = job.config()
    candles = _candles(config, prep, data_path, config_path)
    forecast = predict_next(job_dir, candles, config, _references(config, prep, config_path))
    last = forecast.index[0] - timeframe_delta(prep.timeframe)
    return Prediction(prep.symbol, prep.timeframe, model_ref, candles.attrs.get("source"),
                      bool(candles.attrs.get("synthetic")), last, forecast, track_record(job_dir),
                      left_out=int((candles.index > last).sum()))


def track_record(job_dir: Path) -> TrackRecord:
    """The job's TrackRecord, from its metrics.json."""
    metrics = JobDir(job_dir).metrics()
    line = metrics.headline
    candles = None if metrics.candles is None else CandleRecord(
        **metrics.summary().model_dump(include=set(CandleRecord.model_fields)),
        interval_method=metrics.candles.interval.method, interval_level=(metrics.candles.interval.level or [None])[0])
    return TrackRecord(**line.model_dump(include={"head", "column", "skill", "mae", "persistence_mae"}),
                       test_range=metrics.test_range, worse_than_persistence=line.worse_than_persistence,
                       candles=candles)


def predict_next(job_dir: Path, candles: pd.DataFrame, config: JobConfig,
                 references: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """The next `horizon` candles after the last of `candles` (Forecaster.next), the job's files read for it."""
    return Forecaster.load(job_dir, config).next(candles, references)


@dataclass(frozen=True)
class Forecaster:
    """A trained job read once for forecasting (its preprocessing, model, HAR + time of day, HAR-X and Serving), then
    asked for the candles after any candles given (`next`), as often as asked: a loop over the test split's windows,
    or one forecast per new candle, loads the model once."""
    config: JobConfig
    prep: Preprocessing
    model: keras.Model
    har_tod: Har | None
    harx: Har | None
    serving: Serving | None
    margins: dict[np.datetime64, np.ndarray]  # the interval's margin at each test sample (JobDir.interval_margins)

    @classmethod
    def load(cls, job_dir: Path, config: JobConfig) -> Forecaster:
        """`config`: the job's (JobDir.config)."""
        import keras  # here: status and report, which import this module's types, never load Keras

        if keras.backend.backend() == "tensorflow":  # before TensorFlow touches a GPU: memory growth, threads
            from ..model.device import setup

            setup(config.train)
        job = JobDir(job_dir)
        serving = job.serving()
        return cls(config, job.preprocessing(), job.model(), job.har_tod(), job.harx(), serving,
                   {} if serving is None else job.interval_margins())

    def next(self, candles: pd.DataFrame, references: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        """The next `horizon` candles after the last of `candles` (with a market input: the last whose reference
        candles are given, Prediction.left_out says how many were not used): index = their open times (UTC),
        columns = the heads' columns in price units ("head.column" where two heads share a column), and what the
        job serves of their size (_expected_candles). `references`: the candles of its market input's reference
        series (symbol -> candles), where it has one."""
        prep, har = self.prep, self.har_tod
        frame = compute_features(candles, self.config.features)
        if prep.market:  # the forecast follows the last candle whose market input is known
            frame = apply_market(frame, references or {}, prep.market)
            candles = candles.loc[:frame.index[-1]]
        x, last = prep.make_inputs(frame)
        inputs = prep.model_inputs(x, prep.forecast_inputs(None if har is None else har.inputs(candles)))
        # Keras's traced predict step: its first call traces it (under a second), each one after a few ms
        outputs = {name: np.asarray(value) for name, value in self.model.predict_on_batch(inputs).items()}
        prices = prep.to_prices(prep.point(outputs), last)
        every = prep.to_prices(outputs, last)  # a quantile head's every level
        horizon, heads = prep.horizon, prep.heads
        all_columns = [c for head in heads for c in head.columns]
        shared = len(set(all_columns)) < len(all_columns)
        columns = {}
        for head in heads:  # "head.column" where two heads share a column
            columns |= head.spec.served_columns(prices[head.name].reshape(horizon, len(head.columns)),
                                                every[head.name][0], lambda c, h=head: f"{h.name}.{c}" if shared else c)
        step = timeframe_delta(prep.timeframe)
        index = pd.DatetimeIndex([candles.index[-1] + step * k for k in range(1, horizon + 1)], name="timestamp")
        if (serving := self.serving) is not None:
            sources = {str(Baseline.HAR_TOD): har.forecast(candles)}
            if self.harx is not None:  # it reads the feature rows: the volume surprise, the market's range
                sources[str(Baseline.HARX)] = self.harx.forecast(frame)
            # the interval's margin as evaluation had it then, inside the test split; after it, the one it ended at
            margin = self.margins.get(index[0].to_datetime64().astype("datetime64[ns]"))
            head = candle_head(prep)
            last_close = float(candles["close"].iloc[-1])
            network = {q: v[0] for q, v in prep.candle_quantities(head, outputs, prices[head.name],
                                                                  np.array([last_close])).items()}
            columns |= _expected_candles(serving.served(
                network, sources, margin, sources[str(Baseline.HAR_TOD)]["volatility"][serving.normaliser]),
                last_close)
        return pd.DataFrame(columns, index=index)


def _expected_candles(served: dict[str, np.ndarray], last_close: float) -> dict[str, np.ndarray]:
    """What the job's Serving serves after the last candle (evaluation.serving: what evaluation served on the test
    split, predictions.npz's expected_*), in price units and percent: the medians of the high and low
    ("expected_high", "expected_low"), of the range ("expected_range_pct": high / low - 1 in percent, not
    expected_high / expected_low - 1), the range's root mean square ("expected_range_rms_pct": the root of its
    expected square, what QLIKE scores: the scale to size risk with), and the 80 % interval of the close
    ("close_80_low", "close_80_high")."""
    return {"expected_high": last_close * np.exp(served["expected_high"]),
            "expected_low": last_close * np.exp(-served["expected_low"]),
            "expected_range_pct": 100 * np.expm1(served["expected_range"]),
            "expected_range_rms_pct": 100 * np.expm1(served["expected_range_rms"]),
            "close_80_low": last_close * np.exp(served["interval_low"]),
            "close_80_high": last_close * np.exp(served["interval_high"])}


def resolve_job_dir(model_ref: str, symbol: str | None, timeframe: str | None) -> Path:
    """A job directory from a job directory, a run directory + symbol/timeframe, or an hf:// reference
    to the job's folder."""
    if model_ref.startswith("hf://"):
        from .hub import download_job

        return download_job(model_ref)
    path = Path(model_ref)
    if JobDir(path).is_job():
        return path
    if not (path / CONFIG).is_file():
        raise UserError(f"{model_ref}: not a job directory (no {PREPROCESSING}); pass a job directory, a run "
                        "directory with --symbol and --timeframe, or hf://NS/NAME/SYMBOL/TIMEFRAME")
    finished = sorted(d.name for d in jobs_dir(path).glob("*") if not d.name.startswith(STAGING_PREFIX)
                      and JobDir(d).is_job())
    listed = ", ".join(finished) or "none"
    if not (symbol and timeframe):
        raise UserError(f"{model_ref}: a run directory; pass --symbol and --timeframe (finished jobs: {listed})")
    if f"{symbol}_{timeframe}" not in finished:
        raise UserError(f"{model_ref}: no finished job {symbol}_{timeframe} in this run (finished jobs: {listed})")
    return jobs_dir(path) / f"{symbol}_{timeframe}"


def _is_hub_repo(model_ref: str) -> bool:
    """hf://NS/NAME, without a folder: the job's folder comes from --symbol and --timeframe."""
    return model_ref.startswith("hf://") and len(model_ref.removeprefix("hf://").strip("/").split("/")) == 2


def _references(config: JobConfig, prep: Preprocessing, config_path: str | None) -> dict[str, pd.DataFrame]:
    """The candles of the job's market input's reference series (none without one): from --config's data source,
    else the job's own (with --data too); JobError naming a reference whose candles are missing."""
    if not prep.market:
        return {}
    if config_path is None and config.run is None:
        raise UserError(config.problem)
    source = load_config(config_path) if config_path is not None else config.run
    references = {}
    for reference in prep.market:
        try:
            references[reference.symbol] = load_candles(source, reference.symbol, prep.timeframe)
        except JobError as exc:
            raise JobError(f"market reference {reference.symbol}: {exc}") from None
    return references


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
