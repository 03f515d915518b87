"""Crash-safe file writing, strict JSON and hashing, shared by the stages that persist state; and stderr kept off the
terminal at file-descriptor level."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path


def atomic_write(path: Path, write: Callable[[Path], object], durable: bool = True) -> None:
    """`write(tmp_path)`, fsync, rename: a kill leaves the old file or the new one, never half of one
    (and perhaps the temp file, which remove_abandoned_temp_files clears). Not `durable` (no fsync): after a power
    cut the new file may be empty or partial, for a file its reader checks anyway (a cache entry's checksum)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        write(tmp)
        if durable:
            fsync(tmp)
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: no half-written temp file left behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


TEMP_PREFIX = "tmp"


def temp_path(path: Path) -> Path:
    """Where atomic_write writes `path` before renaming it into place (a file already there is overwritten in place:
    EpochCheckpoint moves a file it no longer needs there, so that nothing is deleted, for a drive's trash to
    keep)."""
    return path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{path.name}")  # same suffix: Keras, numpy, pandas check it


@contextlib.contextmanager
def one_at_a_time(directory: Path) -> Iterator[None]:
    """This machine's processes enter one at a time for `directory`: an exclusive flock on the directory itself
    (nothing is written for it, so nothing reaches a drive's trash), released on leaving. A FUSE mount without locks
    of its own (Google Drive on Colab) gets the kernel's. Where the filesystem refuses the lock (NFS takes an
    exclusive one only on a file open for writing), unlocked: for what it guards (store's entries), a second writer
    costs time, never correctness."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # the lock goes with it


def remove_abandoned_temp_files(directory: Path) -> None:
    """atomic_write's temp files anywhere under `directory` whose process is gone (killed mid-write)."""
    for tmp in directory.rglob(f"{TEMP_PREFIX}*-*"):
        pid = tmp.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)) and tmp.is_file():
            tmp.unlink(missing_ok=True)


def write_json(path: Path, data: dict) -> None:
    path.write_bytes(json_bytes(data))


def json_bytes(data: dict) -> bytes:
    """Strict JSON: a NaN or infinity is an error here, never a bare NaN/Infinity token in the file."""
    return json.dumps(data, indent=1, default=_json_default, allow_nan=False).encode()


def _json_default(value):
    # Imported here: a value json cannot write as it is comes from numpy or pandas (or is refused), so they are
    # loaded already; this module stays light for the ledger and the CLI, which need neither.
    import numpy as np
    import pandas as pd

    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, (pd.Timestamp, np.datetime64)):
        return pd.Timestamp(value).isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine. A zombie does not: killed, it may stay one a while (its
    threads torn down, its parent yet to reap it), and a run started again at once must not wait for it."""
    try:
        os.kill(pid, 0)  # signal 0 only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, but belongs to another user
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:  # no /proc (macOS): it exists
        return True
    return state not in ("Z", "X")


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null meanwhile: what native code (TensorFlow's C++ log) writes there never
    reaches the terminal. Python's own stderr writes are lost too: keep the block short."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def beside_package(in_wheel: str, in_checkout: Path) -> Path:
    """A directory the wheel installs inside the package (pyproject's force-include), or the checkout's own
    for an editable install."""
    here = Path(__file__).resolve().parent
    wheel_dir = here / in_wheel
    return wheel_dir if wheel_dir.is_dir() else here.parent / in_checkout
