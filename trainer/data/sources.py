"""Where a job's candles come from: one class per source, each a section of the config's `data` (data.local,
data.hf, ...) that knows how to give a job's candles, whether `cryptotrain data download` fetches them, and
which file on this machine holds them. `data.source` names the one a run uses (DataConfig.chosen).

A new source is one class (a subclass of Source with its `name`, its settings as fields, `file` or
`candles`, and `describe`): here, or beside the code that fetches its candles (binance.py, hf.py,
freqtrade.py); and its section in settings.DataConfig.
"""
from __future__ import annotations

from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, ClassVar

import pandas as pd
from pydantic import AfterValidator, Field

from ..errors import JobError
from ..files import beside_package
from ..specs import Strict
from .files import candles_from_bytes, file_format, job_filename, read_bytes
from .store import code_digest, make_key
from .store import load as load_entry
from .store import save as save_entry
from .synthetic import synthetic_candles

# What a parsed entry depends on besides the file's bytes: the parsing code and the libraries.
PARSER_VERSION = make_key(code_digest("files", "validate", "store"),
                                *(version(package) for package in ("pyarrow", "pandas", "numpy")))
BUNDLED_CANDLES = Path("data/ohlcv")  # the real candles bundled with cryptotrain (data/ohlcv/SOURCES.md)


def check_file_pattern(pattern: str) -> str:
    try:
        pattern.format(symbol="BTCUSDT", timeframe="1h")
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"{pattern!r} may only use the placeholders {{symbol}} and {{timeframe}}") from None
    return pattern


def check_repo_id(repo_id: str) -> str:
    from huggingface_hub.errors import HFValidationError  # the Hub client's own rule, imported when needed
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    return repo_id


def _date(date: str) -> str:
    try:
        datetime.fromisoformat(date)
    except ValueError:
        raise ValueError(f"{date!r} is not a date (YYYY-MM-DD, UTC)") from None
    return date


FilePattern = Annotated[str, AfterValidator(check_file_pattern)]  # a file name per symbol and timeframe
RepoId = Annotated[str, AfterValidator(check_repo_id)]
IsoDate = Annotated[str, AfterValidator(_date)]


class Source(Strict):
    """One source of candles. `kinds`: every source by its name."""
    kinds: ClassVar[dict[str, type[Source]]] = {}
    name: ClassVar[str]
    synthetic: ClassVar[bool] = False  # generated candles, labelled so wherever they are shown
    downloads: ClassVar[bool] = False  # fetched over the network: `cryptotrain data download` has work to do
    # Its candles are the user's own files: where a label of them is shown to others (a model card), the file's
    # name alone, not the directories of the machine that read them.
    private_files: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        Source.kinds[cls.name] = cls

    def describe(self) -> str:
        """Where the run's candles come from, in words (the run report's header)."""
        raise NotImplementedError(f"source {self.name} has no describe()")

    @property
    def dataset(self) -> str | None:
        """The Hugging Face dataset the candles come from, if they do (a model card names it)."""
        return None

    @staticmethod
    def public_label(label: str) -> str:
        """A label of a job's candles (`candles`) as others may see it: the source that wrote it keeps its files'
        directories to itself (private_files)."""
        name, _, where = label.partition(":")
        source = Source.kinds.get(name)
        return f"{name}:{Path(where).name}" if source is not None and source.private_files else label

    def candles(self, symbol: str, timeframe: str, cache: Path) -> tuple[pd.DataFrame, str]:
        """The job's validated candles, every row the source has, and where they came from (a label such as
        "local:/abs/BTCUSDT_1h.csv.gz"). A file is parsed once: the parsed frame is cached by its bytes."""
        path, label = self.file(symbol, timeframe, cache)
        raw = read_bytes(path, label)
        key = make_key(raw, file_format(path), timeframe, PARSER_VERSION)
        frame = load_entry(cache / "candles" / "parsed", key)
        if frame is None:
            frame = candles_from_bytes(raw, path, timeframe, label)
            save_entry(cache / "candles" / "parsed", key, frame)
        return frame, label

    def file(self, symbol: str, timeframe: str, cache: Path) -> tuple[Path, str]:
        """The job's candle file on this machine (fetched first where it must be) and its label; a JobError
        saying what is missing where."""
        raise NotImplementedError(f"source {self.name} has no file()")

    def stored_file(self, symbol: str, timeframe: str, cache: Path) -> Path | None:
        """Where the job's candles are on this machine, fetching nothing (whether or not the file is there):
        what a job's input digest reads. None for a source with no such file."""
        return None

    def download(self, symbol: str, timeframe: str, cache: Path) -> int | None:
        """Bring the job's candles up to date in the cache, before `candles` reads them: how many are new, or
        None where the source does not say."""
        return None


class LocalSource(Source):
    """A directory of CSV / CSV.gz / Parquet files, one per symbol and timeframe."""
    name: ClassVar[str] = "local"
    private_files: ClassVar[bool] = True
    path: Path = BUNDLED_CANDLES
    pattern: FilePattern = "{symbol}_{timeframe}.csv.gz"

    def describe(self) -> str:
        return f"local files {self.path}/{self.pattern}"

    def directory(self) -> Path:
        """`path`, relative to the cwd. The default, data/ohlcv, where the cwd has no such directory (cryptotrain
        installed with pip, run anywhere), is the copy of the bundled candles installed with the package."""
        if self.path == BUNDLED_CANDLES and not self.path.is_dir():
            return beside_package("bundled_data/ohlcv", BUNDLED_CANDLES)
        return self.path

    def file(self, symbol: str, timeframe: str, cache: Path) -> tuple[Path, str]:
        path = self.stored_file(symbol, timeframe, cache).resolve()
        if not path.is_file():
            raise JobError(f"local:{path}: no such file; {self._holdings(timeframe)} (data.local.path, or --set "
                           "data.source=hf or binance)")
        return path, f"local:{path}"

    def stored_file(self, symbol: str, timeframe: str, cache: Path) -> Path:
        return self.directory() / job_filename(self.pattern, symbol, timeframe)

    def _holdings(self, timeframe: str) -> str:
        """What the directory does hold for a timeframe, to say beside a missing file."""
        directory = self.directory()
        if not directory.is_dir():
            return f"there is no directory {directory}"
        prefix, _, suffix = job_filename(self.pattern, "\0", timeframe).partition("\0")
        symbols = sorted(p.name[len(prefix):len(p.name) - len(suffix)] for p in directory.glob(f"{prefix}*{suffix}")
                         if p.name.startswith(prefix) and p.name.endswith(suffix))
        return f"{directory} has {timeframe} candles for {', '.join(symbols) or 'no symbol'}"


class SyntheticSource(Source):
    """Deterministic generated candles, for demos and tests only (always labelled synthetic)."""
    name: ClassVar[str] = "synthetic"
    synthetic: ClassVar[bool] = True
    seed: int = 7
    rows: int = Field(3000, gt=0)

    def describe(self) -> str:
        return f"SYNTHETIC candles (seed {self.seed}, {self.rows} rows)"

    def candles(self, symbol: str, timeframe: str, cache: Path) -> tuple[pd.DataFrame, str]:
        return synthetic_candles(symbol, timeframe, self.seed, self.rows), f"synthetic(seed={self.seed})"
