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
from importlib.metadata import version
from pathlib import Path

import pandas as pd

from ..config import RunConfig
from ..errors import JobError
from ..files import remove_abandoned_temp_files
from ..jobs import Job
from . import binance, files, freqtrade, store, validate
from .files import candles_from_bytes, job_filename, read_bytes
from .hf import hf_file, hf_label
from .synthetic import synthetic_candles
from .validate import count_gaps

log = logging.getLogger(__name__)

NOTHING_TO_DOWNLOAD = ("local", "freqtrade", "synthetic")  # sources read where they are

# What a parsed entry depends on besides the file's bytes: the parsing code and the libraries.
PARSER_VERSION = store.make_key(store.code_digest(files, validate, store),
                                *(version(package) for package in ("pyarrow", "pandas", "numpy")))


def load_candles(cfg: RunConfig, symbol: str, timeframe: str) -> pd.DataFrame:
    """The job's candles: tz-aware UTC "timestamp" index (candle open time), sorted and unique,
    float64 open/high/low/close/volume, validated, the `data.max_rows` most recent rows.
    attrs: source (e.g. "local:/abs/BTCUSDT_1h.csv.gz", "freqtrade:/abs/BTC_USDT-1h.feather",
    "synthetic(seed=7)"), synthetic, gaps."""
    data = cfg.data
    if data.source == "synthetic":
        frame = synthetic_candles(symbol, timeframe, data.synthetic.seed, data.synthetic.rows)
        label = f"synthetic(seed={data.synthetic.seed})"
    else:
        path, label = _job_file(cfg, symbol, timeframe)
        frame = _read_cached(path, timeframe, label, cfg.cache_path / "candles" / "parsed")
    if data.max_rows is not None:
        frame = frame.iloc[-data.max_rows:]
    return _described(frame, label, timeframe, synthetic=data.source == "synthetic")


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


def has_downloads(cfg: RunConfig) -> bool:
    """Whether the config's data source is one that `download` fetches (binance, hf); local files,
    freqtrade directories and synthetic candles need nothing."""
    return cfg.data.source not in NOTHING_TO_DOWNLOAD


def download(cfg: RunConfig, jobs: list[Job],
             on_job: Callable[[DownloadOutcome], None] | None = None) -> list[DownloadOutcome]:
    """`cryptotrain data download`: fetch every job's candles into the cache; a job that fails is reported in
    its outcome and the others go on. `on_job` is called with each job's outcome as soon as it is known.
    Nothing is done (and nothing returned) for a source without downloads (has_downloads)."""
    if not has_downloads(cfg):
        return []
    remove_abandoned_temp_files(cfg.cache_path)  # what downloads cut short by a kill left
    outcomes = []
    for job in jobs:
        try:
            added = (binance.update(cfg.data.binance, cfg.cache_path, job.symbol, job.timeframe)
                     if cfg.data.source == "binance" else None)
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


def input_digest(cfg: RunConfig, symbol: str, timeframe: str) -> str:
    """What a job is given, as a digest: the run config, and the bytes of its candle file where that is a file
    on this machine (a local or freqtrade file; Binance candles stored earlier). A failed job whose digest has
    changed since (the file fixed or added) is worth another try."""
    data = cfg.data
    if data.source == "local":
        path: Path | None = data.local.directory() / job_filename(data.local.pattern, symbol, timeframe)
    elif data.source == "freqtrade":  # the job's one file; none (absent, or several: which is unknown) is "absent"
        found = freqtrade.candidates(data.freqtrade.path, symbol, timeframe)
        path = found[0] if len(found) == 1 else None
    elif data.source == "binance":
        path = binance.stored_path(data.binance, cfg.cache_path, symbol, timeframe)
    else:
        path = None
    try:
        content = path.read_bytes() if path is not None and path.is_file() else b"absent"
    except OSError as exc:
        content = f"unreadable: {exc}".encode()
    return store.make_key(cfg.fingerprint().encode(), content)


def _job_file(cfg: RunConfig, symbol: str, timeframe: str) -> tuple[Path, str]:
    data = cfg.data
    if data.source == "local":
        name = job_filename(data.local.pattern, symbol, timeframe)
        directory = data.local.directory()
        path = (directory / name).resolve()
        if not path.is_file():
            holdings = _local_holdings(directory, data.local.pattern, timeframe)
            raise JobError(f"local:{path}: no such file; {holdings} (data.local.path, or --set data.source=hf or "
                           "binance)")
        return path, f"local:{path}"
    if data.source == "freqtrade":
        path = freqtrade.job_file(data.freqtrade, symbol, timeframe).resolve()
        return path, f"freqtrade:{path}"
    if data.source == "hf":
        return hf_file(data.hf, symbol, timeframe), hf_label(data.hf, symbol, timeframe)
    path = binance.stored_path(data.binance, cfg.cache_path, symbol, timeframe)
    if binance.load_stored(path, timeframe) is None:  # none yet, or damaged (removed): download them
        binance.update(data.binance, cfg.cache_path, symbol, timeframe)
    return path, f"binance:{path}"


def _local_holdings(directory: Path, pattern: str, timeframe: str) -> str:
    """What a local directory does hold for a timeframe, to say beside a missing file."""
    if not directory.is_dir():
        return f"there is no directory {directory}"
    prefix, _, suffix = job_filename(pattern, "\0", timeframe).partition("\0")
    symbols = sorted(p.name[len(prefix):len(p.name) - len(suffix)] for p in directory.glob(f"{prefix}*{suffix}")
                     if p.name.startswith(prefix) and p.name.endswith(suffix))
    return f"{directory} has {timeframe} candles for {', '.join(symbols) or 'no symbol'}"


def _read_cached(path: Path, timeframe: str, label: str, cache: Path) -> pd.DataFrame:
    raw = read_bytes(path, label)
    key = store.make_key(raw, files.file_format(path), timeframe, PARSER_VERSION)
    frame = store.load(cache, key)
    if frame is None:
        frame = candles_from_bytes(raw, path, timeframe, label)
        store.save(cache, key, frame)
    return frame


def _described(frame: pd.DataFrame, label: str, timeframe: str, *, synthetic: bool) -> pd.DataFrame:
    gaps = count_gaps(frame.index, timeframe)
    if gaps:
        log.warning("%s: %d candles missing (gaps) among the %d used", label, gaps, len(frame))
    frame.attrs = {"source": label, "synthetic": synthetic, "gaps": gaps}
    return frame
