"""A freqtrade data directory read as it is (`data.source: freqtrade`).

freqtrade's `download-data` keeps one file per pair and timeframe in `user_data/data/<exchange>/`, named
`<BASE>_<QUOTE>-<timeframe>.<ext>` (the pair's `/` written as `_`: BTC/USDT at 1h is BTC_USDT-1h.feather),
in its data format: feather (the default), parquet, json or jsongz (extension .json.gz). The columns
are freqtrade's (date = candle open time, UTC; open, high, low, close, volume); files.py reads every format
and validate.py checks the rows, as for any local file.

A config symbol (BTCUSDT) is the pair without its separator: the file of a job is the one whose pair, its
`_` taken out, is the symbol. So any quote asset is found; the known quote assets below only name the file
that was expected when there is none. A symbol that two files could be (the same pair in two formats, or
BTC_USDT and BTCU_SDT) is an error naming them, never a guess.

Futures: freqtrade keeps them apart, in `<exchange>/futures/`, named
`<BASE>_<QUOTE>_<SETTLE>-<timeframe>-futures.<ext>` (BTC/USDT:USDT). Point data.freqtrade.path at that
directory to train on them: there BTC_USDT_USDT-1h-futures.feather is BTCUSDT's 1h file. Mark, index
and funding-rate candles (`-mark`, `-index`, `-funding_rate`, ...) are not the pair's trades and are never
read. The `futures/` subdirectory is not searched from the exchange directory, so spot and futures
candles of a pair never compete for one job.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from ..errors import JobError
from .sources import Source

FORMATS = ("feather", "parquet", "json", "json.gz")  # freqtrade's file extensions, in its default's order
# Quote assets a symbol may end with, longest first where one ends another (FDUSD before USD): only used to
# name the expected file in the message for a missing one.
QUOTES = ("FDUSD", "USDT", "USDC", "BUSD", "TUSD", "USDP", "DAI", "USD", "EUR", "GBP", "TRY", "BRL", "JPY",
          "BTC", "ETH", "BNB")


class FreqtradeSource(Source):
    """A freqtrade data directory as it is: <BASE>_<QUOTE>-<timeframe>.feather / .parquet / .json / .json.gz
    (this module)."""
    name: ClassVar[str] = "freqtrade"
    private_files: ClassVar[bool] = True
    path: Path = Path("user_data/data/binance")  # freqtrade's datadir for the exchange; relative to the cwd

    def describe(self) -> str:
        return f"freqtrade data directory {self.path}"

    def file(self, symbol: str, timeframe: str, cache: Path) -> tuple[Path, str]:
        path = job_file(self, symbol, timeframe).resolve()
        return path, f"freqtrade:{path}"

    def stored_file(self, symbol: str, timeframe: str, cache: Path) -> Path | None:
        """The job's one file; none (absent, or several: which is unknown) is None."""
        found = candidates(self.path, symbol, timeframe)
        return found[0] if len(found) == 1 else None


def job_file(source: FreqtradeSource, symbol: str, timeframe: str) -> Path:
    """The one file holding the symbol's candles at the timeframe; a JobError naming the directory and
    what it holds for that timeframe when there is none, or more than one."""
    directory = source.path
    found = candidates(directory, symbol, timeframe)
    if len(found) == 1:
        return found[0]
    where = f"freqtrade:{directory.resolve()}"
    if found:
        raise JobError(f"{where}: {len(found)} files could be {symbol} {timeframe}: "
                       f"{', '.join(p.name for p in found)}; keep one (or point data.freqtrade.path elsewhere)")
    pair = split_symbol(symbol)
    expected = f"{pair[0]}_{pair[1]}-{timeframe}" if pair else f"<BASE>_<QUOTE>-{timeframe}"
    download = f"freqtrade download-data --pairs {pair[0]}/{pair[1]}" if pair else "freqtrade download-data"
    raise JobError(f"{where}: no {symbol} {timeframe} candles ({expected}.feather, .parquet, .json or .json.gz); "
                   f"{holdings(directory, timeframe)} (data.freqtrade.path, or {download} --timeframes {timeframe})")


def candidates(directory: Path, symbol: str, timeframe: str) -> list[Path]:
    """Every file in the directory that holds the symbol's candles at the timeframe (sorted by name)."""
    return sorted((path for path, held in _held(directory, timeframe) if held == symbol), key=lambda p: p.name)


def holdings(directory: Path, timeframe: str) -> str:
    """What a freqtrade directory does hold for a timeframe, as config symbols, to say beside a missing one."""
    if not directory.is_dir():
        return f"there is no directory {directory}"
    symbols = sorted({symbol for _, symbol in _held(directory, timeframe)})
    return f"{directory} has {timeframe} candles for {', '.join(symbols) or 'no symbol'}"


def split_symbol(symbol: str) -> tuple[str, str] | None:
    """BTCUSDT -> ("BTC", "USDT") by the known quote assets; None when it ends in none of them."""
    quote = next((q for q in QUOTES if symbol.endswith(q) and len(symbol) > len(q)), None)
    return (symbol[:-len(quote)], quote) if quote else None


def _held(directory: Path, timeframe: str) -> list[tuple[Path, str]]:
    """(file, config symbol) for each candle file of the timeframe in the directory."""
    name = re.compile(rf"(?P<pair>[A-Za-z0-9_]+)-{re.escape(timeframe)}(?P<futures>-futures)?"
                      rf"\.(?:{'|'.join(re.escape(ext) for ext in FORMATS)})")
    try:
        entries = list(directory.iterdir())
    except OSError:  # no directory (or an unreadable one): it holds nothing
        return []
    held = []
    for path in entries:
        match = name.fullmatch(path.name)
        if match is None or not path.is_file():
            continue
        parts = match["pair"].upper().split("_")
        if match["futures"]:  # BASE_QUOTE_SETTLE: the settlement currency is not part of the symbol
            parts = parts[:-1] if len(parts) >= 3 else []
        if len(parts) >= 2:
            held.append((path, "".join(parts)))
    return held
