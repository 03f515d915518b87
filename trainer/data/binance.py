"""Binance public spot klines (no API key), downloaded once and stored as CSV.gz in the cache.

The range runs from data.binance.start (included) to data.binance.end (excluded), UTC dates. The
candles closed by the first download are stored (written atomically after the last page) and later
runs read them without network. `cryptotrain data download` appends those closed since, until the
stored file reaches the end of the range (a range open to "now", with no end, never does); a
complete range is not asked for again.

Paging follows the API: up to 1000 klines per request from startTime on. Rate limits: above 80 %
of the per-minute request weight (X-MBX-USED-WEIGHT-1M) the client waits for the next minute. Each
request is retried on its own, as the Hub client's are (retries.retry_wait): a 429, 418 (banned for a
while) or 5xx answer after its Retry-After, or with backoff when it has none, and network errors
with backoff; MAX_ATTEMPTS times in all. A Retry-After over MAX_RETRY_AFTER_S is reported at once.
"""
from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
from pydantic import model_validator

from ..errors import JobError
from ..files import atomic_write
from ..retries import retry_wait
from .files import candles_from_bytes, read_bytes
from .sources import IsoDate, Source
from .validate import OHLCV, timeframe_delta

PAGE_LIMIT = 1000
WEIGHT_LIMIT_1M = 6000  # Binance spot request weight per minute and IP
WEIGHT_PAUSE_AT = 0.8 * WEIGHT_LIMIT_1M
MAX_ATTEMPTS = 5  # per request, for rate limits, 5xx and network errors together
BACKOFF_S = 1.0  # first wait without a Retry-After; doubles on each attempt
MAX_RETRY_AFTER_S = 300  # a longer ban is reported rather than waited out
RATE_LIMITED = (418, 429)  # 418: banned for a while
TIMEOUT_S = 30
log = logging.getLogger(__name__)  # a damaged stored file (downloaded again)

Sleep = Callable[[float], None]

# Hosts that could not be reached after MAX_ATTEMPTS (~15 s of retries): the rest of the process fails
# their downloads at once, instead of every job of a run without network waiting as long to fail.
_unreachable_hosts: set[str] = set()


class BinanceSource(Source):
    """Public spot klines (no API key), downloaded once into the cache."""
    name: ClassVar[str] = "binance"
    downloads: ClassVar[bool] = True
    base_url: str = "https://api.binance.com"
    start: IsoDate = "2024-01-01"
    end: IsoDate | None = None  # None: up to now

    @model_validator(mode="after")
    def _start_before_end(self) -> BinanceSource:
        if self.end is not None and _utc(self.start) >= _utc(self.end):
            raise ValueError(f"start {self.start} is not before end {self.end}")
        return self

    def describe(self) -> str:
        return f"Binance klines from {self.start} to {self.end or 'the time of download'}"

    def file(self, symbol: str, timeframe: str, cache: Path) -> tuple[Path, str]:
        path = self.stored_file(symbol, timeframe, cache)
        if load_stored(path, timeframe) is None:  # none yet, or damaged (removed): download them
            update(self, cache, symbol, timeframe)
        return path, f"binance:{path}"

    def stored_file(self, symbol: str, timeframe: str, cache: Path) -> Path:
        return stored_path(self, cache, symbol, timeframe)

    def download(self, symbol: str, timeframe: str, cache: Path) -> int:
        return update(self, cache, symbol, timeframe)


def _utc(date: str) -> datetime:
    stamp = datetime.fromisoformat(date)
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp


def stored_path(source: BinanceSource, cache: Path, symbol: str, timeframe: str) -> Path:
    host = urllib.parse.urlsplit(source.base_url).netloc.replace(":", "_")
    name = f"{symbol}_{timeframe}_{source.start}_{source.end or 'now'}.csv.gz"
    return cache / "candles" / "binance" / host / name


def load_stored(path: Path, timeframe: str) -> pd.DataFrame | None:
    """The candles downloaded earlier; None when there are none, or when the file is damaged: then it is removed,
    with one warning, to be downloaded again."""
    if not path.exists():
        return None
    where = f"binance:{path}"
    try:
        return candles_from_bytes(read_bytes(path, where), path, timeframe, where)
    except JobError as exc:
        log.warning("%s; downloading the candles again", exc)
        path.unlink(missing_ok=True)
        return None


def update(source: BinanceSource, cache: Path, symbol: str, timeframe: str, *, sleep: Sleep = time.sleep) -> int:
    """Download the candles the stored file lacks; returns how many were added (0: up to date)."""
    path = stored_path(source, cache, symbol, timeframe)
    where = f"binance:{path}"
    stored = load_stored(path, timeframe)
    now_ms = int(time.time() * 1000)
    end_ms = min(_date_ms(source.end) - 1, now_ms) if source.end else now_ms
    if stored is None:
        start_ms = _date_ms(source.start)
    else:
        start_ms = _ms(stored.index[-1] + timeframe_delta(timeframe))  # the next candle's open time
        if start_ms > end_ms:
            return 0  # the range is complete, or the next candle has not opened yet
    rows = fetch_klines(source.base_url, symbol, timeframe, start_ms, end_ms, sleep=sleep)
    fresh = _closed_candles(rows, now_ms)
    if stored is None and fresh.empty:
        raise JobError(f"{where}: Binance has no {symbol} {timeframe} candles from {source.start} to "
                       f"{source.end or 'now'}")
    if len(fresh):
        _write_atomic(fresh if stored is None else pd.concat([stored, fresh]), path)
    return len(fresh)


def fetch_klines(base_url: str, symbol: str, interval: str, start_ms: int, end_ms: int, *,
                 sleep: Sleep = time.sleep) -> list[list]:
    """Every kline opening in [start_ms, end_ms], page by page, as the API's arrays."""
    rows: list[list] = []
    cursor = start_ms
    while cursor <= end_ms:
        query = urllib.parse.urlencode({"symbol": symbol, "interval": interval, "startTime": cursor,
                                        "endTime": end_ms, "limit": PAGE_LIMIT})
        page = _get_json(f"{base_url.rstrip('/')}/api/v3/klines?{query}", f"binance {symbol} {interval}", sleep)
        rows += page
        if len(page) < PAGE_LIMIT:
            break
        cursor = int(page[-1][0]) + 1
    return rows


def _get_json(url: str, where: str, sleep: Sleep) -> list:
    """One API call; rate limits, 5xx answers and network errors are retried (MAX_ATTEMPTS calls in all)."""
    host = urllib.parse.urlsplit(url).netloc
    if host in _unreachable_hosts:
        raise JobError(f"{where}: {host} could not be reached earlier in this process; run the same command "
                       "again with network access")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        network_error = False
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                payload = json.load(response)
                _pause_near_weight_limit(response.headers, sleep)
                return payload
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code} {_exchange_message(exc)}"
            if exc.code not in RATE_LIMITED and exc.code < 500:
                raise JobError(f"{where}: {url} answered {problem}") from None
            wait = retry_wait(exc.headers.get("Retry-After"), attempt, BACKOFF_S)
            if wait > MAX_RETRY_AFTER_S:
                state = "rate limited" if exc.code in RATE_LIMITED else "unavailable"
                raise JobError(f"{where}: {state} ({problem}) for {wait:.0f} s; try again later") from None
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:  # URLError is an OSError
            problem, wait = str(getattr(exc, "reason", exc)), retry_wait(None, attempt, BACKOFF_S)
            network_error = isinstance(exc, urllib.error.URLError)  # no answer at all, not a bad one
        if attempt < MAX_ATTEMPTS:
            sleep(wait)
    if network_error:
        _unreachable_hosts.add(host)
    raise JobError(f"{where}: download failed after {MAX_ATTEMPTS} attempts: {problem}")


def _pause_near_weight_limit(headers, sleep: Sleep) -> None:
    used = int(headers.get("X-MBX-USED-WEIGHT-1M") or 0)
    if used >= WEIGHT_PAUSE_AT:
        sleep(60.0 - time.time() % 60.0 + 1.0)  # the weight counter resets each clock minute


def _exchange_message(exc: urllib.error.HTTPError) -> str:
    """Binance's error body is {"code": -1121, "msg": "Invalid symbol."}."""
    try:
        return json.loads(exc.read()).get("msg", "")
    except (ValueError, AttributeError, OSError):
        return exc.reason or ""


def _closed_candles(rows: list[list], now_ms: int) -> pd.DataFrame:
    """API arrays -> OHLCV frame, without the candle still open (its close time is in the future)."""
    table = pd.DataFrame([row[:7] for row in rows], columns=["open_time", *OHLCV, "close_time"])
    table = table[table["close_time"].astype(np.int64) < now_ms]
    index = pd.to_datetime(table["open_time"].astype(np.int64), unit="ms", utc=True).rename("timestamp")
    return table[list(OHLCV)].astype(np.float64).set_axis(pd.DatetimeIndex(index).as_unit("ns"))


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    """CSV.gz in ../shared's layout; gzip mtime 0 so equal candles give equal bytes (and cache keys)."""
    atomic_write(path, lambda tmp: frame.to_csv(tmp, date_format="%Y-%m-%dT%H:%M:%SZ",
                                                compression={"method": "gzip", "mtime": 0}))


def _date_ms(date: str) -> int:
    """A date of the config (checked when it loaded), UTC unless it says otherwise."""
    stamp = pd.Timestamp(date)
    return _ms(stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp)


def _ms(stamp: pd.Timestamp) -> int:
    return stamp.value // 1_000_000
