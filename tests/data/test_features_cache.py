"""The on-disk feature cache: hits, never stale (candles, parameters, code and library versions are
in the key), atomic writes, and damaged entries detected, reported and recomputed."""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import CANDLES_DIR, REPO
from trainer import files
from trainer.config import FeaturesConfig
from trainer.data import features as features_module
from trainer.data import read_candles_file
from trainer.data.features import compute_features, load_features

SPEC = FeaturesConfig(indicators=[{"name": "rsi", "window": 14}, {"name": "bb_upper", "window": 20, "std": 2.0},
                                  {"name": "atr", "window": 14}, {"name": "volume_norm", "window": 20}])


@pytest.fixture(scope="module")
def candles() -> pd.DataFrame:
    return read_candles_file(CANDLES_DIR / "ETHUSDT_1h.csv.gz", "1h").iloc[-800:]


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "features").iterdir())


def test_second_load_is_a_hit_with_identical_features(tmp_path, candles):
    first, hit = load_features(candles, SPEC, tmp_path)
    assert not hit and len(entries(tmp_path)) == 1
    second, hit = load_features(candles, SPEC, tmp_path)
    assert hit
    pd.testing.assert_frame_equal(second, first, check_exact=True)
    pd.testing.assert_frame_equal(second, compute_features(candles, SPEC))
    assert second.attrs == candles.attrs
    assert [p.name for p in (tmp_path / "features").iterdir() if p.name.startswith("tmp")] == []  # no temp files left


def test_a_hit_gives_bit_identical_results_downstream(tmp_path, candles):
    """Same bits and same memory layout: numpy's sums depend on the layout, and a run that hits the
    cache must train exactly like the run that filled it."""
    computed, _ = load_features(candles, SPEC, tmp_path)
    cached, hit = load_features(candles, SPEC, tmp_path)
    assert hit
    for statistic in (np.mean, np.std, np.min):
        assert np.array_equal(statistic(cached.to_numpy(), axis=0), statistic(computed.to_numpy(), axis=0))
    columns = ["close", "rsi", "atr"]
    assert np.array_equal(cached[columns].to_numpy().std(axis=0), computed[columns].to_numpy().std(axis=0))


def test_editing_one_candle_never_serves_a_stale_entry(tmp_path, candles):
    load_features(candles, SPEC, tmp_path)
    for column in ("close", "volume", "high"):
        edited = candles.copy()
        edited.iloc[500, edited.columns.get_loc(column)] *= 1.0000001
        features, hit = load_features(edited, SPEC, tmp_path)
        assert not hit, column
        pd.testing.assert_frame_equal(features, compute_features(edited, SPEC))
    moved = candles.set_axis(candles.index + pd.Timedelta("1h"))  # same values, other times
    assert not load_features(moved, SPEC, tmp_path)[1]


def test_changing_one_indicator_parameter_never_serves_a_stale_entry(tmp_path, candles):
    load_features(candles, SPEC, tmp_path)
    for change in ({"window": 15}, {"std": 2.5}):
        indicators = [i.model_dump() for i in SPEC.indicators]
        indicators[1].update(change)  # bb_upper
        changed = FeaturesConfig(indicators=indicators)
        features, hit = load_features(candles, changed, tmp_path)
        assert not hit, change
        pd.testing.assert_frame_equal(features, compute_features(candles, changed))
    reordered = FeaturesConfig(indicators=SPEC.indicators[::-1])
    features, hit = load_features(candles, reordered, tmp_path)
    assert not hit and list(features.columns)[5:] == [i.name for i in reordered.indicators]


def test_other_feature_code_or_library_versions_miss(tmp_path, candles, monkeypatch):
    load_features(candles, SPEC, tmp_path)
    monkeypatch.setattr(features_module, "FEATURE_VERSION", "another version of features.py or of ta")
    assert not load_features(candles, SPEC, tmp_path)[1]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_reported_and_recomputed(tmp_path, candles, caplog, damage):
    expected, _ = load_features(candles, SPEC, tmp_path)
    [entry] = entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) * 2 // 3]
    elif damage == "flip":
        data[-1000] ^= 0x10  # one bit of one value
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not an entry at all" * 10)
    entry.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="trainer"):
        features, hit = load_features(candles, SPEC, tmp_path)
    assert not hit
    assert f"cache entry {entry} is damaged" in caplog.text and "recomputing" in caplog.text
    pd.testing.assert_frame_equal(features, expected)
    assert load_features(candles, SPEC, tmp_path)[1]  # the recomputed entry is good again


def test_an_entry_whose_header_disagrees_with_its_body_is_recomputed(tmp_path, candles, caplog):
    """E.g. a body of another length than the header's rows and columns: a valid checksum, wrong shape."""
    expected, _ = load_features(candles, SPEC, tmp_path)
    [entry] = entries(tmp_path)
    header, body = entry.read_bytes().split(b"\n", 1)
    fields = json.loads(header)
    body = body[: 8 * (fields["rows"] - 1) * (1 + len(fields["columns"]))]  # one row short
    entry.write_bytes(json.dumps({**fields, "crc32": zlib.crc32(body)}).encode() + b"\n" + body)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        features, hit = load_features(candles, SPEC, tmp_path)
    assert not hit and "does not match its header's size or checksum" in caplog.text
    pd.testing.assert_frame_equal(features, expected)


def test_an_interrupted_write_leaves_no_entry(tmp_path, candles, monkeypatch):
    def crash(source, destination):  # written in full, interrupted before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        load_features(candles, SPEC, tmp_path)
    assert entries(tmp_path) == []  # neither a partial entry nor a temp file


def test_an_entry_another_process_wrote_meanwhile_is_left_as_it_is(tmp_path, candles, monkeypatch):
    """Two processes sharing a run prepare the same job at once: both miss, both compute, the second to finish finds
    the first's entry (its key names its content) and leaves it in place - replaced, it would go to a drive's
    trash - and a hit is served from it afterwards."""
    first, _ = load_features(candles, SPEC, tmp_path)
    entry = entries(tmp_path)[0]
    before = entry.stat()
    monkeypatch.setattr(features_module.store, "load", lambda directory, key: None)  # this process missed it
    recomputed, hit = load_features(candles, SPEC, tmp_path)
    assert not hit and entries(tmp_path) == [entry]
    assert (entry.stat().st_ino, entry.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not replaced
    monkeypatch.undo()
    again, hit = load_features(candles, SPEC, tmp_path)
    assert hit
    pd.testing.assert_frame_equal(again, first, check_exact=True)
    pd.testing.assert_frame_equal(recomputed, first, check_exact=True)


def test_two_processes_writing_one_entry_at_once_leave_the_first(tmp_path, candles):
    """The race the test above cannot make: this process computes an entry while another, holding the cache
    directory, is writing the same one. This one waits for it, finds the entry and leaves it (a replaced entry would
    go to a drive's trash); nothing temporary is left."""
    load_features(candles, SPEC, tmp_path / "elsewhere")
    made = entries(tmp_path / "elsewhere")[0]
    cache = tmp_path / "cache"
    (cache / "features").mkdir(parents=True)
    other = subprocess.Popen(
        [sys.executable, "-c", "import os, shutil, sys\nfrom pathlib import Path\n"
         "from trainer.files import one_at_a_time\n"
         "with one_at_a_time(Path(sys.argv[1]).parent):\n"
         "    print('holding', flush=True); sys.stdin.readline(); shutil.copyfile(sys.argv[2], sys.argv[1])\n"
         "    print(os.stat(sys.argv[1]).st_ino)",
         str(cache / "features" / made.name), str(made)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert other.stdout.readline() == "holding\n"
        computed = []
        writer = threading.Thread(target=lambda: computed.append(load_features(candles, SPEC, tmp_path / "cache")))
        writer.start()
        deadline = time.monotonic() + 60
        while "->" not in Path("/proc/locks").read_text():  # this process waits on the other's lock
            assert writer.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        written = other.communicate("go\n", timeout=30)[0]
        writer.join(timeout=60)
    finally:
        other.kill()
    assert other.returncode == 0 and computed and not computed[0][1]
    assert entries(cache) == [cache / "features" / made.name]  # nothing temporary beside it
    assert os.stat(cache / "features" / made.name).st_ino == int(written)  # the other's, not replaced


def test_a_filesystem_that_refuses_the_lock_still_gets_its_entries(tmp_path, candles, monkeypatch, caplog):
    """NFS grants an exclusive flock only on a file open for writing, never on a directory: the entry is written
    without it (a second writer would only cost time), and the cache is not taken for unwritable."""
    def refused(descriptor, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(files.fcntl, "flock", refused)
    with caplog.at_level(logging.WARNING):
        first, hit = load_features(candles, SPEC, tmp_path)
        again, hit_again = load_features(candles, SPEC, tmp_path)
    assert (hit, hit_again) == (False, True) and len(entries(tmp_path)) == 1 and not caplog.records
    pd.testing.assert_frame_equal(again, first, check_exact=True)


@pytest.mark.parametrize("obstacle", ["a file where the cache directory should be",
                                      "a directory where an entry should be"])
def test_a_cache_that_cannot_be_written_is_only_slower(tmp_path, candles, caplog, obstacle):
    """The cache only saves time: unwritable, features are computed in memory with one warning."""
    if obstacle.startswith("a file"):
        cache = tmp_path / "cache-file"
        cache.write_text("not a directory")
    else:
        cache = tmp_path / "cache"
        load_features(candles, SPEC, cache)
        entry = entries(cache)[0]
        entry.unlink()
        entry.mkdir()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        frame, hit = load_features(candles, SPEC, cache)
        again, _ = load_features(candles, SPEC, cache)
    assert not hit
    pd.testing.assert_frame_equal(frame, compute_features(candles, SPEC))
    pd.testing.assert_frame_equal(again, frame)
    assert [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()] == \
        [r.getMessage() for r in caplog.records]  # one warning, and the right one: nothing is "damaged"
    assert len(caplog.records) == 1
