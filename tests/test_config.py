"""Config loading: the bundled families, overrides, fingerprints, and a table of bad configs that must
each exit 2 with one line naming the file and the key path, writing nothing."""
from __future__ import annotations

import os

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import tiny_config_dict
from trainer.cli import main
from trainer.config import ConfigError, load_config, resolve_config_path
from trainer.run.jobs import make_jobs


@pytest.mark.parametrize("name", ["v7", "v8_stable", "v8_aligned"])
def test_family_configs_match_the_specification(name):
    cfg = load_config(name)
    assert len(cfg.data.symbols) == 20 and cfg.data.timeframes == ["15m", "1h"]
    assert len(make_jobs(cfg)) == 40
    # Offline out of the box on the bundled candles; the old scripts' Hub dataset one --set away.
    assert cfg.data.source == "local" and str(cfg.data.local.path) == "data/ohlcv"
    assert cfg.data.hf.repo_id == "zongowo111/cpb-models"
    assert cfg.features.columns[:4] == ["open", "high", "low", "close"]
    # then the family's own inputs, then what HAR cannot see (issue 28): volume surprise and the market
    assert cfg.features.columns[-2:] == ["volume_surprise", "market_range"]
    assert cfg.features.market.symbols == "run"
    if name == "v8_stable":
        assert len(cfg.features.columns) == 15 + 2
        assert (cfg.window.lookback, cfg.window.horizon, cfg.window.scaler) == (120, 1, "minmax")
        train = cfg.train
        assert (train.learning_rate, train.clipvalue, train.batch_size, train.epochs) == (0.001, 1.0, 32, 150)
        assert cfg.train.reduce_lr.min_lr == 1e-7
    else:
        # V7's 12 inputs, then the 10 of the candles' size and time that issue 20's bench-skill supports.
        assert len(cfg.features.columns) == 22 + 2
        assert cfg.features.columns[12:-2] == ["log_range", "parkinson", "garman_klass", "range_day", "range_week",
                                             "range_time_of_day", "time_of_day_sin", "time_of_day_cos",
                                             "day_of_week_sin", "day_of_week_cos"]
        assert (cfg.window.lookback, cfg.window.horizon, cfg.window.scaler) == (60, 10, "standard")
        assert [(h.name, len(h.columns), h.weight, h.loss) for h in cfg.heads] == [
            ("ohlc", 4, 1.0, "mae"), ("bb", 2, 0.8, "mse"), ("volatility", 1, 0.3, "mse")]
        assert (cfg.train.learning_rate, cfg.train.batch_size, cfg.train.epochs) == (0.0005, 16, 100)
        third_encoder = cfg.model.layers[4]
        assert third_encoder.units == 32
        assert third_encoder.kind == ("bilstm" if name == "v8_aligned" else "lstm")


def test_v7_and_v8_aligned_differ_only_in_the_third_encoder_layer():
    v7, aligned = load_config("v7").fingerprint_data(), load_config("v8_aligned").fingerprint_data()
    v7_layers, aligned_layers = v7.pop("model")["layers"], aligned.pop("model")["layers"]
    v7.pop("name"), aligned.pop("name")
    assert v7 == aligned
    assert [i for i, (a, b) in enumerate(zip(v7_layers, aligned_layers)) if a != b] == [4]


def test_bundled_config_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spelling in ("v8_aligned", "v8_aligned.yaml", "configs/v8_aligned.yaml"):
        assert resolve_config_path(spelling).name == "v8_aligned.yaml"
    (tmp_path / "v8_aligned.yaml").write_text("name: mine\n")
    assert resolve_config_path("v8_aligned.yaml").resolve() == tmp_path / "v8_aligned.yaml"  # a local file wins


def test_overrides_change_values_and_the_fingerprint(tiny_config):
    path = tiny_config()
    base = load_config(path)
    changed = load_config(path, ["train.epochs=7", "window.split={train: 0.8, val: 0.1, test: 0.1}",
                                 "model.layers.0.units=32"])
    assert changed.train.epochs == 7 and changed.window.split.train == 0.8 and changed.model.layers[0].units == 32
    assert changed.fingerprint() != base.fingerprint()
    # Where results go does not change what a job computes.
    assert load_config(path, ["output_dir=elsewhere"]).fingerprint() == base.fingerprint()
    assert load_config(path, ["hub.repo_id=me/models"]).fingerprint() == base.fingerprint()
    # Nor how long jobs may train: a run is extended or shortened, not replaced (runner.budget_plan).
    assert load_config(path, ["train.epochs=9", "train.early_stopping.patience=3"]).fingerprint() == base.fingerprint()


def test_fingerprint_is_stable_across_key_order_and_spelling(tmp_path):
    data = tiny_config_dict(tmp_path)
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(data, sort_keys=False))
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(data, sort_keys=True).replace("learning_rate: 0.003", "learning_rate: 3.0e-3"))
    assert load_config(a).fingerprint() == load_config(b).fingerprint()


def test_job_filters(tiny_config):
    cfg = load_config(tiny_config(), ["data.timeframes=[15m, 1h]"])
    assert [j.name for j in make_jobs(cfg)] == ["BTCUSDT_15m", "BTCUSDT_1h", "ETHUSDT_15m", "ETHUSDT_1h"]
    assert [j.name for j in make_jobs(cfg, only=("btc*",))] == ["BTCUSDT_15m", "BTCUSDT_1h"]
    assert [j.name for j in make_jobs(cfg, only=("ETHUSDT_1h",))] == ["ETHUSDT_1h"]
    assert [j.name for j in make_jobs(cfg, timeframes=("15m",))] == ["BTCUSDT_15m", "ETHUSDT_15m"]
    with pytest.raises(ConfigError, match="matches none"):
        make_jobs(cfg, only=("DOGE*",))
    with pytest.raises(ConfigError, match="--timeframes 4h"):
        make_jobs(cfg, timeframes=("4h",))


def _set(path: str, value):
    """A mutation that sets one dotted key (list items by index) of the tiny config."""
    def mutate(cfg: dict) -> None:
        *parents, last = path.split(".")
        node = cfg
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value
    return mutate


def _delete(path: str):
    def mutate(cfg: dict) -> None:
        *parents, last = path.split(".")
        node = cfg
        for key in parents:
            node = node[key]
        del node[last]
    return mutate


def _set_all(*mutations):
    def mutate(cfg: dict) -> None:
        for mutation in mutations:
            mutation(cfg)
    return mutate


BAD_CONFIGS = [
    # (id, mutation of the tiny config, text expected in the one-line error)
    ("unknown top-level key", _set("optimiser", "adam"), "optimiser: unknown key"),
    ("unknown nested key", _set("train.epoch", 3), "train.epoch: unknown key"),
    ("wrong type", _set("train.epochs", "many"), "train.epochs: Input should be a valid integer"),
    ("zero epochs", _set("train.epochs", 0), "train.epochs: Input should be greater than 0"),
    ("negative lookback", _set("window.lookback", -5), "window.lookback: Input should be greater than 0"),
    ("horizon 0", _set("window.horizon", 0), "window.horizon: Input should be greater than 0"),
    ("split not summing to 1", _set("window.split", {"train": 0.7, "val": 0.2, "test": 0.2}),
     "window.split: train + val + test must sum to 1"),
    ("unknown scaler", _set("window.scaler", "robust"), "window.scaler: Input should be 'standard' or 'minmax'"),
    ("unknown indicator", _set("features.indicators.0", {"name": "stoch_rsi"}),
     "features.indicators[0]: unknown kind 'stoch_rsi'"),
    ("bad indicator parameter", _set("features.indicators.0.window", 1),
     "features.indicators[0].window: Input should be greater than 1"),
    ("unknown indicator parameter", _set("features.indicators.0.period", 14),
     "features.indicators[0].period: unknown key"),
    ("duplicate indicator", _set("features.indicators.1", {"name": "rsi"}),
     "features: duplicate feature columns: rsi"),
    ("unknown layer kind", _set("model.layers.0", {"kind": "transformer", "units": 8}),
     "model.layers[0]: unknown kind 'transformer'"),
    ("dropout out of range", _set("model.layers.0.dropout", 1.5),
     "model.layers[0].dropout: Input should be less than 1"),
    ("no layers", _set("model.layers", []), "model.layers: List should have at least 1 item"),
    ("layers Keras cannot build", _set("model.layers", [{"kind": "lstm", "units": 8}]),
     "model.layers: the last layer outputs one vector, but window.horizon is 3"),
    ("head column not a feature", _set("heads.1.columns", ["bb_upper", "macd"]),
     "heads[1].columns: head 'bb' targets macd, which is not a feature column"),
    ("duplicate head", _set("heads.1.name", "ohlc"), "heads: duplicate head names: ohlc"),
    ("empty symbols", _set("data.symbols", []), "data.symbols: must list at least one symbol"),
    ("duplicate symbols", _set("data.symbols", ["BTCUSDT", "BTCUSDT"]), "data.symbols: duplicate symbols: BTCUSDT"),
    ("lower-case symbol", _set("data.symbols", ["btcusdt"]), "data.symbols: 'btcusdt' is not a symbol like BTCUSDT"),
    ("unknown timeframe", _set("data.timeframes", ["1h", "7m"]), "data.timeframes: unknown timeframe '7m'"),
    ("unknown source", _set("data.source", "kaggle"),
     "data.source: Input should be 'local', 'hf', 'binance', 'synthetic' or 'freqtrade'"),
    ("unknown freqtrade key", _set("data.freqtrade", {"path": "user_data/data/binance", "format": "feather"}),
     "data.freqtrade.format: unknown key"),
    ("bad file pattern placeholder", _set("data.local.pattern", "{coin}_{timeframe}.csv"),
     "data.local.pattern: '{coin}_{timeframe}.csv' may only use the placeholders {symbol} and {timeframe}"),
    ("hub repo without namespace", _set("hub", {"repo_id": "cpb-models"}),
     "hub.repo_id: 'cpb-models': expected NS/NAME"),
    ("hub repo with an unknown placeholder", _set("hub", {"repo_id": "me/cpb-{coin}"}),
     "hub.repo_id: 'me/cpb-{coin}' may only use the placeholders {symbol} and {timeframe}"),
    ("bad hf repo id", _set("data.hf", {"repo_id": "some one/cpb models!"}),
     "data.hf.repo_id: Repo id must use alphanumeric chars"),
    ("bad binance date", _set("data.binance", {"start": "last tuesday"}),
     "data.binance.start: 'last tuesday' is not a date (YYYY-MM-DD, UTC)"),
    ("binance end before start", _set("data.binance", {"start": "2025-02-01", "end": "2025-01-01"}),
     "data.binance: start 2025-02-01 is not before end 2025-01-01"),
    ("missing section", _delete("window"), "window: required key is missing"),
    ("negative max_rows", _set("data.max_rows", -1), "data.max_rows: Input should be greater than 0"),
    ("bad precision", _set("train.precision", "fp8"), "train.precision: Input should be"),
    ("a monitor the model does not report", _set("train.early_stopping.monitor", "val_olhc_loss"),
     "train.early_stopping.monitor: val_olhc_loss is no loss of this model (one of bb_loss, loss, "),
    ("two kinds of clipping", _set("train", {"clipvalue": 1.0, "clipnorm": 1.0}),
     "train: set clipvalue or clipnorm, not both"),
    ("unknown framing", _set("window.relative_to", "first_close"), "window.relative_to: Input should be 'last_close'"),
    ("candle head over other columns", _set("heads.1.kind", "candle"),
     "heads[1].columns: a candle head needs exactly the columns open, high, low, close (got bb_upper, bb_lower)"),
    ("candle head on absolute levels", _set("window.relative_to", None),
     "heads[0].kind: a candle head needs window.relative_to: last_close"),
    ("a head kind written as before", _set("heads.0.candle", True),
     "heads[0]: candle: and har: became the head's kind: kind: candle, or kind: har_candle"),
    ("unknown head kind", _set("heads.1.kind", "candel"),
     "heads[1]: unknown kind 'candel'; expected one of: 'plain', 'quantile', 'candle', 'har_candle'"),
    ("relative framing without a close", _set_all(
        _set("features", {"base": ["open"], "indicators": [{"name": "rsi"}]}),
        _set("heads", [{"name": "rsi", "columns": ["rsi"]}])),
     "window.relative_to: last_close needs close among features.base"),
]


def _run_cli(args, cwd):
    """Invoke the CLI in `cwd`; return (exit code, output, files that appeared)."""
    before = set(cwd.rglob("*"))
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, args)
    finally:
        os.chdir(old)
    return result.exit_code, result.output, set(cwd.rglob("*")) - before


@pytest.mark.parametrize("case_id,mutate,expected", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path, case_id, mutate, expected):
    data = tiny_config_dict(tmp_path)
    data["output_dir"] = "runs/tiny"  # relative: would appear under cwd if anything were written
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, output, new_files = _run_cli(["run", "--config", "bad.yaml"], tmp_path)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in output, output
    assert lines[0].startswith("error: bad.yaml: "), lines[0]
    assert expected in lines[0], lines[0]
    assert new_files == set()


@pytest.mark.parametrize("text,expected", [
    ("name: x\ndata: [unclosed\n", "bad.yaml: line 3: YAML syntax error"),
    ("- just\n- a list\n", "bad.yaml: expected a mapping of settings at the top level"),
    (b"\x89PNG\r\n\x1a\n\x00", "bad.yaml: cannot read the config: 'utf-8' codec can't decode byte 0x89"),
])
def test_unparseable_config_files(tmp_path, text, expected):
    if isinstance(text, bytes):
        (tmp_path / "bad.yaml").write_bytes(text)
    else:
        (tmp_path / "bad.yaml").write_text(text)
    code, output, new_files = _run_cli(["plan", "--config", "bad.yaml"], tmp_path)
    assert code == 2, output
    assert output.strip().splitlines() == [f"error: {expected}"] or (
        len(output.strip().splitlines()) == 1 and output.startswith(f"error: {expected}")), output
    assert new_files == set()


def test_missing_config_file_lists_the_bundled_ones(tmp_path):
    code, output, _ = _run_cli(["run", "--config", "v9_turbo"], tmp_path)
    assert code == 2
    assert output.startswith("error: v9_turbo: no such config file (bundled configs: quickstart, v7, v8_aligned")


def test_a_mistyped_path_into_another_directory_is_not_replaced_by_a_bundled_config(tmp_path):
    code, output, _ = _run_cli(["plan", "--config", "my_configs/v7.yaml"], tmp_path)
    assert code == 2
    assert output.startswith("error: my_configs/v7.yaml: no such config file"), output


@pytest.mark.parametrize("args,expected", [
    (["--set", "train.epochs"], "--set train.epochs: expected KEY.PATH=VALUE"),
    (["--set", "train.epochs=[1"], "--set train.epochs=[1: the value is not valid YAML"),
    (["--set", "train.epochs=-3"], "train.epochs: Input should be greater than 0"),
    (["--set", "model.layers.9.units=3"], "'9' is not an index of a 4-item list"),
    (["--only", "NOPE*"], "--only NOPE*: matches none of BTCUSDT, ETHUSDT"),
])
def test_bad_command_line_overrides(tmp_path, tiny_config, args, expected):
    path = tiny_config()
    code, output, new_files = _run_cli(["run", "--config", str(path), *args], tmp_path)
    assert code == 2 and expected in output and len(output.strip().splitlines()) == 1, output
    assert new_files == set()


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    commands = ["run", "plan", "status", "push", "predict", "doctor", "features", "data", "data download"]
    for command in commands:
        result = runner.invoke(main, [*command.split(), "--help"])
        assert result.exit_code == 0, command
        lines = result.output.splitlines()
        example = lines.index("  Example:") if "  Example:" in lines else lines.index("  Examples:")
        assert lines[example + 1].startswith(f"    cryptotrain {command}"), (command, lines[example + 1])
