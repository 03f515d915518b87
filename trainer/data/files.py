"""Candle files (CSV, CSV.gz, Parquet, Feather, freqtrade's JSON / JSON.gz) -> validated candle frames.

Three column layouts are accepted: ../shared's (timestamp, open, high, low, close, volume), the old
Hugging Face dataset's (open_time, open, high, low, close, volume, close_time) and freqtrade's (date,
open, high, low, close, volume). Other columns are ignored; names are matched case-insensitively.
pyarrow decompresses and parses in C++ (ISO timestamps included), about twice as fast as pandas' own
CSV reader. A .json / .json.gz file is read as freqtrade writes candles: a list of
[timestamp_ms, open, high, low, close, volume] rows, without names.
"""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv
import pyarrow.feather
import pyarrow.parquet

from ..errors import JobError
from .validate import OHLCV, validate

TIME_COLUMNS = ("timestamp", "open_time", "date")
FORMATS = (".csv", ".csv.gz", ".parquet", ".feather", ".json", ".json.gz")
JSON_ROW = "[timestamp_ms, open, high, low, close, volume]"


def job_filename(pattern: str, symbol: str, timeframe: str) -> str:
    """A file-name pattern of the config (its placeholders checked when the config loaded) for one job."""
    return pattern.format(symbol=symbol, timeframe=timeframe)


def read_bytes(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise JobError(f"{where}: no such file") from None
    except OSError as exc:
        raise JobError(f"{where}: cannot read the file: {exc.strerror or exc}") from None


def file_format(path: Path) -> str:
    """How a candle file is read, by its name: one of FORMATS, or its last suffix when it is none of them."""
    name = path.name.lower()
    return next((ext for ext in FORMATS if name.endswith(ext)), "." + name.rsplit(".", 1)[-1])


def candles_from_bytes(raw: bytes, path: Path, timeframe: str, where: str) -> pd.DataFrame:
    """The file's bytes (its name decides the format) -> validated candles, see validate()."""
    kind = file_format(path)
    if kind in (".json", ".json.gz"):
        times, columns = _json_rows(raw, kind == ".json.gz", where)
        return validate(times, columns, timeframe, where)
    table = _read_table(raw, kind, where)
    by_name = {name.strip().lower(): i for i, name in enumerate(table.column_names)}
    time_column = next((c for c in TIME_COLUMNS if c in by_name), None)
    missing = [c for c in OHLCV if c not in by_name]
    if time_column is None or missing:
        wanted = ", ".join(missing + ([] if time_column else ["timestamp (or open_time, date)"]))
        raise JobError(f"{where}: missing column(s) {wanted}; found {', '.join(table.column_names)}")

    def column(name: str):
        return table.column(by_name[name]).to_numpy(zero_copy_only=False)

    return validate(column(time_column), {c: column(c) for c in OHLCV}, timeframe, where)


def _read_table(raw: bytes, kind: str, where: str) -> pa.Table:
    try:
        if kind == ".parquet":
            return pyarrow.parquet.read_table(pa.BufferReader(raw))
        if kind == ".feather":
            return pyarrow.feather.read_table(pa.BufferReader(raw))
        if kind in (".csv", ".csv.gz"):
            stream = pa.input_stream(pa.py_buffer(raw), compression="gzip" if kind == ".csv.gz" else None)
            return pyarrow.csv.read_csv(stream)
    except (pa.ArrowException, OSError) as exc:
        raise JobError(f"{where}: cannot read the file: {str(exc).splitlines()[0]}") from None
    raise JobError(f"{where}: unsupported file type (expected .csv, .csv.gz, .parquet, .feather, .json or .json.gz)")


def _json_rows(raw: bytes, gzipped: bool, where: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """freqtrade's JSON candles -> the time column (epoch ms) and the OHLCV columns, for validate()."""
    try:
        rows = json.loads(gzip.decompress(raw) if gzipped else raw)
    except (OSError, EOFError, zlib.error, ValueError) as exc:  # gzip's, zlib's and JSON's (and UTF-8's) errors
        raise JobError(f"{where}: cannot read the file: {str(exc).splitlines()[0]}") from None
    if not isinstance(rows, list):
        raise JobError(f"{where}: expected a JSON list of {JSON_ROW} rows (freqtrade's format), "
                       f"found a {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 6:
            shown = json.dumps(row)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise JobError(f"{where}: row {i + 1}: expected {JSON_ROW}, found {shown}")
    times, *values = ([row[i] for row in rows] for i in range(6))
    return _json_times(times, where), {column: _json_values(v) for column, v in zip(OHLCV, values)}


def _json_times(times: list, where: str) -> np.ndarray:
    """Epoch numbers (freqtrade writes int milliseconds) as int64, or float64 where some are not integers;
    validate() checks their range."""
    bad = next((i for i, t in enumerate(times) if type(t) not in (int, float)), None)
    if bad is not None:
        raise JobError(f"{where}: row {bad + 1}: timestamp {json.dumps(times[bad])} is not a number (epoch "
                       "milliseconds)")
    if all(type(t) is int for t in times):
        try:
            return np.array(times, dtype=np.int64)
        except OverflowError:
            pass
    return np.array(times, dtype=np.float64)


def _json_values(values: list) -> np.ndarray:
    """Numbers as float64; a column with anything else stays as it is (strings, null) for validate() to report."""
    if all(type(v) in (int, float) for v in values):
        return np.array(values, dtype=np.float64)
    return np.array([v if v is None or type(v) in (int, float, str) else json.dumps(v) for v in values], dtype=object)
