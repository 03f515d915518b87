"""Local candle files: both column layouts, CSV / CSV.gz / Parquet, validation with the row and file
named, gaps, max_rows, and the parsed-candle cache keyed by the file's bytes."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import CANDLES_DIR, REPO, tiny_config_dict
from trainer.config import RunConfig, load_config
from trainer.data import load_candles, read_candles_file
from trainer.data.validate import OHLCV
from trainer.errors import JobError

BTC_1H = CANDLES_DIR / "BTCUSDT_1h.csv.gz"


def real_rows(rows: int = 300, path: Path = BTC_1H) -> pd.DataFrame:
    """The first rows of a real series as plain pandas reads them (timestamp strings, floats)."""
    return pd.read_csv(path, nrows=rows)


def write_csv(table: pd.DataFrame, path: Path) -> Path:
    table.to_csv(path, index=False)
    return path


def local_cfg(tmp_path: Path, directory: Path, pattern: str = "{symbol}_{timeframe}.csv.gz",
              max_rows: int | None = None) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["data"].update(local={"path": str(directory), "pattern": pattern}, max_rows=max_rows)
    return RunConfig.model_validate(raw)


def test_local_source_keeps_the_contract_on_real_candles(tmp_path):
    candles = load_candles(local_cfg(tmp_path, CANDLES_DIR, max_rows=500), "BTCUSDT", "1h")
    reference = pd.read_csv(BTC_1H).tail(500)  # max_rows keeps the most recent rows

    assert list(candles.columns) == list(OHLCV)
    assert all(dtype == np.float64 for dtype in candles.dtypes)
    assert isinstance(candles.index, pd.DatetimeIndex) and str(candles.index.tz) == "UTC"
    assert candles.index.name == "timestamp"
    assert candles.index.is_monotonic_increasing and candles.index.is_unique
    np.testing.assert_array_equal(candles.to_numpy(), reference[list(OHLCV)].to_numpy())
    assert (candles.index == pd.to_datetime(reference["timestamp"], utc=True)).all()
    assert candles.attrs == {"source": f"local:{BTC_1H}", "synthetic": False, "gaps": 0}


def test_old_dataset_layout_in_csv_and_parquet_gives_the_same_candles(tmp_path):
    table = real_rows()
    open_ms = pd.to_datetime(table["timestamp"], utc=True).astype("int64") // 1_000_000
    old = pd.DataFrame({"open_time": open_ms, **{c: table[c] for c in OHLCV},
                        "close_time": open_ms + 3_600_000 - 1})
    expected = read_candles_file(write_csv(table, tmp_path / "new.csv"), "1h")

    for path in (write_csv(old, tmp_path / "old.csv"), tmp_path / "old.parquet"):
        if path.suffix == ".parquet":
            old.to_parquet(path)
        candles = read_candles_file(path, "1h")
        pd.testing.assert_frame_equal(candles, expected)
        assert candles.attrs["source"] == f"local:{path.resolve()}"


def test_a_missing_file_is_a_job_error_naming_it(tmp_path):
    cfg = local_cfg(tmp_path, tmp_path, pattern="{symbol}-{timeframe}.parquet")
    with pytest.raises(JobError, match=rf"local:{tmp_path}/BTCUSDT-1h.parquet: no such file"):
        load_candles(cfg, "BTCUSDT", "1h")


@pytest.mark.parametrize(("column", "value", "message"), [
    ("close", "nan", "close is not a positive number .*close=nan"),
    ("open", "-3.5", "open is not a positive number .*open=-3.5"),
    ("low", "0", "low is not a positive number .*low=0.0"),
    ("close", "abc", "close is not a positive number .*close='abc'"),
    ("volume", "-1", "volume is negative or not a number .*volume=-1.0"),
    ("high", "1", r"high is below max\(open, close\) \[open=109176.74 high=1.0 low=108786.0"),
    ("low", "1e9", r"low is above min\(open, close\) .*low=1000000000.0"),
])
def test_a_bad_value_is_reported_with_file_row_and_values(tmp_path, column, value, message):
    table = real_rows(40).astype({column: object})
    table.loc[7, column] = value  # data row 8 of the file
    table.loc[7, [c for c in OHLCV if c != column]] = table.loc[0, [c for c in OHLCV if c != column]]
    path = write_csv(table, tmp_path / "bad.csv")
    with pytest.raises(JobError, match=rf"^local:{path}: row 8 \(2025-10-17 11:00 UTC\): {message}.* "
                                       r"\(1 bad rows in all\)$"):
        read_candles_file(path, "1h")


@pytest.mark.parametrize("stamp", ["-0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z"])
def test_a_timestamp_out_of_range_is_reported_with_file_and_row(tmp_path, stamp):
    table = real_rows(40)
    table.loc[7, "timestamp"] = stamp
    path = write_csv(table, tmp_path / "bad.csv")
    with pytest.raises(JobError, match=rf"^local:{path}: row 8: timestamp .* is out of range \(years 1678 to 2261\)"):
        read_candles_file(path, "1h")


def test_a_bad_timestamp_is_reported_with_file_and_row(tmp_path):
    table = real_rows(40)
    table.loc[[7, 9], "timestamp"] = ["yesterday", ""]
    path = write_csv(table, tmp_path / "bad.csv")
    with pytest.raises(JobError, match=rf"^local:{path}: row 8: timestamp 'yesterday' is not a date "
                                       r"\(2 bad timestamps in all\)$"):
        read_candles_file(path, "1h")


def test_unsorted_rows_are_sorted_and_exact_duplicates_dropped(tmp_path):
    table = real_rows(100)
    messy = pd.concat([table.iloc[::-1], table.iloc[[5, 50, 50]]])  # reversed, three exact duplicates
    candles = read_candles_file(write_csv(messy, tmp_path / "messy.csv"), "1h")
    pd.testing.assert_frame_equal(candles, read_candles_file(write_csv(table, tmp_path / "clean.csv"), "1h"))


def test_two_different_candles_at_one_time_are_an_error(tmp_path):
    table = real_rows(30)
    clash = table.iloc[[10]].assign(close=table["close"].iloc[10] + 1.0)
    path = write_csv(pd.concat([table, clash]), tmp_path / "clash.csv")
    with pytest.raises(JobError, match="rows 11 and 31 both open at .* with different values"):
        read_candles_file(path, "1h")


def test_gaps_are_counted_and_reported(tmp_path, caplog):
    table = real_rows(200).drop(index=[20, 21, 150])
    path = write_csv(table, tmp_path / "BTCUSDT_1h.csv")
    with caplog.at_level(logging.WARNING, logger="trainer"):
        candles = load_candles(local_cfg(tmp_path, tmp_path, pattern="{symbol}_{timeframe}.csv"), "BTCUSDT", "1h")
    assert candles.attrs["gaps"] == 3 and len(candles) == 197
    assert "3 candles missing (gaps)" in caplog.text and str(path) in caplog.text


def test_a_file_of_another_timeframe_is_rejected(tmp_path):
    with pytest.raises(JobError, match="typically 0 days 01:00:00 apart, not 15m"):
        read_candles_file(BTC_1H, "15m")
    with pytest.raises(JobError, match="not a whole number of 1h candles"):
        read_candles_file(CANDLES_DIR / "BTCUSDT_15m.csv.gz", "1h")


def test_timestamps_with_offsets_or_without_zone_are_utc(tmp_path):
    table = real_rows(50)
    utc = pd.to_datetime(table["timestamp"], utc=True)
    shifted = table.assign(timestamp=(utc.dt.tz_convert("Etc/GMT-2")).map(pd.Timestamp.isoformat))  # +02:00
    naive = table.assign(timestamp=utc.dt.strftime("%Y-%m-%d %H:%M:%S"))
    for variant in (shifted, naive):
        candles = read_candles_file(write_csv(variant, tmp_path / "variant.csv"), "1h")
        assert (candles.index == utc).all()


def test_parsed_candles_are_cached_by_the_file_bytes(tmp_path):
    table = real_rows(300)
    path = write_csv(table, tmp_path / "BTCUSDT_1h.csv")
    cfg = local_cfg(tmp_path, tmp_path, pattern="{symbol}_{timeframe}.csv")
    first = load_candles(cfg, "BTCUSDT", "1h")
    parsed_dir = cfg.cache_path / "candles" / "parsed"
    assert len(list(parsed_dir.iterdir())) == 1
    pd.testing.assert_frame_equal(load_candles(cfg, "BTCUSDT", "1h"), first)
    assert len(list(parsed_dir.iterdir())) == 1  # a hit: nothing new stored

    table.loc[123, "close"] = table.loc[123, "close"] * 0.9999  # edit one candle: a new key, never stale
    write_csv(table, path)
    edited = load_candles(cfg, "BTCUSDT", "1h")
    assert edited["close"].iloc[123] == table.loc[123, "close"] != first["close"].iloc[123]
    assert len(list(parsed_dir.iterdir())) == 2


def test_the_families_read_the_bundled_candles_offline_and_name_what_is_missing(monkeypatch):
    """From a clone, with no network and nothing beside it: the bundled series load, every other job fails at
    once naming the file, what the directory holds, and where else candles can come from."""
    monkeypatch.chdir(REPO)
    cfg = load_config("v8_aligned")
    assert len(load_candles(cfg, "SOLUSDT", "15m")) == 3000
    with pytest.raises(JobError, match=re.escape(
            f"local:{REPO / 'data/ohlcv/XRPUSDT_1h.csv.gz'}: no such file; data/ohlcv has 1h candles for BTCUSDT, "
            "DOGEUSDT, ETHUSDT, SOLUSDT (data.local.path, or --set data.source=hf or binance)")):
        load_candles(cfg, "XRPUSDT", "1h")
