"""Forecasting from a trained job: a real tiny run (the runner, real Keras, real candles), then
predictions from its directory, from a run directory, and from the Hub after a push."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import CANDLES_DIR, as_format_1, tiny_config_dict
from hub_server import serve_hub

from trainer.cli import main
from trainer.config import RunConfig, load_config
from trainer.data import load_candles
from trainer.data.features import compute_features
from trainer.data.scalers import Scaler
from trainer.errors import JobError, UserError
from trainer.evaluation.baselines import Har
from trainer.publish.hub import push_run
from trainer.publish.predict import predict_job, predict_next
from trainer.report.html import write_report
from trainer.run import artifacts
from trainer.run.jobdir import MANIFEST, JobDir
from trainer.run.jobs import make_jobs
from trainer.run.rundir import RunDir
from trainer.run.runner import run_config

pytestmark = pytest.mark.train  # the session's trained run, or a tiny run of the test's own

TOKEN = "hf_PredictTestToken0123456789abcdef"
DATA_FILE = CANDLES_DIR / "BTCUSDT_1h.csv.gz"


@pytest.fixture(scope="module")
def run(trained_run) -> RunConfig:
    """The session's shared run (BTCUSDT and ETHUSDT 1h, 2 epochs: conftest.trained_run), as its config."""
    return load_config(trained_run.config)


@pytest.fixture
def job_dir(run):
    return run.run_dir / "jobs" / "BTCUSDT_1h"


def predict_cli(*args: str) -> str:
    """What `cryptotrain predict ARGS` writes to stdout; it must succeed."""
    result = CliRunner().invoke(main, ["predict", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_forecast_follows_the_last_candle_in_price_units(run, job_dir):
    candles = load_candles(run, "BTCUSDT", "1h")
    forecast = predict_next(job_dir, candles, JobDir(job_dir).config())

    last = candles.index[-1]
    assert list(forecast.index) == [last + pd.Timedelta(hours=k) for k in (1, 2, 3)]
    assert list(forecast.columns) == ["open", "high", "low", "close", "bb_upper", "bb_lower",
                                      "expected_high", "expected_low", "expected_range_pct", "close_80_low",
                                      "close_80_high"]
    assert np.isfinite(forecast.to_numpy()).all()
    ratio = forecast["close"] / candles["close"].iloc[-1]
    assert ratio.between(0.5, 2.0).all()  # prices, not scaled values
    assert (forecast["expected_low"] < forecast["expected_high"]).all()
    assert (forecast["close_80_low"] < forecast["close"]).all()
    assert (forecast["close"] < forecast["close_80_high"]).all()


def _network_weight(value: float):
    def change(stage) -> None:
        metrics = json.loads((stage / "metrics.json").read_text())
        for quantity in ("high", "low"):
            metrics["candles"][quantity]["network_weight"] = [value] * metrics["candles"]["steps"]
        metrics["candles"]["range"]["network_weight"] = [value] * metrics["candles"]["steps"]
        (stage / "metrics.json").write_text(json.dumps(metrics))
    return change


def test_expected_high_and_low_are_the_network_s_and_har_s_as_validation_weighed_them(run, job_dir, tmp_path):
    candles = load_candles(run, "BTCUSDT", "1h")
    last_close = candles["close"].iloc[-1]
    har = Har.from_dict(json.loads((job_dir / "har.json").read_text())).forecast(candles)
    for weight in (0.0, 1.0):
        copy = tmp_path / f"w{weight}" / "jobs" / "BTCUSDT_1h"
        shutil.copytree(job_dir, copy)
        recommit(copy, _network_weight(weight))
        forecast = predict_next(copy, candles, JobDir(copy).config())
        if weight == 0:  # HAR + time of day alone
            np.testing.assert_allclose(forecast["expected_high"], last_close * np.exp(har["high"]), rtol=1e-12)
            np.testing.assert_allclose(forecast["expected_low"], last_close * np.exp(-har["low"]), rtol=1e-12)
            np.testing.assert_allclose(forecast["expected_range_pct"], 100 * np.expm1(har["range"]), rtol=1e-12)
        else:  # the network's own high and low, and the median of its range output (a root mean square), each
            job = JobDir(copy)  # times the factor that put it on its median on validation
            factors = job.metrics().candles.excursion_factors
            np.testing.assert_allclose(forecast["expected_high"], last_close * np.exp(
                np.log(forecast["high"] / last_close) * factors["high"]), rtol=1e-9)
            np.testing.assert_allclose(forecast["expected_low"], last_close * np.exp(
                -np.log(last_close / forecast["low"]) * factors["low"]), rtol=1e-9)
            prep = job.preprocessing()
            x, _ = prep.make_inputs(compute_features(candles, job.config().features))
            harness = Har.from_dict(json.loads((job_dir / "har.json").read_text()))
            outputs = job.model()(prep.model_inputs(x, harness.inputs(candles)), training=False)
            scores = job.metrics().candles  # the output times its QLIKE factor is the rms, over the ratio the median
            median = prep.range_forecast({k: np.asarray(v) for k, v in outputs.items()})[0] \
                * np.asarray(scores.range_rms_factor) / np.asarray(scores.range_rms_ratio)
            np.testing.assert_allclose(forecast["expected_range_pct"], 100 * np.expm1(median), rtol=1e-6)
            assert not np.allclose(forecast["expected_range_pct"], 100 * (forecast["high"] / forecast["low"] - 1))


def test_forecast_reproduces_the_runners_test_predictions(run, job_dir):
    """Forecasting from the candles before the last test sample's targets gives that sample's prediction."""
    saved = np.load(job_dir / "predictions.npz")
    first_target = saved["target_times"][-1]
    candles = load_candles(run, "BTCUSDT", "1h")
    forecast = predict_next(job_dir, candles[candles.index.values < first_target], JobDir(job_dir).config())

    assert forecast.index[0].to_datetime64() == first_target
    np.testing.assert_allclose(forecast[["open", "high", "low", "close"]], saved["ohlc"][-1], rtol=1e-5)
    np.testing.assert_allclose(forecast[["bb_upper", "bb_lower"]], saved["bb"][-1], rtol=1e-5)


def test_predict_command_from_a_run_directory_and_a_data_file(run):
    out = json.loads(predict_cli("--model", str(run.run_dir), "--symbol", "BTCUSDT", "--timeframe", "1h",
                                 "--data", str(DATA_FILE), "--json"))

    last = pd.read_csv(DATA_FILE)["timestamp"].iloc[-1]
    assert pd.Timestamp(out["last_candle"]) == pd.Timestamp(last)
    assert [pd.Timestamp(row["timestamp"]) for row in out["forecast"]] == [
        pd.Timestamp(last) + pd.Timedelta(hours=k) for k in (1, 2, 3)]
    assert all(row["close"] > 0 for row in out["forecast"])


def test_predict_command_table_from_the_jobs_own_data(run, job_dir):
    out = predict_cli("--model", str(job_dir))

    next_open = load_candles(run, "BTCUSDT", "1h").index[-1] + pd.Timedelta(hours=1)
    assert f"{next_open:%Y-%m-%d %H:%M}" in out
    assert "bb_upper" in out
    assert f"from local:{DATA_FILE}" in out and "SYNTHETIC" not in out


def test_a_forecast_from_synthetic_candles_says_so(run, job_dir, tmp_path):
    raw = tiny_config_dict(tmp_path)
    raw["data"] = {"source": "synthetic", "synthetic": {"seed": 3, "rows": 400}, "symbols": ["BTCUSDT"],
                   "timeframes": ["1h"]}
    config = tmp_path / "synthetic.yaml"
    config.write_text(yaml.safe_dump(raw))

    out = predict_cli("--model", str(job_dir), "--config", str(config))
    assert "from synthetic(seed=3) (SYNTHETIC candles: a demonstration, not a market)" in out
    prediction = predict_job(str(job_dir), None, None, data_path=None, config_path=str(config))
    assert prediction.synthetic is True and prediction.as_dict()["synthetic"] is True
    assert prediction.candles_source == "synthetic(seed=3)"


def test_predictions_after_a_hub_round_trip_equal_the_local_ones(run, job_dir, monkeypatch, tmp_path):
    run_dir = Path(shutil.copytree(run.run_dir, tmp_path / "run"))  # a push records itself in the ledger
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache"):
        with RunDir.open(run_dir, config_required=True) as opened:
            push_run(opened, repo_id="tester/cpb", private=True, overwrite_cards=False, only=())
        remote = predict_job("hf://tester/cpb", symbol="BTCUSDT", timeframe="1h", data_path=DATA_FILE,
                             config_path=None)
    local = predict_job(str(job_dir), symbol=None, timeframe=None, data_path=DATA_FILE, config_path=None)

    assert remote.model == "hf://tester/cpb/BTCUSDT/1h"
    assert remote.as_dict()["forecast"] == local.as_dict()["forecast"]


def test_a_changed_job_directory_is_refused(job_dir, tmp_path):
    changed = tmp_path / "job"
    shutil.copytree(job_dir, changed)
    (changed / "preprocessing.json").write_text((job_dir / "preprocessing.json").read_text().replace("16", "17"))
    with pytest.raises(UserError, match="do not match manifest.json"):
        predict_job(str(changed), symbol=None, timeframe=None, data_path=DATA_FILE, config_path=None)


@pytest.mark.parametrize("model_ref, symbol, message", [
    (".", None, "not a job directory"),
    ("RUN", None, r"pass --symbol and --timeframe \(finished jobs: BTCUSDT_1h, ETHUSDT_1h\)"),
    ("RUN", "SOLUSDT", "no finished job SOLUSDT_1h"),
    ("JOB", "ETHUSDT", "--symbol ETHUSDT: the model .* is for BTCUSDT 1h"),
])
def test_bad_model_references(run, job_dir, model_ref, symbol, message):
    ref = {"RUN": str(run.run_dir), "JOB": str(job_dir)}.get(model_ref, model_ref)
    with pytest.raises(UserError, match=message):
        predict_job(ref, symbol=symbol, timeframe="1h", data_path=DATA_FILE, config_path=None)


@pytest.mark.parametrize("name, content, reason", [
    ("model.keras", b"garbage", "not a .keras .zip. file"),
    ("model.keras", None, "not a .keras .zip. file"),  # truncated: its first half
    ("preprocessing.json", b'{"lookback":', "JSONDecodeError"),
    ("preprocessing.json", b'{"x": 1}', "no symbol and timeframe"),
    ("config.yaml", b"features: [", "ParserError|ScannerError"),
    ("metrics.json", b"{}", "ValidationError: job: Field required"),
])
def test_garbage_job_files_under_a_valid_manifest_are_one_line(job_dir, tmp_path, name, content, reason):
    """Files that match their manifest but are not what they claim to be (written so, or published so)."""
    copy = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    shutil.copytree(job_dir, copy)

    def spoil(stage) -> None:
        path = stage / name
        path.write_bytes(content if content is not None else path.read_bytes()[: path.stat().st_size // 2])
    recommit(copy, spoil)

    with pytest.raises(UserError, match=rf"^{copy / name}: cannot be read \(.*({reason}).*\); train the job again"):
        predict_job(str(copy), None, None, data_path=DATA_FILE, config_path=None)


def test_a_model_holding_python_code_is_refused_saying_so_in_one_line(job_dir, tmp_path):
    """A job from someone else (a Hub repo) whose model.keras holds a Lambda layer: loading it would run the
    code it carries, so Keras's safe mode refuses it, and predict says so, naming the file and what is in it."""
    copy = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    shutil.copytree(job_dir, copy)

    def with_code(stage) -> None:
        inputs = keras.Input((3,))
        keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2, name="doubled")(inputs)).save(stage / "model.keras")
    recommit(copy, with_code)  # its manifest matches: as published

    result = CliRunner().invoke(main, ["predict", "--model", str(copy), "--data", str(DATA_FILE)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {copy / 'model.keras'}: holds Python code (in Lambda 'doubled'), which loading the model would "
        "run, so it is refused (Keras's safe mode); a model cryptotrain trains holds none: this one was made or "
        "changed elsewhere"]


def recommit(job_dir, change) -> None:
    """Change a finished job's files (change(stage_dir)), then commit them with a new manifest."""
    stage = artifacts.staging_dir(job_dir.parent.parent, job_dir.name)
    for path in job_dir.iterdir():
        if path.name != MANIFEST:
            shutil.copy(path, stage)
    change(stage)
    artifacts.commit(stage, job_dir)


def _zero_weights(stage) -> None:
    model = keras.saving.load_model(stage / "model.keras", compile=False)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.save(stage / "model.keras")


def test_a_model_that_outputs_zeros_forecasts_the_last_close_locally_and_after_a_hub_round_trip(
        run, monkeypatch, tmp_path):
    """Relative to the last close, an all-zero output is "no change": the forecast close (and open, and the
    bands) is the last close exactly, through predict and after a push and download."""
    run_dir = tmp_path / "zero-run"
    shutil.copytree(run.run_dir, run_dir)
    job_dir = run_dir / "jobs" / "BTCUSDT_1h"
    recommit(job_dir, _zero_weights)
    candles = load_candles(run, "BTCUSDT", "1h")
    last_close = candles["close"].iloc[-1]

    forecast = predict_next(job_dir, candles, JobDir(job_dir).config())
    for column in ("open", "close", "bb_upper", "bb_lower"):
        np.testing.assert_array_equal(forecast[column], np.full(3, last_close))
    assert (forecast["high"] > last_close).all() and (forecast["low"] < last_close).all()  # wicks, never inside

    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache"):
        with RunDir.open(run_dir, config_required=True) as opened:
            push_run(opened, repo_id="tester/zero", private=True, overwrite_cards=False, only=())
        remote = predict_job("hf://tester/zero/BTCUSDT/1h", symbol=None, timeframe=None, data_path=DATA_FILE,
                             config_path=None).as_dict()
    assert [row["close"] for row in remote["forecast"]] == [pd.read_csv(DATA_FILE)["close"].iloc[-1]] * 3


def test_a_push_uploads_a_plot_drawn_from_the_jobs_files(run, job_dir, monkeypatch, tmp_path):
    """plot.png is no longer in a job directory (format 2): a push draws it from history.csv and predictions.npz,
    the same bytes each time (a second push adds nothing)."""
    run_dir = Path(shutil.copytree(run.run_dir, tmp_path / "run"))  # a push records itself in the ledger
    assert not (job_dir / "plot.png").exists()
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as hub:
        for _ in range(2):
            with RunDir.open(run_dir, config_required=True) as opened:
                push_run(opened, repo_id="tester/plot", private=True, overwrite_cards=False, only=())
        remote = hub.files("tester/plot")["BTCUSDT/1h/plot.png"]
        assert len(hub.commits("tester/plot")) == 1
    assert remote == JobDir(job_dir).plot()
    width, height = int.from_bytes(remote[16:20], "big"), int.from_bytes(remote[20:24], "big")
    assert remote[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (792, 468)  # both charts: losses, closes


def _headline_skill(value: float, interval_of_earlier_versions: bool):
    def change(stage) -> None:
        metrics = json.loads((stage / "metrics.json").read_text())
        metrics["headline"]["skill"] = value
        if interval_of_earlier_versions:  # split conformal's, without a method
            for key in ("method", "gamma", "level"):
                del metrics["candles"]["interval"][key]
        (stage / "metrics.json").write_text(json.dumps(metrics))
    return change


@pytest.mark.parametrize("skill, worse, earlier", [(-0.25, True, True), (0.03, False, False)])
def test_the_forecast_comes_with_the_models_test_skill_said_plainly(run, job_dir, tmp_path, skill, worse, earlier):
    """With how its interval was calibrated: the level adaptive conformal ended the test split at (the run's
    default), or split conformal's (a metrics.json of an earlier version)."""
    copy = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    shutil.copytree(job_dir, copy)
    recommit(copy, _headline_skill(skill, earlier))
    level = JobDir(job_dir).metrics().candles.interval.level[0]
    calibration = "split conformal on validation" if earlier else \
        f"adaptive conformal, level {level:.2f} after the test split"

    out = predict_cli("--model", str(copy), "--data", str(DATA_FILE))
    assert f"skill {skill:+.3f}" in out
    assert "Its next candle against HAR + time of day (MAE skill): high " in out and "80 % interval held" in out
    assert f"close_80_low / close_80_high: the 80 % interval ({calibration})." in " ".join(out.split())
    assert ("WORSE than persistence" in out) is worse
    record = json.loads(predict_cli("--model", str(copy), "--data", str(DATA_FILE), "--json"))["test_skill"]
    assert (record["skill"], record["worse_than_persistence"], record["column"]) == (skill, worse, "close")
    assert (record["candles"]["interval_method"], record["candles"]["interval_level"]) == \
        (("split", None) if earlier else ("adaptive", level))


def test_a_job_of_an_earlier_version_with_absolute_levels_still_loads_predicts_and_reports(tmp_path):
    """Run directories made before framing, of format 1 (no format in the manifest): no relative_to, targets
    scaled with the inputs' scaler, no headline in metrics.json, no candle heads in config.yaml."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["data"]["symbols"] = ["BTCUSDT"]
    raw["window"]["relative_to"] = None
    raw["heads"][0]["candle"] = False
    raw["train"]["epochs"] = 1
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg)).complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"

    def as_before(stage) -> None:
        prep = json.loads((stage / "preprocessing.json").read_text())
        del prep["relative_to"]
        for head in prep["heads"]:
            del head["scaler"], head["candle"]
        (stage / "preprocessing.json").write_text(json.dumps(prep))
        metrics = json.loads((stage / "metrics.json").read_text())
        del metrics["headline"], metrics["candles"]
        (stage / "metrics.json").write_text(json.dumps(metrics))
        (stage / "har.json").unlink()
        config = yaml.safe_load((stage / "config.yaml").read_text())
        del config["window"]["relative_to"]
        for head in config["heads"]:
            del head["candle"]
        (stage / "config.yaml").write_text(yaml.safe_dump(config))
    recommit(job_dir, as_before)
    as_format_1(job_dir)

    candles = load_candles(cfg, "BTCUSDT", "1h")
    forecast = predict_next(job_dir, candles, JobDir(job_dir).config())
    prep = json.loads((job_dir / "preprocessing.json").read_text())
    scaler = Scaler.from_dict(prep["scaler"])  # the old way, spelled out: one scaler, absolute levels
    frame = compute_features(candles, cfg.features).iloc[-16:]
    x = scaler.transform(frame, cfg.features.columns)[None]
    outputs = keras.saving.load_model(job_dir / "model.keras", compile=False)(x, training=False)
    np.testing.assert_allclose(forecast[["open", "high", "low", "close"]],
                               scaler.inverse(np.asarray(outputs["ohlc"])[0], ["open", "high", "low", "close"]),
                               rtol=1e-6)
    assert "expected_high" not in forecast.columns
    assert json.loads(predict_cli("--model", str(job_dir), "--data", str(DATA_FILE), "--json"))["forecast"]

    with RunDir.open(cfg.run_dir) as opened:  # the report reads it too: its derived headline, its charts
        page = write_report(opened, tmp_path / "report.html").read_text()
    assert "from the run ledger" not in page and "unreadable" not in page and "no price chart" not in page
    assert f"{JobDir(job_dir).metrics().headline.skill:+.3f}" in page


def test_a_job_of_the_version_before_har_heads_still_loads_predicts_and_reports(tmp_path):
    """Run directories made before HAR-started heads, the market input and adaptive intervals: a free candle head,
    har.json without the range's log variance, metrics.json without the range's QLIKE of the network's own, the
    mean range, the range's rms ratio and the interval's method, predictions.npz without what users get."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["data"]["symbols"] = ["BTCUSDT"]
    raw["train"]["epochs"] = 1
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg)).complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"
    candles = load_candles(cfg, "BTCUSDT", "1h")
    now = predict_next(job_dir, candles, JobDir(job_dir).config())

    def as_before(stage) -> None:
        prep = json.loads((stage / "preprocessing.json").read_text())
        del prep["market"]
        for head in prep["heads"]:
            del head["har"]
        (stage / "preprocessing.json").write_text(json.dumps(prep))
        metrics = json.loads((stage / "metrics.json").read_text())
        candle = metrics["candles"]
        del candle["mean_range"], candle["range_rms_ratio"], candle["range_rms_factor"]
        del candle["range"]["network_qlike_skill"]
        for key in ("method", "gamma", "level"):
            candle["interval"].pop(key, None)
        (stage / "metrics.json").write_text(json.dumps(metrics))
        har = json.loads((stage / "har.json").read_text())
        del har["log_variance"]
        (stage / "har.json").write_text(json.dumps(har))
        saved = dict(np.load(stage / "predictions.npz"))
        served = ("expected_", "network_", "interval_")
        np.savez(stage / "predictions.npz", **{k: v for k, v in saved.items() if not k.startswith(served)})
        config = yaml.safe_load((stage / "config.yaml").read_text())
        del config["evaluation"], config["features"]["market"]
        for head in config["heads"]:
            del head["har"]
        (stage / "config.yaml").write_text(yaml.safe_dump(config))
    recommit(job_dir, as_before)

    before = predict_next(job_dir, candles, JobDir(job_dir).config())
    pd.testing.assert_frame_equal(before, now)  # the same forecast, the interval's margin split conformal's
    assert json.loads(predict_cli("--model", str(job_dir), "--data", str(DATA_FILE), "--json"))["forecast"]
    with RunDir.open(cfg.run_dir) as opened:
        page = write_report(opened, tmp_path / "report.html").read_text()
    assert "unreadable" not in page and "no price chart" not in page


def test_the_card_of_a_real_job_shows_the_next_candle_vs_har_and_the_interval(job_dir):
    """The job's model card (what the Hub shows): the next candle's skill vs each baseline, the network's weight,
    the interval's coverage - in the text and in the model-index metrics."""
    from trainer.publish.cards import job_card

    candles = json.loads((job_dir / "metrics.json").read_text())["candles"]
    card = job_card(job_dir, "tester/cards", "BTCUSDT/1h")
    assert "### The next candle: its high, low and range" in card
    high = candles["high"]
    row = next(line for line in card.splitlines() if line.startswith("| high | "))
    assert f"{high['skill']['har_tod']:.4g}" in row and f"{high['network_weight'][0]:.4g}" in row
    assert f"it held {candles['interval']['coverage']:.4g} of the test split" in card
    metadata = yaml.safe_load(card.split("---\n")[1])
    results = {m["name"]: m["value"] for r in metadata["model-index"][0]["results"] for m in r["metrics"]}
    for quantity in ("high", "low", "range"):
        assert results[f"next candle {quantity}: skill vs HAR + time of day (1 - MAE / HAR MAE)"] == pytest.approx(
            candles[quantity]["skill"]["har_tod"])
    assert results["80 % interval of the next close: coverage"] == pytest.approx(candles["interval"]["coverage"])


def test_the_card_of_a_close_shrunk_to_no_change_gives_it_no_direction_accuracy(job_dir, tmp_path):
    """Shrink 0: the close is always the last close, it forecasts no direction; the card says so, and shows "—"
    where its direction accuracy would be."""
    from trainer.publish.cards import job_card

    def no_change(stage) -> None:
        metrics = json.loads((stage / "metrics.json").read_text())
        metrics["headline"] |= {"shrink": 0.0, "direction_accuracy": 0.123}
        metrics["heads"]["ohlc"]["shrink"] = 0.0
        metrics["heads"]["ohlc"]["model"]["direction_accuracy"] = 0.123
        (stage / "metrics.json").write_text(json.dumps(metrics))

    copy = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    shutil.copytree(job_dir, copy)
    recommit(copy, no_change)
    card = job_card(copy, "tester/cards", "BTCUSDT/1h")
    assert "this model forecasts the close as the last close" in card
    assert "Direction of the close" not in card and "0.123" not in card
    assert next(line for line in card.splitlines() if line.startswith("| ohlc | model |")).count("| — |") == 1


def test_a_quantile_head_trains_scores_and_forecasts_its_quantiles_in_order(tmp_path):
    """A head of quantiles on the close, end to end: trained with the pinball loss, scored on the test split
    (pinball per level, coverage of the outer pair), and `predict` gives each level, ordered, around the median."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["data"]["symbols"] = ["BTCUSDT"]
    raw["heads"].append({"name": "close_q", "columns": ["close"], "quantiles": [0.1, 0.5, 0.9]})
    raw["train"]["epochs"] = 2
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg)).complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"
    scores = json.loads((job_dir / "metrics.json").read_text())["heads"]["close_q"]
    assert scores["quantiles"]["levels"] == [0.1, 0.5, 0.9] and scores["quantiles"]["nominal"] == pytest.approx(0.8)
    assert 0 < scores["quantiles"]["coverage"] <= 1 and all(p > 0 for p in scores["quantiles"]["pinball"])
    assert scores["quantiles"]["below"] == sorted(scores["quantiles"]["below"])
    forecast = predict_next(job_dir, load_candles(cfg, "BTCUSDT", "1h"), JobDir(job_dir).config())
    low, median, high = (forecast[f"close_q.close_q{q}"] for q in (10, 50, 90))
    assert (low <= median).all() and (median <= high).all() and (low < high).all()
    np.testing.assert_allclose(forecast["close_q.close"], median)  # the point forecast is the median


def test_a_job_with_the_market_input_trains_and_predict_reads_its_references(tmp_path):
    """features.market end to end: one tiny job trains with the market_range column, its references' levels are
    stored with it, and `predict` computes the same column after the candles given (it reproduces the runner's
    last test prediction), reading the references from the job's data source, or says in one line what it lacks."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["features"]["market"] = {"symbols": "run"}
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg, only=("BTCUSDT_1h",))).complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"
    prep = JobDir(job_dir).preprocessing()
    assert prep.input_columns[-1] == "market_range" and [r.symbol for r in prep.market] == ["ETHUSDT"]

    saved = np.load(job_dir / "predictions.npz")
    candles = load_candles(cfg, "BTCUSDT", "1h")
    references = {"ETHUSDT": load_candles(cfg, "ETHUSDT", "1h")}
    forecast = predict_next(job_dir, candles[candles.index.values < saved["target_times"][-1]],
                            JobDir(job_dir).config(), references)
    np.testing.assert_allclose(forecast[["open", "high", "low", "close"]], saved["ohlc"][-1], rtol=1e-5)

    # BTC's own file goes on two hours past ETH's: the forecast follows the last candle ETH's covers, and says so
    followed = predict_job(str(job_dir), None, None, None, None)
    assert (followed.last_candle, followed.left_out) == (references["ETHUSDT"].index[-1], 2)
    assert "the 2 later candle(s) given have no reference series' candle yet" in predict_cli("--model", str(job_dir))
    ending = tmp_path / "btc.csv"
    candles[candles.index <= references["ETHUSDT"].index[-1]].to_csv(ending)
    assert predict_job(str(job_dir), None, None, ending, None).last_candle == references["ETHUSDT"].index[-1]
    moved = tmp_path / "moved"
    shutil.copytree(CANDLES_DIR, moved)
    (moved / "ETHUSDT_1h.csv.gz").unlink()
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**raw, "data": {**raw["data"], "local": {"path": str(moved)}}}))
    with pytest.raises(JobError, match=r"^market reference ETHUSDT: local:\S+ETHUSDT_1h\.csv\.gz: no such file"):
        predict_job(str(job_dir), None, None, ending, str(other))
