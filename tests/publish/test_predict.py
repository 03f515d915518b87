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
from conftest import CANDLES_DIR, tiny_config_dict
from hub_server import serve_hub

from trainer.cli import main
from trainer.config import RunConfig, load_config
from trainer.data import load_candles
from trainer.data.features import compute_features
from trainer.data.scalers import Scaler
from trainer.errors import JobError, UserError
from trainer.evaluation.baselines import Har
from trainer.publish.hub import push_run
from trainer.publish.plots import job_plot
from trainer.publish.predict import Forecaster, predict_job, predict_next
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
                                      "expected_high", "expected_low", "expected_range_pct", "expected_range_rms_pct",
                                      "close_80_low", "close_80_high"]
    assert np.isfinite(forecast.to_numpy()).all()
    ratio = forecast["close"] / candles["close"].iloc[-1]
    assert ratio.between(0.5, 2.0).all()  # prices, not scaled values
    assert (forecast["expected_low"] < forecast["expected_high"]).all()
    assert (forecast["expected_range_pct"] < forecast["expected_range_rms_pct"]).all()  # a median below the rms
    assert (forecast["close_80_low"] < forecast["close"]).all()
    assert (forecast["close"] < forecast["close_80_high"]).all()


def _network_weight(value: float):
    """What is served made the network's alone (1) or HAR + time of day's alone (0), medians and root mean square."""
    def change(stage) -> None:
        serving = json.loads((stage / "serving.json").read_text())
        steps = len(serving["margin"])
        weights = {"network": [value] * steps, "har_tod": [1 - value] * steps}
        serving |= {"weights": dict.fromkeys(("high", "low", "range"), weights), "rms_weights": weights}
        (stage / "serving.json").write_text(json.dumps(serving))
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
        serving = JobDir(copy).serving()
        if weight == 0:  # HAR + time of day alone: its medians as fitted, its root mean square on its level
            np.testing.assert_allclose(forecast["expected_high"], last_close * np.exp(har["high"]), rtol=1e-12)
            np.testing.assert_allclose(forecast["expected_low"], last_close * np.exp(-har["low"]), rtol=1e-12)
            np.testing.assert_allclose(forecast["expected_range_pct"], 100 * np.expm1(har["range"]), rtol=1e-12)
            np.testing.assert_allclose(forecast["expected_range_rms_pct"], 100 * np.expm1(
                har["range_rms"] * np.asarray(serving.rms_levels["har_tod"])), rtol=1e-12)
        else:  # the network's own high, low and range (its range output), each put on its level on validation
            job = JobDir(copy)
            prep = job.preprocessing()
            x, last = prep.make_inputs(compute_features(candles, job.config().features))
            outputs = job.model()(prep.model_inputs(x, prep.forecast_inputs(job.har_tod().inputs(candles))),
                                  training=False)
            outputs = {k: np.asarray(v) for k, v in outputs.items()}
            network = prep.candle_quantities(prep.heads[0], outputs, prep.to_prices(prep.point(outputs), last)["ohlc"],
                                             last.close)
            factors = serving.median_factors
            np.testing.assert_allclose(forecast["expected_high"], last_close * np.exp(
                network["high"][0] * factors["high"]), rtol=1e-9)
            np.testing.assert_allclose(forecast["expected_low"], last_close * np.exp(
                -network["low"][0] * factors["low"]), rtol=1e-9)
            np.testing.assert_allclose(forecast["expected_range_pct"], 100 * np.expm1(
                network["range"][0] * factors["range"]), rtol=1e-9)
            np.testing.assert_allclose(forecast["expected_range_rms_pct"], 100 * np.expm1(
                network["range"][0] * np.asarray(serving.rms_factor)), rtol=1e-9)
            assert not np.allclose(forecast["expected_range_pct"], 100 * (forecast["high"] / forecast["low"] - 1))


def test_forecast_reproduces_the_runners_test_predictions_on_every_test_window(run, job_dir):
    """Forecasting from the candles before each test sample's targets gives what predictions.npz holds for that
    sample: each head's candles, and what users get of the size of the coming candles - the expected high, low,
    range, the range's root mean square - and the 80 % interval of the close under the default interval, adaptive
    conformal's, whose margin moves along the test split: predict widens it by the margin of that time (HAR's EWMA
    volatility, started afresh a week back, accounts for the tolerance). This job has no HAR-X; the market input's
    test below checks one that has."""
    saved = np.load(job_dir / "predictions.npz")
    assert len(np.unique(saved["interval_margin"][:, 0])) > 1  # adaptive: the margin moved along the test split
    assert not (job_dir / "harx.json").exists()
    candles = load_candles(run, "BTCUSDT", "1h")
    forecaster = Forecaster.load(job_dir, JobDir(job_dir).config())
    for window, first_target in enumerate(saved["target_times"]):
        before = candles[candles.index.to_numpy("datetime64[ns]") < first_target]
        forecast = forecaster.next(before)
        assert forecast.index[0].to_datetime64() == first_target
        np.testing.assert_allclose(forecast[["open", "high", "low", "close"]], saved["ohlc"][window], rtol=1e-5)
        np.testing.assert_allclose(forecast[["bb_upper", "bb_lower"]], saved["bb"][window], rtol=1e-5)
        _assert_served_as_saved(forecast, before["close"].iloc[-1], saved, window)


def _assert_served_as_saved(forecast: pd.DataFrame, last_close: float, saved, window: int) -> None:
    """What predict served after `last_close` (price units, percent) is predictions.npz's of that test window (log
    units from the last close)."""
    log = np.log(forecast / last_close)
    served = {"expected_high": log["expected_high"], "expected_low": -log["expected_low"],
              "expected_range": np.log1p(forecast["expected_range_pct"] / 100),
              "expected_range_rms": np.log1p(forecast["expected_range_rms_pct"] / 100),
              "interval_low": log["close_80_low"], "interval_high": log["close_80_high"]}
    for name, values in served.items():
        np.testing.assert_allclose(values, saved[name][window], rtol=1e-4 if name.startswith("interval") else 1e-5,
                                   atol=1e-7, err_msg=f"{name}, test window {window}")


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
    artifacts.seal(stage)
    artifacts.commit(stage, job_dir)


def _zero_weights(stage) -> None:
    model = keras.saving.load_model(stage / "model.keras", compile=False)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.save(stage / "model.keras")


def test_a_model_that_outputs_zeros_forecasts_the_last_close_locally_and_after_a_hub_round_trip(
        run, monkeypatch, tmp_path):
    """Relative to the last close, an all-zero output is "no change": the forecast close (and open) is the last close
    exactly, through predict and after a push and download; the bands are "no change" mixed with their own last
    values as the job's factor says (0: those values)."""
    run_dir = tmp_path / "zero-run"
    shutil.copytree(run.run_dir, run_dir)
    job_dir = run_dir / "jobs" / "BTCUSDT_1h"
    recommit(job_dir, _zero_weights)
    candles = load_candles(run, "BTCUSDT", "1h")
    last_close = candles["close"].iloc[-1]

    forecast = predict_next(job_dir, candles, JobDir(job_dir).config())
    for column in ("open", "close"):
        np.testing.assert_array_equal(forecast[column], np.full(3, last_close))
    factor = next(h.shrink for h in JobDir(job_dir).preprocessing().heads if h.name == "bb")
    bands = compute_features(candles, JobDir(job_dir).config().features)[["bb_upper", "bb_lower"]].iloc[-1]
    np.testing.assert_allclose(forecast[["bb_upper", "bb_lower"]],
                               np.tile(last_close * (bands.to_numpy() / last_close) ** (1 - factor), (3, 1)), rtol=1e-9)
    assert (forecast["high"] > last_close).all() and (forecast["low"] < last_close).all()  # wicks, never inside

    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache"):
        with RunDir.open(run_dir, config_required=True) as opened:
            push_run(opened, repo_id="tester/zero", private=True, overwrite_cards=False, only=())
        remote = predict_job("hf://tester/zero/BTCUSDT/1h", symbol=None, timeframe=None, data_path=DATA_FILE,
                             config_path=None).as_dict()
    assert [row["close"] for row in remote["forecast"]] == [pd.read_csv(DATA_FILE)["close"].iloc[-1]] * 3


def test_a_push_uploads_a_plot_drawn_from_the_jobs_files(run, job_dir, monkeypatch, tmp_path):
    """plot.png is not in a job directory: a push draws it from history.csv and predictions.npz, the same bytes each
    time (a second push adds nothing)."""
    run_dir = Path(shutil.copytree(run.run_dir, tmp_path / "run"))  # a push records itself in the ledger
    assert not (job_dir / "plot.png").exists()
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as hub:
        for _ in range(2):
            with RunDir.open(run_dir, config_required=True) as opened:
                push_run(opened, repo_id="tester/plot", private=True, overwrite_cards=False, only=())
        remote = hub.files("tester/plot")["BTCUSDT/1h/plot.png"]
        assert len(hub.commits("tester/plot")) == 1
    assert remote == job_plot(JobDir(job_dir))
    width, height = int.from_bytes(remote[16:20], "big"), int.from_bytes(remote[20:24], "big")
    assert remote[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (792, 468)  # both charts: losses, closes


def _headline_skill(value: float, adaptive: bool):
    def change(stage) -> None:
        metrics = json.loads((stage / "metrics.json").read_text())
        metrics["headline"]["skill"] = value
        # as adaptive conformal leaves it (the level it ended the test split at), or as split conformal does
        metrics["candles"]["interval"] |= {"method": "adaptive", "gamma": 0.005, "level": [0.83, 0.81, 0.8]} \
            if adaptive else {"method": "split", "gamma": None, "level": None}
        (stage / "metrics.json").write_text(json.dumps(metrics))
    return change


@pytest.mark.parametrize("skill, worse, adaptive", [(-0.25, True, True), (0.03, False, False)])
def test_the_forecast_comes_with_the_models_test_skill_said_plainly(run, job_dir, tmp_path, skill, worse, adaptive):
    """With how its interval was calibrated: split conformal's on validation, or the level adaptive conformal ended
    the test split at."""
    copy = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    shutil.copytree(job_dir, copy)
    recommit(copy, _headline_skill(skill, adaptive))
    calibration = "adaptive conformal, level 0.83 after the test split" if adaptive else \
        "split conformal on validation"

    out = predict_cli("--model", str(copy), "--data", str(DATA_FILE))
    assert f"skill {skill:+.3f}" in out
    assert "Its next candle against HAR + time of day on its validation level (MAE skill): high " in \
        " ".join(out.split()) and "80 % interval held" in out
    assert f"close_80_low / close_80_high: the 80 % interval ({calibration})." in " ".join(out.split())
    assert ("WORSE than persistence" in out) is worse
    record = json.loads(predict_cli("--model", str(copy), "--data", str(DATA_FILE), "--json"))["test_skill"]
    assert (record["skill"], record["worse_than_persistence"], record["column"]) == (skill, worse, "close")
    assert (record["candles"]["interval_method"], record["candles"]["interval_level"]) == \
        (("adaptive", 0.83) if adaptive else ("split", None))


def test_a_job_on_absolute_levels_predicts_as_its_scaler_says_and_reports(tmp_path):
    """window.relative_to null (the old scripts' framing): a plain head over the candle's columns, scaled on absolute
    levels; predict inverts the scaled outputs to prices, and the report reads the job."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["data"]["symbols"] = ["BTCUSDT"]
    raw["window"]["relative_to"] = None
    raw["heads"][0]["kind"] = "plain"
    raw["train"]["epochs"] = 1
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg), engine="tensorflow").complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"

    candles = load_candles(cfg, "BTCUSDT", "1h")
    forecast = predict_next(job_dir, candles, JobDir(job_dir).config())
    prep = json.loads((job_dir / "preprocessing.json").read_text())
    scaler, head = Scaler.from_dict(prep["scaler"]), Scaler.from_dict(prep["heads"][0]["scaler"])
    frame = compute_features(candles, cfg.features).iloc[-16:]
    x = scaler.transform(frame, cfg.features.columns)[None]  # spelled out: absolute levels, scaled
    outputs = keras.saving.load_model(job_dir / "model.keras", compile=False)(x, training=False)
    factor = prep["heads"][0]["shrink"]  # the network mixed with each column's last value, as validation chose
    candle = ["open", "high", "low", "close"]
    np.testing.assert_allclose(forecast[candle], factor * head.inverse(np.asarray(outputs["ohlc"])[0], candle)
                               + (1 - factor) * frame[candle].to_numpy()[-1], rtol=1e-6)
    assert json.loads(predict_cli("--model", str(job_dir), "--data", str(DATA_FILE), "--json"))["forecast"]

    with RunDir.open(cfg.run_dir) as opened:  # the report reads it too: its headline, its charts
        page = write_report(opened, tmp_path / "report.html").read_text()
    assert "from the run ledger" not in page and "unreadable" not in page and "no price chart" not in page
    assert f"{JobDir(job_dir).metrics().headline.skill:+.3f}" in page


def test_the_card_of_a_real_job_shows_the_next_candle_vs_har_and_the_interval(job_dir):
    """The job's model card (what the Hub shows): the next candle's skill vs each baseline, the network's weight,
    the interval's coverage - in the text and in the model-index metrics."""
    from trainer.publish.cards import job_card

    candles = json.loads((job_dir / "metrics.json").read_text())["candles"]
    card = job_card(job_dir, "tester/cards", "BTCUSDT/1h")
    assert "### The next candle: its high, low and range" in card
    high = candles["high"]
    row = next(line for line in card.splitlines() if line.startswith("| high | "))
    assert f"{high['skill']['har_tod']:.4g}" in row and f"{high['skill']['har_tod_level']:.4g}" in row
    assert f"{high['network_weight'][0]:.4g}" in row
    assert f"it held {candles['interval']['coverage']:.4g} of the test split" in " ".join(card.split())
    metadata = yaml.safe_load(card.split("---\n")[1])
    results = {m["name"]: m["value"] for r in metadata["model-index"][0]["results"] for m in r["metrics"]}
    for quantity in ("high", "low", "range"):
        assert results[f"next candle {quantity}: skill vs HAR + time of day on its validation level (1 - MAE / HAR "
                       "MAE)"] == pytest.approx(candles[quantity]["skill"]["har_tod_level"])
    [coverage] = [value for name, value in results.items()
                  if name.startswith("80 % interval of the next close (adaptive conformal, level ")]
    assert coverage == pytest.approx(candles["interval"]["coverage"])


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
    raw["heads"].append({"name": "close_q", "kind": "quantile", "columns": ["close"], "quantiles": [0.1, 0.5, 0.9]})
    raw["train"]["epochs"] = 2
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg), engine="tensorflow").complete
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
    test predictions, each), reading the references from the job's data source, or says in one line what it lacks."""
    raw = tiny_config_dict(tmp_path, cache_dir=str(tmp_path / "cache"))
    raw["features"]["market"] = {"symbols": "run"}
    cfg = RunConfig.model_validate(raw)
    assert run_config(cfg, make_jobs(cfg, only=("BTCUSDT_1h",)), engine="tensorflow").complete
    job_dir = cfg.run_dir / "jobs" / "BTCUSDT_1h"
    prep = JobDir(job_dir).preprocessing()
    assert prep.input_columns[-1] == "market_range" and [r.symbol for r in prep.market] == ["ETHUSDT"]

    saved = np.load(job_dir / "predictions.npz")
    candles = load_candles(cfg, "BTCUSDT", "1h")
    references = {"ETHUSDT": load_candles(cfg, "ETHUSDT", "1h")}
    # HAR-X (HAR with the market's range) is among what is served, and predict serves it as evaluation did, on every
    # test window
    assert (job_dir / "harx.json").is_file()
    scores = JobDir(job_dir).metrics().candles
    assert set(scores.range.weights) == {"network", "harx", "har_tod"}
    np.testing.assert_allclose(np.sum(list(scores.range.weights.values()), axis=0), 1.0)
    forecaster = Forecaster.load(job_dir, JobDir(job_dir).config())
    for window, first_target in enumerate(saved["target_times"]):
        before = candles[candles.index.to_numpy("datetime64[ns]") < first_target]
        forecast = forecaster.next(before, references)
        np.testing.assert_allclose(forecast[["open", "high", "low", "close"]], saved["ohlc"][window], rtol=1e-5)
        _assert_served_as_saved(forecast, before["close"].iloc[-1], saved, window)

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
