"""Job -> validated candles, from the source the config names (data.source).

Sources: local files, a Hugging Face dataset, Binance public klines (stored in the cache once
downloaded) and seeded synthetic candles. Every frame carries where it came from in `attrs`;
a missing file or a failed download is a JobError for that job, never replaced by other data.
Parsed candle files are cached by the sha256 of their bytes, so a file is parsed and validated
once, and an edited file is parsed again.
"""
from __future__ import annotations

import logging
from importlib.metadata import version
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import track

from ..config import RunConfig
from ..errors import JobError
from ..jobs import Job
from . import binance, files, store, validate
from .files import candles_from_bytes, job_filename, read_bytes
from .hf import hf_file, hf_label
from .synthetic import synthetic_candles
from .validate import count_gaps

log = logging.getLogger("cryptotrain")

# What a parsed entry depends on besides the file's bytes: the parsing code and the libraries.
PARSER_VERSION = store.make_key(store.code_digest(files, validate, store),
                                *(version(package) for package in ("pyarrow", "pandas", "numpy")))


def load_candles(cfg: RunConfig, symbol: str, timeframe: str) -> pd.DataFrame:
    """The job's candles: tz-aware UTC "timestamp" index (candle open time), sorted and unique,
    float64 open/high/low/close/volume, validated, the `data.max_rows` most recent rows.
    attrs: source (e.g. "local:/abs/BTCUSDT_1h.csv.gz", "synthetic(seed=7)"), synthetic, gaps."""
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
    """A candle file given by the user (CSV, CSV.gz or Parquet), same contract as load_candles."""
    label = f"local:{Path(path).resolve()}"
    frame = candles_from_bytes(read_bytes(Path(path), label), Path(path), timeframe, label)
    return _described(frame, label, timeframe, synthetic=False)


def download(cfg: RunConfig, jobs: list[Job]) -> int:
    """`cryptotrain data download`: fetch every job's candles into the cache, one line per job.
    Returns the exit code: 0 when all are ready, 1 when some failed."""
    console = Console(soft_wrap=True)  # one line per job, however long
    if cfg.data.source in ("local", "synthetic"):
        console.print(f"data.source is {cfg.data.source}: nothing to download")
        return 0
    failed = 0
    for job in track(jobs, description="Downloading", console=console, transient=True):
        try:
            added = (binance.update(cfg.data.binance, cfg.cache_path, job.symbol, job.timeframe)
                     if cfg.data.source == "binance" else None)
            candles = load_candles(cfg, job.symbol, job.timeframe)
        except JobError as exc:
            failed += 1
            console.print(f"{job.name}: FAILED: {exc}", style="red", markup=False, highlight=False)
            continue
        news = "" if added is None else f", {added} new"
        console.print(f"{job.name}: {len(candles)} candles{news}, {candles.index[0]:%Y-%m-%d %H:%M} .. "
                      f"{candles.index[-1]:%Y-%m-%d %H:%M} UTC, {candles.attrs['gaps']} gaps "
                      f"<- {candles.attrs['source']}", markup=False, highlight=False)
    console.print(f"{len(jobs) - failed} of {len(jobs)} jobs ready, {failed} failed")
    return 1 if failed else 0


def input_digest(cfg: RunConfig, symbol: str, timeframe: str) -> str:
    """What a job is given, as a digest: the run config, and the bytes of its candle file where that is a file
    on this machine (a local file; Binance candles stored earlier). A failed job whose digest has changed
    since (the file fixed or added) is worth another try."""
    data = cfg.data
    if data.source == "local":
        path: Path | None = data.local.path / job_filename(data.local.pattern, symbol, timeframe)
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
        path = (data.local.path / name).resolve()
        if not path.is_file():
            holdings = _local_holdings(data.local.path, data.local.pattern, timeframe)
            raise JobError(f"local:{path}: no such file; {holdings} (data.local.path, or --set data.source=hf or "
                           "binance)")
        return path, f"local:{path}"
    if data.source == "hf":
        return hf_file(data.hf, symbol, timeframe), hf_label(data.hf, symbol, timeframe)
    path = binance.stored_path(data.binance, cfg.cache_path, symbol, timeframe)
    if not path.exists():
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
    key = store.make_key(raw, path.name.lower().rsplit(".", 1)[-1], timeframe, PARSER_VERSION)
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
