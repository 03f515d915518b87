"""Content-addressed on-disk store of float64 frames (parsed candles, features), and of named arrays (a job's fitted
baselines: save_arrays, load_arrays; an .npz whose members carry their own CRC-32).

An entry is one file named by its key, the caller's sha256 of everything that determines the frame,
so an entry can never be stale. It holds a JSON header line (column names, row count, CRC-32 of the
body), then the body: the index as int64 ns, then the values column after column as float64. One read
brings it back, in about a millisecond for 10,000 rows x 16 columns.
The frame comes back in pandas' own layout (one float64 block, each column contiguous), the layout
in which the parser and compute_features build theirs: numpy's sums depend on the layout, and a
cache hit must give the same training results, to the last bit, as the computation it replaces.
Writes are atomic (temp file + rename). The checksum covers the whole body: a truncated or corrupt
entry (a crash, a full disk, a power cut before the data reached the disk) is detected, reported,
removed and treated as a miss, so entries need no fsync.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import atomic_write, one_at_a_time

log = logging.getLogger(__name__)

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


def code_digest(*modules: str) -> str:
    """sha256 of the source files of these modules of trainer.data (e.g. "files"): editing the code that made an
    entry (this module included, for the entry format) retires the entry."""
    return make_key(*(Path(__file__).with_name(f"{module}.py").read_bytes() for module in modules))


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
            header = json.loads(entry.readline())
            body = np.fromfile(entry, dtype=np.uint8)
        columns, rows, checksum = header["columns"], header["rows"], header["crc32"]
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):  # no entry (a file where the cache should
        return None  # be, a directory where the entry should be: save() finds it in the way and says so)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _discard(path, f"unreadable: {exc}")
    if body.size != 8 * rows * (1 + len(columns)) or zlib.crc32(body) != checksum:
        return _discard(path, "its body does not match its header's size or checksum")
    index = pd.DatetimeIndex(body[:8 * rows].view(np.int64), tz="UTC", name="timestamp")
    return frame_of_columns(body[8 * rows:].view(np.float64).reshape(len(columns), rows), columns, index)


def save(directory: Path, key: str, frame: pd.DataFrame) -> None:
    """Store `frame` (tz-aware UTC index, float64 columns) under `key`, atomically. The cache only saves
    time: where it cannot be written (a full disk, no permission, a file in the way), the frame is used
    from memory and the cache is left alone, with one warning per directory."""
    _kept(directory, lambda: _write(directory, key, frame))


def _kept(directory: Path, write: Callable[[], None]) -> None:
    """write() an entry of `directory`; where it cannot, one warning per directory (see save)."""
    try:
        write()
    except OSError as exc:
        if directory not in _unwritable:
            _unwritable.add(directory)
            log.warning("cache %s cannot be written (%s): computing in memory instead", directory,
                        exc.strerror or exc)


_unwritable: set[Path] = set()  # cache directories found unwritable in this process (warned once)


def _write(directory: Path, key: str, frame: pd.DataFrame) -> None:
    body = b"".join((frame.index.as_unit("ns").asi8.tobytes(), frame.to_numpy(np.float64).T.tobytes()))
    header = {"columns": [str(column) for column in frame.columns], "rows": len(frame), "crc32": zlib.crc32(body)}
    _write_entry(directory / f"{key}{SUFFIX}", json.dumps(header).encode() + b"\n" + body)


ARRAYS_SUFFIX = ".arrays"


def load_arrays(directory: Path, key: str) -> dict[str, np.ndarray] | None:
    """The stored float64 arrays by name, or None when absent or damaged (a damaged entry is logged and removed)."""
    path = directory / f"{key}{ARRAYS_SUFFIX}"
    try:
        with open(path, "rb") as entry:
            header = json.loads(entry.readline())
            body = np.fromfile(entry, dtype=np.uint8)
        shapes, checksum = {name: tuple(shape) for name, shape in header["arrays"]}, header["crc32"]
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _discard(path, f"unreadable: {exc}")
    sizes = [math.prod(shape) for shape in shapes.values()]
    if body.size != 8 * sum(sizes) or zlib.crc32(body) != checksum:
        return _discard(path, "its body does not match its header's size or checksum")
    values = body.view(np.float64)
    ends = np.cumsum(sizes)
    return {name: values[end - size:end].reshape(shape)
            for (name, shape), size, end in zip(shapes.items(), sizes, ends)}


def save_arrays(directory: Path, key: str, arrays: dict[str, np.ndarray]) -> None:
    """Store named float64 arrays under `key`, atomically (a JSON header of their names and shapes, and the CRC-32
    of the body: their values one after the other); where the cache cannot be written, as save()."""
    body = b"".join(np.ascontiguousarray(value, np.float64).tobytes() for value in arrays.values())
    header = {"arrays": [[name, list(np.shape(value))] for name, value in arrays.items()], "crc32": zlib.crc32(body)}
    _kept(directory, lambda: _write_entry(directory / f"{key}{ARRAYS_SUFFIX}",
                                          json.dumps(header).encode() + b"\n" + body))


def _write_entry(path: Path, content: bytes) -> None:
    """An entry written atomically (no fsync: its checksum finds what a power cut left of it), unless one is there
    already: its key names its content, so another process wrote the same bytes (two processes sharing a run
    prepare the same jobs ahead), and replacing it would only send the first to a drive's trash. The look and the
    write are one step for this machine's processes (one_at_a_time), so two never both find it missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with one_at_a_time(path.parent):
        if not path.is_file():  # a directory in the way: the rename fails and save() says so
            atomic_write(path, lambda tmp: tmp.write_bytes(content), durable=False)


def _discard(path: Path, why: str) -> None:
    log.warning("cache entry %s is damaged (%s): recomputing it", path, why)
    with contextlib.suppress(OSError):  # unremovable: save() finds it in the way and says so
        path.unlink(missing_ok=True)
