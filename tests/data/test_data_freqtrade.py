"""data.source: freqtrade: a freqtrade data directory read as it is (feather, parquet, json, json.gz), the
symbol <-> pair-file mapping, one-line errors naming the directory or the file, the retry digest, and one
run end to end on freqtrade's own files (tests/fixtures/freqtrade/binance, trimmed; its README.md)."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import FREQTRADE_DIR, tiny_config_dict
from trainer.cli import main
from trainer.config import RunConfig
from trainer.data import input_digest, load_candles
from trainer.data.freqtrade import candidates, split_symbol
from trainer.data.validate import OHLCV
from trainer.errors import JobError
from trainer.publish.cards import job_card

BTC_1H = FREQTRADE_DIR / "BTC_USDT-1h.feather"


def freqtrade_cfg(tmp_path: Path, directory: Path, max_rows: int | None = None) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["data"].update(source="freqtrade", freqtrade={"path": str(directory)}, max_rows=max_rows)
    return RunConfig.model_validate(raw)


def write_freqtrade(frame: pd.DataFrame, path: Path) -> Path:
    """A candle frame (freqtrade's columns) written as freqtrade's data handlers write that format."""
    name = path.name
    if name.endswith((".json", ".json.gz")):  # JsonDataHandler / JsonGzDataHandler: date as epoch ms, rows
        rows = frame.assign(date=frame["date"].astype(np.int64) // 1000 // 1000)
        rows.reset_index(drop=True).loc[:, ["date", *OHLCV]].to_json(
            path, orient="values", compression="gzip" if name.endswith(".gz") else None)
    elif name.endswith(".parquet"):
        frame.reset_index(drop=True).to_parquet(path)
    else:
        frame.reset_index(drop=True).to_feather(path)
    return path


def test_freqtrade_feather_keeps_the_contract(tmp_path):
    candles = load_candles(freqtrade_cfg(tmp_path, FREQTRADE_DIR, max_rows=500), "BTCUSDT", "1h")
    reference = pd.read_feather(BTC_1H).tail(500)  # max_rows keeps the most recent rows

    assert list(candles.columns) == list(OHLCV)
    assert all(dtype == np.float64 for dtype in candles.dtypes)
    assert candles.index.name == "timestamp" and str(candles.index.tz) == "UTC"
    assert candles.index.is_monotonic_increasing and candles.index.is_unique
    assert (candles.index == pd.DatetimeIndex(reference["date"])).all()  # date = the candle's open time, UTC
    np.testing.assert_array_equal(candles.to_numpy(), reference[list(OHLCV)].to_numpy())
    assert candles.attrs == {"source": f"freqtrade:{BTC_1H}", "synthetic": False, "gaps": 0}
    assert len(load_candles(freqtrade_cfg(tmp_path, FREQTRADE_DIR), "SOLUSDT", "15m")) == 1500


@pytest.mark.parametrize("ext", ["json", "json.gz", "parquet"])
def test_freqtrade_json_jsongz_and_parquet_give_the_feather_candles(tmp_path, ext):
    expected = load_candles(freqtrade_cfg(tmp_path, FREQTRADE_DIR), "SOLUSDT", "15m")
    directory = tmp_path / "binance"
    directory.mkdir()
    path = write_freqtrade(pd.read_feather(FREQTRADE_DIR / "SOL_USDT-15m.feather"), directory / f"SOL_USDT-15m.{ext}")
    if ext == "json.gz":
        assert gzip.decompress(path.read_bytes()).startswith(b"[[1724325300000,")  # freqtrade's own layout

    candles = load_candles(freqtrade_cfg(tmp_path, directory), "SOLUSDT", "15m")
    pd.testing.assert_index_equal(candles.index, expected.index)
    # pandas' to_json (freqtrade's writer) keeps 10 significant digits by default
    np.testing.assert_allclose(candles.to_numpy(), expected.to_numpy(), rtol=1e-10, atol=0)
    assert candles.attrs["source"] == f"freqtrade:{path}"


def test_symbols_map_to_freqtrade_pair_files(tmp_path):
    names = ["BTC_USDT-1h.feather", "ETH_BTC-1h.parquet", "DOGE_FDUSD-1h.json", "SOL_USDT-1h.json.gz",
             "XRP_USDT-15m.feather",  # another timeframe
             "ADA_USDT_USDT-1h-futures.feather", "ADA_USDT_USDT-1h-mark.feather",  # futures; mark is no price
             "BTC_USDT-1h.csv", "BTCUSDT-1h.feather"]  # not freqtrade's
    for name in names:
        (tmp_path / name).write_bytes(b"")
    found = {symbol: [p.name for p in candidates(tmp_path, symbol, "1h")]
             for symbol in ("BTCUSDT", "ETHBTC", "DOGEFDUSD", "SOLUSDT", "XRPUSDT", "ADAUSDT", "ADAUSDTUSDT")}
    assert found == {"BTCUSDT": ["BTC_USDT-1h.feather"], "ETHBTC": ["ETH_BTC-1h.parquet"],
                     "DOGEFDUSD": ["DOGE_FDUSD-1h.json"], "SOLUSDT": ["SOL_USDT-1h.json.gz"], "XRPUSDT": [],
                     "ADAUSDT": ["ADA_USDT_USDT-1h-futures.feather"], "ADAUSDTUSDT": []}
    assert [p.name for p in candidates(tmp_path, "XRPUSDT", "15m")] == ["XRP_USDT-15m.feather"]
    assert split_symbol("BTCUSDT") == ("BTC", "USDT") and split_symbol("BTCFDUSD") == ("BTC", "FDUSD")
    assert split_symbol("ETHBTC") == ("ETH", "BTC") and split_symbol("BTCTUSD") == ("BTC", "TUSD")
    assert split_symbol("USDT") is None and split_symbol("ABCXYZ") is None


def test_a_freqtrade_futures_file_is_read_as_its_symbol(tmp_path):
    futures = tmp_path / "futures"
    futures.mkdir()
    shutil.copy(BTC_1H, futures / "BTC_USDT_USDT-1h-futures.feather")
    candles = load_candles(freqtrade_cfg(tmp_path, futures), "BTCUSDT", "1h")
    assert candles.attrs["source"] == f"freqtrade:{futures / 'BTC_USDT_USDT-1h-futures.feather'}"
    assert len(candles) == 1500


def test_a_missing_pair_names_the_directory_and_what_it_holds(tmp_path):
    with pytest.raises(JobError) as missing:
        load_candles(freqtrade_cfg(tmp_path, FREQTRADE_DIR), "ETHUSDT", "1h")
    assert str(missing.value) == (
        f"freqtrade:{FREQTRADE_DIR}: no ETHUSDT 1h candles (ETH_USDT-1h.feather, .parquet, .json or .json.gz); "
        f"{FREQTRADE_DIR} has 1h candles for BTCUSDT (data.freqtrade.path, or freqtrade download-data "
        "--pairs ETH/USDT --timeframes 1h)")
    with pytest.raises(JobError, match=re.escape(f"{FREQTRADE_DIR} has 15m candles for SOLUSDT ")):
        load_candles(freqtrade_cfg(tmp_path, FREQTRADE_DIR), "BTCUSDT", "15m")
    with pytest.raises(JobError, match=re.escape(f"there is no directory {tmp_path / 'nope'} ")):
        load_candles(freqtrade_cfg(tmp_path, tmp_path / "nope"), "BTCUSDT", "1h")


def test_two_files_for_one_job_are_an_error_naming_both(tmp_path):
    shutil.copy(BTC_1H, tmp_path / "BTC_USDT-1h.feather")
    write_freqtrade(pd.read_feather(BTC_1H), tmp_path / "BTC_USDT-1h.json")
    with pytest.raises(JobError, match=re.escape(
            f"freqtrade:{tmp_path}: 2 files could be BTCUSDT 1h: BTC_USDT-1h.feather, BTC_USDT-1h.json; keep one")):
        load_candles(freqtrade_cfg(tmp_path, tmp_path), "BTCUSDT", "1h")


@pytest.mark.parametrize("ext", ["feather", "parquet", "json", "json.gz"])
def test_a_broken_file_is_one_line_naming_it(tmp_path, ext):
    path = tmp_path / f"BTC_USDT-1h.{ext}"
    path.write_bytes(b"\x00garbage\xff" * 50)
    with pytest.raises(JobError) as broken:
        load_candles(freqtrade_cfg(tmp_path, tmp_path), "BTCUSDT", "1h")
    assert re.fullmatch(rf"freqtrade:{re.escape(str(path))}: cannot read the file: [^\n]+", str(broken.value))


@pytest.mark.parametrize(("row", "message"), [
    ([1, 2, 3], r"row 3: expected \[timestamp_ms, open, high, low, close, volume\], found \[1, 2, 3\]"),
    (None, r"row 3: expected \[timestamp_ms, open, high, low, close, volume\], found null"),
    ([1720195200000, "abc", 2, 1, 1.5, 7], r"row 3 \(2024-07-05 16:00 UTC\): open is not a positive number "
                                           r".*open='abc'"),
    (["yesterday", 1, 2, 1, 1.5, 7], r"row 3: timestamp \"yesterday\" is not a number \(epoch milliseconds\)$"),
    ([10**30, 1, 2, 1, 1.5, 7], r"row 3: timestamp 1e\+30 is not a date"),
])
def test_a_bad_json_row_is_reported_with_file_and_row(tmp_path, row, message):
    rows = [[1720188000000 + 3_600_000 * i, 1, 2, 0.5, 1.5, 10] for i in range(2)] + [row]
    path = tmp_path / "BTC_USDT-1h.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(JobError, match=rf"^freqtrade:{re.escape(str(path))}: {message}"):
        load_candles(freqtrade_cfg(tmp_path, tmp_path), "BTCUSDT", "1h")


def test_the_retry_digest_covers_the_freqtrade_file(tmp_path):
    cfg = freqtrade_cfg(tmp_path, tmp_path)
    absent = input_digest(cfg, "BTCUSDT", "1h")
    shutil.copy(BTC_1H, tmp_path / "BTC_USDT-1h.feather")
    added = input_digest(cfg, "BTCUSDT", "1h")
    write_freqtrade(pd.read_feather(BTC_1H).iloc[:-1], tmp_path / "BTC_USDT-1h.feather")
    edited = input_digest(cfg, "BTCUSDT", "1h")
    assert len({absent, added, edited}) == 3
    assert input_digest(cfg, "BTCUSDT", "1h") == edited  # the same bytes: the same digest


@pytest.mark.train
def test_a_run_trains_on_a_freqtrade_directory_end_to_end(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(tmp_path), sort_keys=False))
    result = CliRunner().invoke(main, [
        "run", "--config", str(config), "--set", "data.source=freqtrade",
        "--set", f"data.freqtrade.path={FREQTRADE_DIR}", "--set", "data.symbols=[BTCUSDT]",
        "--set", "train.epochs=1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "jobs" / "BTCUSDT_1h" / "metrics.json").read_text())
    assert metrics["data"]["source"] == f"freqtrade:{BTC_1H}" and metrics["data"]["rows"] == 600
    assert metrics["heads"]["ohlc"]["model"]["mae"] > 0
    card = job_card(tmp_path / "run" / "jobs" / "BTCUSDT_1h", "me/cpb", "BTCUSDT/1h")
    assert "freqtrade:BTC_USDT-1h.feather" in card and str(FREQTRADE_DIR) not in card  # a card names no directory
