"""Candles -> feature frame: the configured indicators (each computes itself: trainer/data/indicators.py),
vectorized, cached on disk.

Warm-up rows, where an indicator is not yet defined, are dropped, never filled. The cache key is the
sha256 of the candles' bytes, the indicator spec, the ta/pandas/numpy versions and this file's
source, so an entry is never stale. The market input (features.market) is joined after the cache
(job_features, data/market.py): what the reference series' candles say is never read from an entry.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import JobError
from ..files import remove_abandoned_temp_files
from . import Job, indicators, load_candles, store
from .market import Reference, add_market, load_references
from .settings import FeaturesConfig, RunSettings
from .validate import OHLCV

# What an entry depends on besides the candles and the spec: this code, the entry format and the libraries.
FEATURE_VERSION = store.make_key(
    Path(__file__).read_bytes(), store.code_digest("indicators", "store"),
    *(version(package) for package in ("ta", "pandas", "numpy"))
)


def compute_features(candles: pd.DataFrame, features: FeaturesConfig) -> pd.DataFrame:
    """OHLCV + one column per configured indicator (named indicator.name), warm-up rows dropped."""
    series = indicators.Candles(candles)
    names = [*OHLCV, *(spec.name for spec in features.indicators)]
    values = np.stack([*(candles[column].to_numpy(np.float64) for column in OHLCV),
                       *(spec.compute(series) for spec in features.indicators)])  # columns x rows
    where = candles.attrs.get("source", "candles")
    defined = ~np.isnan(values).any(axis=0)
    if not defined.any():
        raise JobError(f"{where}: {values.shape[1]} candles are too few for the indicators to warm up")
    first = int(np.argmax(defined))
    values, index = np.ascontiguousarray(values[:, first:]), candles.index[first:]
    not_finite = ~np.isfinite(values)
    if not_finite.any():
        col, row = np.argwhere(not_finite)[0]
        jump = implausible_jump(candles)
        raise JobError(f"{where}: feature {names[col]} is undefined at {index[row]:%Y-%m-%d %H:%M} UTC "
                       f"({int(not_finite.any(axis=0).sum())} rows after the warm-up)"
                       + (f"; the candles are implausible: {jump}" if jump else ""))
    frame = store.frame_of_columns(values, names, index)
    frame.attrs = dict(candles.attrs)
    return frame


def load_features(candles: pd.DataFrame, features: FeaturesConfig, cache_dir: Path) -> tuple[pd.DataFrame, bool]:
    """compute_features, cached under cache_dir / "features"; the bool says whether it was a cache hit."""
    spec = json.dumps([indicator.model_dump(mode="json") for indicator in features.indicators], sort_keys=True)
    key = store.make_key(store.frame_digest(candles, OHLCV), spec, FEATURE_VERSION)
    directory = Path(cache_dir) / "features"
    frame = store.load(directory, key)
    if frame is not None:
        frame.attrs = dict(candles.attrs)
        return frame, True
    frame = compute_features(candles, features)
    store.save(directory, key, frame)
    return frame, False


def collinear_columns(frame: pd.DataFrame, columns: list[str],
                      threshold: float = 0.9999) -> list[tuple[str, str, float]]:
    """Pairs of columns that are (near-)exact linear functions of each other, with their correlation.

    Measured on bar-to-bar changes: a price-level series correlates at 0.9999 with any other one
    (open with close, bb_upper with close) through the shared trend alone, while changes correlate
    that well only when one column really is a * other + b."""
    changes = np.diff(frame[columns].to_numpy(np.float64), axis=0)
    # A constant column has no correlation; absurd candles overflow (their job fails, naming them).
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        corr = np.corrcoef(changes, rowvar=False)
    upper_i, upper_j = np.triu_indices(len(columns), k=1)
    return [(columns[i], columns[j], float(corr[i, j]))
            for i, j in zip(upper_i, upper_j) if abs(corr[i, j]) >= threshold]


# A bar-to-bar change of a price by this factor or more, either way, is taken for bad data, not a market move.
IMPLAUSIBLE_JUMP = 100.0


def implausible_jump(frame: pd.DataFrame) -> str | None:
    """The largest bar-to-bar change of a candle price (open, high, low, close) in `frame`, described, when it is a
    factor of IMPLAUSIBLE_JUMP or more: what to name when numbers computed from these candles overflow or
    training on them diverges. None when every change is plausible."""
    prices = frame[list(OHLCV[:4])].to_numpy(np.float64)  # validated: finite and positive
    change = np.abs(np.diff(np.log(prices), axis=0))
    if change.size == 0 or not change.max() >= np.log(IMPLAUSIBLE_JUMP):
        return None
    row, col = np.unravel_index(np.argmax(change), change.shape)
    return (f"{OHLCV[col]} goes from {prices[row, col]:.6g} to {prices[row + 1, col]:.6g} at "
            f"{frame.index[row + 1]:%Y-%m-%d %H:%M} UTC")


@dataclass(frozen=True)
class JobFeatures:
    """A job's feature rows (job_features), the candles they come from, whether the indicators were a cache hit,
    and the reference series of its market input (none without features.market)."""
    candles: pd.DataFrame
    frame: pd.DataFrame
    hit: bool
    market: tuple[Reference, ...] = ()


def job_features(cfg: RunSettings, symbol: str, timeframe: str) -> JobFeatures:
    """A job's candles -> its feature rows: the indicators (load_features), then, with features.market, the market
    input over its reference series (read through the same source and cache), fitted on the train share of the
    rows it keeps (window.split.train). JobError: the job's candles or a listed reference's, or too little overlap."""
    candles = load_candles(cfg, symbol, timeframe)
    frame, hit = load_features(candles, cfg.features, cfg.cache_path)
    if cfg.features.market is None:
        return JobFeatures(candles, frame, hit)
    frame, market = add_market(frame, load_references(cfg, symbol, timeframe), cfg.window.split.train)
    return JobFeatures(candles, frame, hit, market)


@dataclass(frozen=True)
class FeatureOutcome:
    """One job of `cryptotrain features`: its features ready (from the cache or computed), or why not."""
    job: Job
    hit: bool = False  # a cache hit, else computed (or failed)
    rows: int = 0
    columns: int = 0
    source: str = ""  # where the candles came from (their attrs["source"])
    error: str | None = None  # the job failed: why

    @property
    def failed(self) -> bool:
        return self.error is not None


def precompute(cfg: RunSettings, jobs: list[Job],
               on_job: Callable[[FeatureOutcome], None] | None = None) -> list[FeatureOutcome]:
    """`cryptotrain features`: compute and cache every job's features; a job that fails is reported in its
    outcome and the others go on. `on_job` is called with each job's outcome as soon as it is known."""
    remove_abandoned_temp_files(cfg.cache_path)  # what writes cut short by a kill left
    outcomes = []
    for job in jobs:
        try:
            features = job_features(cfg, job.symbol, job.timeframe)
        except JobError as exc:
            outcome = FeatureOutcome(job, error=str(exc))
        else:
            outcome = FeatureOutcome(job, features.hit, len(features.frame), len(features.frame.columns),
                                     features.candles.attrs["source"])
        outcomes.append(outcome)
        if on_job is not None:
            on_job(outcome)
    return outcomes
