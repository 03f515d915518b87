"""The market input (features.market): other series' log range joined on the exact timestamp, never a later one;
one line where the timestamps do not overlap enough; the config's rules; never a stale cached frame."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from tests.conftest import CANDLES_DIR, tiny_config_dict
from trainer.config import RunConfig
from trainer.data import read_candles_file
from trainer.data.features import compute_features, job_features
from trainer.data.market import add_market, apply_market
from trainer.data.settings import FeaturesConfig
from trainer.errors import JobError

FEATURES = FeaturesConfig(indicators=[{"name": "log_range"}, {"name": "volume_surprise"}])


def bundled(series: str) -> pd.DataFrame:
    return read_candles_file(CANDLES_DIR / f"{series}.csv.gz", series.split("_")[1])


@pytest.fixture(scope="module")
def btc() -> pd.DataFrame:
    """BTC's 1h features but for its last candle, at a time ETH's and SOL's files end before."""
    return compute_features(bundled("BTCUSDT_1h"), FEATURES).iloc[:-1]


@pytest.fixture(scope="module")
def references() -> dict[str, pd.DataFrame]:
    return {symbol: bundled(f"{symbol}_1h") for symbol in ("ETHUSDT", "SOLUSDT")}


def market_config(tmp_path, symbols="run", **data) -> RunConfig:
    cfg = tiny_config_dict(tmp_path)
    cfg["data"] |= {"symbols": ["BTCUSDT", "ETHUSDT", "SOLUSDT"], **data}
    cfg["features"] |= {"market": {"symbols": symbols}}
    return RunConfig.model_validate(cfg)


def test_the_market_range_is_the_median_of_each_references_demeaned_log_log_range(btc, references):
    frame, levels = add_market(btc, references, train=0.7)
    assert [level.symbol for level in levels] == ["ETHUSDT", "SOLUSDT"]
    train_times = frame.index[:round(len(frame) * 0.7)]
    expected = []
    for level in levels:
        candles = references[level.symbol]
        log_range = np.log(candles["high"] / candles["low"])
        at_train = log_range.reindex(train_times).dropna()
        assert level.floor == at_train[at_train > 0].min()
        assert level.mean == pytest.approx(np.log(np.maximum(at_train, level.floor)).mean(), rel=1e-12)
        expected.append(np.log(np.maximum(log_range.reindex(frame.index), level.floor)) - level.mean)
    np.testing.assert_allclose(frame["market_range"], np.nanmedian(np.stack(expected), axis=0), rtol=1e-12)
    assert frame.index.equals(btc.index)
    # rows at whose times no reference has a candle yet, or any longer, are not kept
    later = {symbol: candles.iloc[200:-300] for symbol, candles in references.items()}
    kept = add_market(btc, later, train=0.7)[0].index
    assert kept[0] == min(c.index[0] for c in later.values()) and kept[-1] == max(c.index[-1] for c in later.values())


def test_a_row_never_reads_a_reference_candle_of_a_later_time(btc, references):
    """Shift the future: the references' candles after row t changed (or gone), and row t's value does not move;
    nor does it take the next candle's where its own time's is missing."""
    frame, levels = add_market(btc, references, train=0.7)
    t = frame.index[-100]
    changed = {}
    for symbol, candles in references.items():
        later = candles.copy()
        later.loc[later.index > t, "high"] *= 1.5
        changed[symbol] = later
    shifted = apply_market(btc, changed, levels)
    until = shifted.index <= t
    pd.testing.assert_series_equal(shifted.loc[until, "market_range"], frame.loc[frame.index <= t, "market_range"])
    assert not np.allclose(shifted.loc[~until, "market_range"], frame.loc[frame.index > t, "market_range"])
    # ETH's candle at t gone: row t is SOL's alone, not ETH's candle of t + 1h
    without = {**references, "ETHUSDT": references["ETHUSDT"].drop(t)}
    sol = next(level for level in levels if level.symbol == "SOLUSDT")
    sol_range = np.log(references["SOLUSDT"].loc[t, "high"] / references["SOLUSDT"].loc[t, "low"])
    assert apply_market(btc, without, levels).loc[t, "market_range"] == pytest.approx(
        np.log(max(sol_range, sol.floor)) - sol.mean, rel=1e-12)


def test_too_little_overlap_fails_the_job_naming_the_counts(btc, references):
    late = {"ETHUSDT": references["ETHUSDT"].iloc[-900:], "DOGEUSDT": bundled("DOGEUSDT_15m")}
    with pytest.raises(JobError) as failed:
        add_market(btc, late, train=0.7)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"{btc.attrs['source']}: the market input has 900 of the job's {len(btc)} rows")
    assert "(ETHUSDT 900; none from 1 other series); it needs at least half" in message
    with pytest.raises(JobError, match=r"has 0 of the job's \d+ rows .*\(none from its 1 reference series\)"):
        add_market(btc, {"DOGEUSDT": bundled("DOGEUSDT_15m")}, train=0.7)


def test_a_row_no_reference_covers_fails_the_job_naming_it(btc, references):
    t = btc.index[1500]
    holed = {symbol: candles.drop(t) for symbol, candles in references.items()}
    with pytest.raises(JobError, match=f"no reference series of the market input \\(ETHUSDT, SOLUSDT\\) has a candle "
                                       f"at {t:%Y-%m-%d %H:%M} UTC \\(1 of the"):
        add_market(btc, holed, train=0.7)


def test_predict_follows_the_last_candle_a_reference_covers(btc, references):
    _, levels = add_market(btc, references, train=0.7)
    shorter = {symbol: candles.iloc[:-10] for symbol, candles in references.items()}
    applied = apply_market(btc, shorter, levels)
    assert applied.index[-1] == max(candles.index[-1] for candles in shorter.values()) < btc.index[-1]
    with pytest.raises(JobError, match="has no candle of a reference series at the times of these candles"):
        apply_market(btc, {symbol: candles.iloc[:0] for symbol, candles in references.items()}, levels)
    with pytest.raises(JobError, match="the market input needs the candles of SOLUSDT"):
        apply_market(btc, {"ETHUSDT": references["ETHUSDT"]}, levels)


def test_the_references_are_read_through_the_runs_source_and_a_changed_one_is_never_stale(tmp_path):
    data = tmp_path / "ohlcv"
    shutil.copytree(CANDLES_DIR, data)
    cfg = market_config(tmp_path, local={"path": str(data), "pattern": "{symbol}_{timeframe}.csv.gz"})
    first = job_features(cfg, "BTCUSDT", "1h")
    assert [level.symbol for level in first.market] == ["ETHUSDT", "SOLUSDT"]
    # one ETH candle's high raised: the job's indicators come from the cache, its market column is new
    path = data / "ETHUSDT_1h.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    fields = lines[-50].split(",")
    fields[2] = repr(float(fields[2]) * 1.2)
    lines[-50] = ",".join(fields)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    again = job_features(cfg, "BTCUSDT", "1h")
    assert again.hit
    changed = again.frame["market_range"] != first.frame["market_range"]
    assert changed.sum() == 1 and again.frame.index[changed][0] == pd.Timestamp(fields[0])
    assert again.frame.drop(columns="market_range").equals(first.frame.drop(columns="market_range"))


def test_a_missing_reference_file_is_one_line_naming_it(tmp_path):
    cfg = market_config(tmp_path, symbols=["ETHUSDT", "XRPUSDT"])
    with pytest.raises(JobError, match=r"^market reference XRPUSDT: local:\S+XRPUSDT_1h\.csv\.gz: no such file"):
        job_features(cfg, "BTCUSDT", "1h")


def test_the_run_symbols_leave_out_a_symbol_without_candles(tmp_path):
    """With "run", a symbol whose own job fails for want of candles is left out of the others' references."""
    cfg = tiny_config_dict(tmp_path)
    cfg["data"]["symbols"] = ["BTCUSDT", "ETHUSDT", "XRPUSDT"]
    cfg["features"]["market"] = {"symbols": "run"}
    features = job_features(RunConfig.model_validate(cfg), "BTCUSDT", "1h")
    assert [level.symbol for level in features.market] == ["ETHUSDT"]


@pytest.mark.parametrize(("market", "error"), [
    ({"symbols": ["btcusdt"]}, "'btcusdt' is not a symbol like BTCUSDT"),
    ({"symbols": ["ETHUSDT", "ETHUSDT"]}, "duplicate"),
    ({"symbols": "all"}, "features.market.symbols"),
    ({"symbols": []}, "must list at least one symbol"),
    ({}, "features.market.symbols"),
    ({"symbols": ["BTCUSDT"]}, "the job of BTCUSDT has no reference series"),
])
def test_config_errors_name_the_key(tmp_path, market, error):
    cfg = tiny_config_dict(tmp_path)
    cfg["features"]["market"] = market
    with pytest.raises(ValidationError, match=error):
        RunConfig.model_validate(cfg)


def test_run_with_a_single_symbol_has_no_references(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg["data"]["symbols"] = ["BTCUSDT"]
    cfg["features"]["market"] = {"symbols": "run"}
    with pytest.raises(ValidationError, match="the job of BTCUSDT has no reference series"):
        RunConfig.model_validate(cfg)


def test_the_market_column_is_the_last_input_column(tmp_path):
    cfg = market_config(tmp_path)
    assert cfg.features.columns[-1] == "market_range"
    assert "market_range" not in RunConfig.model_validate(tiny_config_dict(tmp_path)).features.columns
