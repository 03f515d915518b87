"""Job -> validated candles, from the source the config names (data.source).

Sources: local files, a freqtrade data directory as it is, a Hugging Face dataset, Binance public
klines (stored in the cache once downloaded) and seeded synthetic candles. Every frame carries where it
came from in `attrs`; a missing file or a failed download is a JobError for that job, never replaced by
other data.
Parsed candle files are cached by the sha256 of their bytes, so a file is parsed and validated
once, and an edited file is parsed again.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..errors import JobError
from ..files import remove_abandoned_temp_files
from . import store
from .files import candles_from_bytes, read_bytes
from .validate import count_gaps

if TYPE_CHECKING:
    from .settings import RunSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Job:
    """One series to train on: a symbol at a timeframe (the job matrix is run.jobs.make_jobs)."""
    symbol: str
    timeframe: str

    @property
    def name(self) -> str:
        return f"{self.symbol}_{self.timeframe}"

    @classmethod
    def from_name(cls, name: str) -> Job:
        """The job named SYMBOL_TIMEFRAME (as the ledger, the run directory and the Hub name it)."""
        symbol, _, timeframe = name.rpartition("_")
        return cls(symbol, timeframe)


def load_candles(cfg: RunSettings, symbol: str, timeframe: str) -> pd.DataFrame:
    """The job's candles: tz-aware UTC "timestamp" index (candle open time), sorted and unique,
    float64 open/high/low/close/volume, validated, the `data.max_rows` most recent rows.
    attrs: source (e.g. "local:/abs/BTCUSDT_1h.csv.gz", "freqtrade:/abs/BTC_USDT-1h.feather",
    "synthetic(seed=7)"), synthetic, gaps."""
    source = cfg.data.chosen
    frame, label = source.candles(symbol, timeframe, cfg.cache_path)
    if cfg.data.max_rows is not None:
        frame = frame.iloc[-cfg.data.max_rows:]
    return _described(frame, label, timeframe, synthetic=source.synthetic)


def read_candles_file(path: Path, timeframe: str) -> pd.DataFrame:
    """A candle file given by the user (CSV, CSV.gz, Parquet, Feather, freqtrade's JSON / JSON.gz), same
    contract as load_candles."""
    label = f"local:{Path(path).resolve()}"
    frame = candles_from_bytes(read_bytes(Path(path), label), Path(path), timeframe, label)
    return _described(frame, label, timeframe, synthetic=False)


@dataclass(frozen=True)
class DownloadOutcome:
    """One job of `cryptotrain data download`: its candles in the cache, or why not."""
    job: Job
    rows: int = 0
    added: int | None = None  # candles new in the store (binance); None where the source does not say
    first: pd.Timestamp | None = None  # open times of the first and last candle
    last: pd.Timestamp | None = None
    gaps: int = 0
    source: str = ""  # where the candles came from (their attrs["source"])
    error: str | None = None  # the job failed: why

    @property
    def failed(self) -> bool:
        return self.error is not None


def download(cfg: RunSettings, jobs: list[Job],
             on_job: Callable[[DownloadOutcome], None] | None = None) -> list[DownloadOutcome]:
    """`cryptotrain data download`: fetch every job's candles into the cache; a job that fails is reported in
    its outcome and the others go on. `on_job` is called with each job's outcome as soon as it is known.
    Nothing is done (and nothing returned) for a source without downloads (Source.downloads)."""
    source = cfg.data.chosen
    if not source.downloads:
        return []
    remove_abandoned_temp_files(cfg.cache_path)  # what downloads cut short by a kill left
    outcomes = []
    for job in jobs:
        try:
            added = source.download(job.symbol, job.timeframe, cfg.cache_path)
            candles = load_candles(cfg, job.symbol, job.timeframe)
        except JobError as exc:
            outcome = DownloadOutcome(job, error=str(exc))
        else:
            outcome = DownloadOutcome(job, len(candles), added, candles.index[0], candles.index[-1],
                                      candles.attrs["gaps"], candles.attrs["source"])
        outcomes.append(outcome)
        if on_job is not None:
            on_job(outcome)
    return outcomes


def input_digest(cfg: RunSettings, symbol: str, timeframe: str) -> str:
    """What a job is given, as a digest: the run config, and the bytes of its candle file where that is a file
    on this machine (a local or freqtrade file; Binance candles stored earlier). A failed job whose digest has
    changed since (the file fixed or added) is worth another try."""
    path = cfg.data.chosen.stored_file(symbol, timeframe, cfg.cache_path)
    try:
        content = path.read_bytes() if path is not None and path.is_file() else b"absent"
    except OSError as exc:
        content = f"unreadable: {exc}".encode()
    return store.make_key(cfg.fingerprint().encode(), content)


def _described(frame: pd.DataFrame, label: str, timeframe: str, *, synthetic: bool) -> pd.DataFrame:
    gaps = count_gaps(frame.index, timeframe)
    if gaps:
        log.warning("%s: %d candles missing (gaps) among the %d used", label, gaps, len(frame))
    frame.attrs = {"source": label, "synthetic": synthetic, "gaps": gaps}
    return frame
