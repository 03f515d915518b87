"""The sections of a run's config that the data stage reads: where the candles come from (DataConfig, a section per
source), the features (FeaturesConfig) and the windows (WindowConfig; the heads they are cut for are trainer.heads').
config.RunConfig assembles them with the model's (model/settings.py); this package cannot import it, and what it
reads of the whole config is RunSettings.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, field_validator, model_validator

from ..specs import Strict, listed, no_duplicates
from .binance import BinanceSource
from .freqtrade import FreqtradeSource
from .hf import HfSource
from .indicators import OHLCV, Indicator
from .scalers import Scaler
from .sources import LocalSource, Source, SyntheticSource

TIMEFRAMES = ("1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d")
# data.source: a section of DataConfig each, in this order
SOURCES = tuple(source.name for source in (LocalSource, HfSource, BinanceSource, SyntheticSource, FreqtradeSource))
SCALERS = tuple(Scaler.kinds)  # window.scaler: a class each in trainer/data/scalers.py


# ----------------------------------------------------------------------------- data
def check_symbols(symbols: list[str]) -> list[str]:
    """At least one, each like BTCUSDT, no duplicates (data.symbols, features.market.symbols)."""
    if not symbols:
        raise ValueError("must list at least one symbol")
    for s in symbols:
        if not re.fullmatch(r"[A-Z0-9]{2,20}", s):
            raise ValueError(f"'{s}' is not a symbol like BTCUSDT (upper-case letters and digits)")
    no_duplicates(symbols, "symbols")
    return symbols


class DataConfig(Strict):
    source: Literal[SOURCES]
    symbols: list[str]
    timeframes: list[str]
    max_rows: int | None = Field(None, gt=0)
    local: LocalSource = LocalSource()
    hf: HfSource = HfSource()
    binance: BinanceSource = BinanceSource()
    synthetic: SyntheticSource = SyntheticSource()
    freqtrade: FreqtradeSource = FreqtradeSource()

    @property
    def chosen(self) -> Source:
        """The section that data.source names: where the run's candles come from."""
        return getattr(self, self.source)

    @field_validator("symbols")
    @classmethod
    def _symbols(cls, symbols: list[str]) -> list[str]:
        return check_symbols(symbols)

    @field_validator("timeframes")
    @classmethod
    def _timeframes(cls, timeframes: list[str]) -> list[str]:
        if not timeframes:
            raise ValueError("must list at least one timeframe")
        for tf in timeframes:
            if tf not in TIMEFRAMES:
                raise ValueError(f"unknown timeframe '{tf}' (one of {', '.join(TIMEFRAMES)})")
        no_duplicates(timeframes, "timeframes")
        return timeframes


# ----------------------------------------------------------------------------- features
MARKET_COLUMN = "market_range"  # the market input's column (data/market.py)


class MarketConfig(Strict):
    """features.market: other series' last log range at the job's timestamps, as the input column market_range
    (data/market.py). `symbols`: the reference series, or "run": the run's other symbols (data.symbols)."""
    symbols: list[str] | Literal["run"]

    @field_validator("symbols")
    @classmethod
    def _symbols(cls, symbols: list[str] | str) -> list[str] | str:
        return symbols if symbols == "run" else check_symbols(symbols)

    def references(self, run_symbols: list[str], own: str) -> list[str]:
        """A job's reference symbols: those listed, or the run's, but never the job's own."""
        return [s for s in (run_symbols if self.symbols == "run" else self.symbols) if s != own]


class FeaturesConfig(Strict):
    base: list[Literal[OHLCV]] = ["open", "high", "low", "close"]
    indicators: list[listed(Indicator)] = []
    market: MarketConfig | None = None

    @model_validator(mode="after")
    def _unique_columns(self) -> FeaturesConfig:
        no_duplicates(self.columns, "feature columns")
        return self

    @property
    def columns(self) -> list[str]:
        """Model input columns, in order: the base OHLC(V) columns, the indicators, then the market input."""
        return list(self.base) + [ind.name for ind in self.indicators] + [MARKET_COLUMN] * (self.market is not None)


# ----------------------------------------------------------------------------- window
class Split(Strict):
    train: float = Field(0.7, gt=0, lt=1)
    val: float = Field(0.15, gt=0, lt=1)
    test: float = Field(0.15, gt=0, lt=1)

    @model_validator(mode="after")
    def _sums_to_one(self) -> Split:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + val + test must sum to 1 (got {total:g})")
        return self


class WindowConfig(Strict):
    lookback: int = Field(gt=0)
    horizon: int = Field(gt=0)
    split: Split = Split()
    scaler: Literal[SCALERS] = "standard"
    # last_close: every window is seen relative to its last close (price levels as log ratios to it, price
    # differences divided by it; targets are log returns from it), so an all-zero output is "no change".
    # null: absolute price levels, as the old scripts did (their models cannot reach prices outside the
    # train split's range).
    relative_to: Literal["last_close"] | None = "last_close"
    # Relative framing only: each head's forecast deviation from "no change" is weighted by a factor in
    # [0, 1] chosen on the validation split (forecast combination with the no-change forecast), so that a
    # model's noise is not shipped where validation finds no signal. false: the network's output as it is.
    shrink: bool = True


# ----------------------------------------------------------------------------- the whole config
class RunSettings(Protocol):
    """What the data stage reads of a run's whole config (config.RunConfig is one): its sections, where the cache
    is, and the fingerprint that names the run (data.input_digest)."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def features(self) -> FeaturesConfig: ...

    @property
    def window(self) -> WindowConfig: ...

    @property
    def cache_path(self) -> Path: ...

    def fingerprint(self) -> str: ...
