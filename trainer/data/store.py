"""Content-addressed on-disk store of float64 frames (parsed candles, features).

An entry is one file named by its key, the caller's sha256 of everything that determines the frame,
so an entry can never be stale. It holds four successive .npy arrays (a CRC-32 checksum, the column
names, the index as int64 ns, the values column after column), read back in about a millisecond.
The frame comes back in pandas' own layout (one float64 block, each column contiguous), the layout
in which the parser and compute_features build theirs: numpy's sums depend on the layout, and a
cache hit must give the same training results, to the last bit, as the computation it replaces.
Writes are atomic (temp file + rename). The checksum covers the other three arrays: a truncated or
corrupt entry (a crash, a full disk, a power cut before the data reached the disk) is detected,
reported, removed and treated as a miss, so entries need no fsync.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

log = logging.getLogger("cryptotrain")

SUFFIX = ".frame"


def make_key(*parts: str | bytes | np.ndarray) -> str:
    """sha256 over the parts (arrays C-contiguous), each length-prefixed so that no two different
    lists of parts share a key."""
    digest = hashlib.sha256()
    for part in parts:
        data = memoryview(part.encode() if isinstance(part, str) else part).cast("B")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def code_digest(*modules: ModuleType) -> str:
    """sha256 of the modules' source files: editing the code that made an entry (this module
    included, for the entry format) retires the entry."""
    return make_key(*(Path(module.__file__).read_bytes() for module in modules))


def frame_of_columns(values: np.ndarray, columns: list[str], index: pd.DatetimeIndex) -> pd.DataFrame:
    """A frame over `values` (columns x rows, C-contiguous) without a copy: pandas keeps exactly
    this array as its block, each column contiguous, as it lays out a frame itself."""
    return pd.DataFrame(values.T, columns=columns, index=index, copy=False)


def frame_digest(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    """sha256 of the exact content of some columns of a frame: names, index instants, float64 values."""
    return make_key("\0".join(columns), frame.index.as_unit("ns").asi8,
                    *(np.ascontiguousarray(frame[column].to_numpy(np.float64)) for column in columns))


def load(directory: Path, key: str) -> pd.DataFrame | None:
    """The stored frame, or None when absent or damaged (a damaged entry is logged and removed)."""
    path = directory / f"{key}{SUFFIX}"
    try:
        with open(path, "rb") as entry:
            checksum, columns, index, values = (np.load(entry, allow_pickle=False) for _ in range(4))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as exc:
        return _discard(path, f"unreadable: {exc}")
    if values.shape != (len(columns), len(index)) or _checksum(columns, index, values) != checksum.item():
        return _discard(path, "its arrays do not match their checksum or each other")
    return frame_of_columns(values, columns.tolist(), pd.DatetimeIndex(index, tz="UTC", name="timestamp"))


def save(directory: Path, key: str, frame: pd.DataFrame) -> None:
    """Store `frame` (tz-aware UTC index, float64 columns) under `key`, atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = _arrays(frame)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            for array in (np.array(_checksum(*arrays)), *arrays):
                np.save(tmp, array, allow_pickle=False)
        os.replace(tmp_name, directory / f"{key}{SUFFIX}")
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


def _arrays(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(column names, index as int64 ns, values as a (columns, rows) C-contiguous float64 array)."""
    return (np.array(frame.columns, dtype=str), frame.index.as_unit("ns").asi8,
            np.ascontiguousarray(frame.to_numpy(np.float64).T))


def _checksum(columns: np.ndarray, index: np.ndarray, values: np.ndarray) -> int:
    """CRC-32, as zip and gzip use: detects accidental damage at a third of sha256's cost."""
    crc = zlib.crc32("\0".join(columns.tolist()).encode())
    for array in (index, values):
        crc = zlib.crc32(np.ascontiguousarray(array), crc)
    return crc


def _discard(path: Path, why: str) -> None:
    log.warning("cache entry %s is damaged (%s): recomputing it", path, why)
    path.unlink(missing_ok=True)
