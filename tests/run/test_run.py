"""`cryptotrain run` end to end on real candles: artifacts, reproducible predictions from the saved
preprocessing alone, determinism, failure isolation, and run-directory protection."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import CANDLES_DIR, job_summary, tiny_config_dict
from trainer.cli import main
from trainer.config import FeaturesConfig, load_config
from trainer.data import read_candles_file
from trainer.data.features import compute_features
from trainer.data.windows import Preprocessing
from trainer.evaluation.baselines import Har
from trainer.evaluation.results import non_finite
from trainer.files import write_json
from trainer.model.training import ModelCache
from trainer.report.console import JobProgress, summary_line
from trainer.run.jobdir import FORMAT, JobDir
from trainer.run.jobs import Job

JOB_FILES = {"model.keras", "preprocessing.json", "metrics.json", "history.csv", "config.yaml", "predictions.npz",
             "har.json", "serving.json", "manifest.json"}  # plot.png is drawn when a job is pushed (jobdir.JobDir.plot)


def _run(*args: str):
    return CliRunner().invoke(main, ["run", *args], catch_exceptions=False)


def test_every_job_writes_complete_verified_artifacts(trained_run):
    run_dir, _, output = trained_run
    for job in ("BTCUSDT_1h", "ETHUSDT_1h"):
        job_dir = run_dir / "jobs" / job
        assert {p.name for p in job_dir.iterdir()} == JOB_FILES
        assert JobDir(job_dir).verify() is not None and JobDir(job_dir).format == FORMAT
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert metrics["data"]["synthetic"] is False and metrics["data"]["source"].endswith(f"{job}.csv.gz")
        assert metrics["engine"] == {"name": "tensorflow", "jobs": 1, "precision": "float32", "device": "cpu"}
        # its training steps' time, its validation not in it, as a packed job's (tests/run/test_pack.py)
        assert 0 < metrics["train_step_seconds"] < sum(metrics["timing"]["epochs"])
        for head in ("ohlc", "bb"):
            scores = metrics["heads"][head]
            assert scores["skill"] == pytest.approx(1 - scores["model"]["mae"] / scores["persistence"]["mae"])
            assert scores["model"]["mae"] > 0 and scores["persistence"]["mae"] > 0
        assert 0 <= metrics["heads"]["ohlc"]["model"]["direction_accuracy"] <= 1
        history = pd.read_csv(job_dir / "history.csv")
        assert history["epoch"].tolist() == [1, 2] and {"loss", "val_loss"} <= set(history.columns)
        assert metrics["best_val_loss"] == pytest.approx(history["val_loss"].min())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [row["job"] for row in summary] == ["BTCUSDT_1h", "ETHUSDT_1h"]
    table = pd.read_csv(run_dir / "summary.csv", keep_default_na=False)
    assert table["job"].tolist() == ["BTCUSDT_1h", "ETHUSDT_1h"] and list(table.columns[:2]) == ["job", "epochs"]
    assert table["skill"].tolist() == pytest.approx([row["skill"] for row in summary])
    assert "None" not in table.to_numpy().tolist()[0]  # a figure a job has none of is an empty field
    assert "persistence" in output and "BTCUSDT_1h" in output


def test_every_head_is_served_as_validation_found_it_against_its_persistence_and_says_so(trained_run):
    """Each head's factor (its mix of the network and its own persistence) and its validation gain are in
    metrics.json and its preprocessing; a head served as its persistence (factor 0) scores exactly 0 against it on the
    test split, and the job's line says so."""
    run_dir, _, output = trained_run
    for job in ("BTCUSDT_1h", "ETHUSDT_1h"):
        job_dir = JobDir(run_dir / "jobs" / job)
        metrics, prep = job_dir.metrics(), job_dir.preprocessing()
        assert {h.name: h.shrink for h in prep.heads} == {name: s.shrink for name, s in metrics.heads.items()}
        repeating = metrics.summary().repeating  # factor 0, but the close's (its wicks are still the network's)
        for name, scores in metrics.heads.items():
            assert 0 <= scores.shrink <= 1 and scores.validation_gain is not None and scores.skill_unshrunk is not None
            assert (name in repeating) == (scores.shrink == 0 and name != "ohlc")
            if name in repeating:
                assert scores.skill == pytest.approx(0, abs=1e-9)
        line = next(line for line in output.splitlines() if line.startswith(f"{job}: done in "))
        assert ("no better than repeating" in line) == bool(repeating)
        assert all(name in line for name in repeating)


def test_saved_model_preprocessing_and_har_alone_reproduce_the_test_predictions(trained_run):
    run_dir, _, _ = trained_run
    job_dir = run_dir / "jobs" / "BTCUSDT_1h"
    preprocessing = json.loads((job_dir / "preprocessing.json").read_text())
    prep = Preprocessing.from_dict(preprocessing)
    har = Har.from_dict(json.loads((job_dir / "har.json").read_text()))  # the head starts at HAR: its inputs
    data = json.loads((job_dir / "metrics.json").read_text())["data"]  # which candles the job was trained on
    model = keras.models.load_model(job_dir / "model.keras")
    recorded = np.load(job_dir / "predictions.npz")
    candles = read_candles_file(CANDLES_DIR / "BTCUSDT_1h.csv.gz", "1h").loc[data["first"]:data["last"]]
    indicators = [indicator["name"] for indicator in preprocessing["indicators"]]
    base = [column for column in preprocessing["input_columns"] if column not in indicators]
    frame = compute_features(candles, FeaturesConfig(base=base, indicators=preprocessing["indicators"]))
    times = recorded["target_times"]
    for i in (0, len(times) // 2, len(times) - 1):
        history = frame[frame.index < pd.Timestamp(times[i], tz="UTC")]
        x, last = prep.make_inputs(history)
        inputs = prep.model_inputs(x, prep.forecast_inputs(har.inputs(candles.loc[:history.index[-1]])))
        outputs = model.predict(inputs, verbose=0)
        prices = prep.to_prices(outputs, last)
        for head in preprocessing["heads"]:
            np.testing.assert_allclose(prices[head["name"]][0], recorded[head["name"]][i], rtol=1e-4)


def test_same_config_and_data_give_the_same_metrics(trained_run, tmp_path):
    """Also in one process, one run after another (a notebook's cells): the second builds no model of its own, it
    takes the first's, traced, back to its initial weights."""
    run_dir, config_path, _ = trained_run
    again = ("--config", str(config_path), "--set", f"output_dir={tmp_path / 'again'}")
    result = _run(*again, "--only", "BTCUSDT_1h")
    assert result.exit_code == 0, result.output
    builds = ModelCache.of_process().builds
    result = _run(*again, "--only", "ETHUSDT_1h")
    assert result.exit_code == 0, result.output
    assert ModelCache.of_process().builds == builds
    for job in ("BTCUSDT_1h", "ETHUSDT_1h"):
        first = json.loads((run_dir / "jobs" / job / "metrics.json").read_text())
        second = json.loads((tmp_path / "again" / "jobs" / job / "metrics.json").read_text())
        assert first["heads"] == second["heads"] and first["best_val_loss"] == second["best_val_loss"]


def test_rerun_of_a_finished_run_skips_every_job(trained_run, tmp_path):
    run_dir, config_path, _ = trained_run.copy(tmp_path)
    # Each done job keeps the checkpoint of its last epoch (to go on from with more epochs), nothing more.
    assert {p.name for p in (run_dir / ".backup" / "BTCUSDT_1h").glob("checkpoint*")} == {
        "checkpoint.npz", "checkpoint.previous.npz"}
    before = {p: p.stat().st_mtime_ns for p in (run_dir / "jobs").rglob("*")}
    dead_pid = 2**22 + 1  # above Linux's largest pid: no such process
    left_by_a_kill = run_dir / f"tmp{dead_pid}-summary.json"  # an atomic write cut short
    left_by_a_kill.write_text("{")
    result = _run("--config", str(config_path))
    assert result.exit_code == 0, result.output
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "jobs").rglob("*")} == before
    assert not left_by_a_kill.exists()


def test_a_job_directory_made_by_another_config_is_trained_again(trained_run, tmp_path):
    run_dir, _, _ = trained_run
    config = tmp_path / "other.yaml"
    data = tiny_config_dict(tmp_path)
    data["train"]["epochs"] = 1
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "run" / "jobs").mkdir(parents=True)
    shutil.copytree(run_dir / "jobs" / "BTCUSDT_1h", tmp_path / "run" / "jobs" / "BTCUSDT_1h")  # verifies, 2 epochs
    result = _run("--config", str(config), "--only", "BTC*")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "jobs" / "BTCUSDT_1h" / "metrics.json").read_text())
    assert metrics["epochs_run"] == 1 and metrics["fingerprint"] == load_config(config).fingerprint()


def test_a_run_recorded_by_an_earlier_version_resumes_with_the_options_added_since_at_their_defaults(
        trained_run, tmp_path):
    """Its ledger's config lacks an option this version added (train.steps_per_execution, say) and its fingerprint was
    computed without it: the same command takes the run over, trains nothing again, and never asks for --new-run."""
    run_dir, config_path, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config_path.read_text()), "output_dir": str(copy)}))
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        recorded = json.loads(db.execute("SELECT config_json FROM run").fetchone()[0])
        del recorded["train"]["steps_per_execution"]
        db.execute("UPDATE run SET fingerprint = 'computed-by-an-earlier-version', config_json = ?",
                   (json.dumps(recorded),))
    before = {p: p.stat().st_mtime_ns for p in (copy / "jobs").rglob("*")}
    result = _run("--config", str(config))
    assert result.exit_code == 0, result.output
    assert "--new-run" not in result.output
    assert {p: p.stat().st_mtime_ns for p in (copy / "jobs").rglob("*")} == before  # nothing trained again


def test_changed_config_is_refused_naming_the_keys_then_new_run_starts_over(trained_run, tmp_path):
    run_dir, config_path, _ = trained_run.copy(tmp_path)
    result = CliRunner().invoke(main, ["run", "--config", str(config_path), "--set", "window.lookback=12",
                                       "--only", "BTC*"])
    assert result.exit_code == 2
    assert "window.lookback 16 -> 12" in result.output and "--new-run" in result.output
    result = _run("--config", str(config_path), "--set", "window.lookback=12", "--only", "BTC*", "--new-run")
    assert result.exit_code == 0, result.output
    moved = [p for p in run_dir.parent.iterdir() if p.name.startswith("run-")]
    assert len(moved) == 1 and (moved[0] / "jobs" / "ETHUSDT_1h" / "manifest.json").exists()  # kept, not lost
    config = yaml.safe_load((run_dir / "jobs" / "BTCUSDT_1h" / "config.yaml").read_text())
    assert config["window"]["lookback"] == 12


@pytest.mark.train
def test_a_failing_job_is_recorded_and_the_others_go_on(tiny_config, tmp_path):
    config = tiny_config()
    result = _run("--config", str(config), "--set", "data.symbols=[BTCUSDT, NOSUCHUSDT]", "--retries", "0")
    assert result.exit_code == 1
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        rows = dict(db.execute("SELECT name, status FROM jobs"))
        error = db.execute("SELECT error FROM jobs WHERE name = 'NOSUCHUSDT_1h'").fetchone()[0]
    assert rows == {"BTCUSDT_1h": "done", "NOSUCHUSDT_1h": "failed"}
    assert "NOSUCHUSDT_1h.csv.gz" in error
    status = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert status.exit_code == 0 and "failed" in status.output and "NOSUCHUSDT_1h" in status.output


def test_status_answers_without_loading_tensorflow(trained_run):
    run_dir = trained_run[0]
    script = ("import sys; from trainer.cli import main; main(['status', sys.argv[1]], standalone_mode=False); "
              "print('tensorflow loaded' if 'tensorflow' in sys.modules else 'tensorflow not loaded')")
    result = subprocess.run([sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "BTCUSDT_1h" in result.stdout and "done" in result.stdout
    assert result.stdout.strip().endswith("tensorflow not loaded")


def test_a_command_on_tensorflow_imports_no_jax_though_it_is_installed(trained_run):
    """TensorFlow imports JAX where it is installed, for its TFLite converter: 1-2 s of CPU in every process that
    trains on TensorFlow (run.engine.jax_unimported). A command on TensorFlow (`predict`, its model loaded and run)
    leaves JAX out, and JAX imports as ever afterwards."""
    pytest.importorskip("jax")
    script = ("import sys; from trainer.cli import main; "
              "main(['predict', '--model', sys.argv[1], '--json'], standalone_mode=False); "
              "print('tensorflow' in sys.modules, 'jax' in sys.modules); import jax; print(jax.numpy.ones(2).sum())")
    result = subprocess.run([sys.executable, "-c", script, str(trained_run[0] / "jobs" / "BTCUSDT_1h")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"forecast"' in result.stdout and result.stdout.endswith("True False\n2.0\n"), result.stdout[-500:]


def test_status_filters_like_run_and_keeps_each_job_on_one_line(tmp_path):
    from trainer.run.ledger import Ledger

    ledger = Ledger(tmp_path / "run")
    ledger.add_jobs(["BTCUSDT_15m", "BTCUSDT_1h", "ETHUSDT_1h"])
    assert ledger.claim(retries=0) == "BTCUSDT_15m"
    error = "ValueError: " + "a long reason " * 20 + "\n  and a second line\n  and a third"
    ledger.mark_failed("BTCUSDT_15m", error, 1.0)
    status = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert status.exit_code == 0, status.output
    lines = status.output.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert len([line for line in lines if "BTCUSDT_15m" in line]) == 1 and "and a second line" not in status.output
    assert lines[-1] == "2 pending, 0 running, 0 done, 1 failed"

    narrowed = CliRunner().invoke(main, ["status", str(tmp_path / "run"), "--only", "btc*", "--timeframes", "1h"])
    assert [line.split()[0] for line in narrowed.output.splitlines() if "USDT" in line] == ["BTCUSDT_1h"]
    whole = CliRunner().invoke(main, ["status", str(tmp_path / "run"), "--json", "--only", "BTCUSDT_15m"])
    assert [job["error"] for job in json.loads(whole.output)] == [error]
    nothing = CliRunner().invoke(main, ["status", str(tmp_path / "run"), "--only", "DOGE*"])
    assert nothing.exit_code == 2 and "no job matches DOGE*" in nothing.output


def test_status_shows_the_jobs_runs_selected_and_counts_the_others_apart(tmp_path):
    """After `run --only BTCUSDT --timeframes 1h` on a 40-job family, status is about that job; the other 39
    are neither pending nor hidden: counted and named apart, listed with --all, in --json with selected_at null."""
    from trainer.run.ledger import Ledger

    ledger = Ledger(tmp_path / "run")
    names = [f"{s}USDT_{t}" for s in ("BTC", "ETH", "SOL") for t in ("15m", "1h")]
    ledger.add_jobs(names, selected=["BTCUSDT_1h"])
    status = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert status.exit_code == 0, status.output
    lines = status.output.splitlines()
    assert [line.split()[0] for line in lines if line.split() and line.split()[0] in names] == ["BTCUSDT_1h"]
    assert lines[-2:] == ["1 pending, 0 running, 0 done, 0 failed; 5 never selected",
                          "never selected: BTCUSDT_15m, ETHUSDT_15m, ETHUSDT_1h, ... (--all lists them)"]
    listed = CliRunner().invoke(main, ["status", str(tmp_path / "run"), "--all"]).output
    assert sum("not selected" in line for line in listed.splitlines()) == 5
    as_json = json.loads(CliRunner().invoke(main, ["status", str(tmp_path / "run"), "--json"]).output)
    assert [job["name"] for job in as_json if job["selected_at"] is not None] == ["BTCUSDT_1h"]


def test_a_job_retried_after_a_failure_counts_once_in_the_jobs_progress():
    progress = JobProgress()
    job = Job("NOSUCHUSDT", "1h")
    with progress.running(total=2, done=0):
        for _ in range(2):  # fails, then fails again on its retry
            progress.start_job(job)
            progress.finish_job(job, "failed")
    jobs_bar = next(task for task in progress.progress.tasks if task.id == progress.jobs_task)
    assert (jobs_bar.completed, jobs_bar.total) == (1, 2)


def test_not_on_a_terminal_a_run_prints_plain_lines_per_epoch_with_v_and_per_job(trained_run):
    _, _, output = trained_run
    lines = [line for line in output.splitlines() if line.startswith(("BTCUSDT_1h:", "ETHUSDT_1h:"))]
    assert [re.sub(r"  loss .*", "", line) for line in lines if ": epoch " in line] == [
        "BTCUSDT_1h: epoch 1/2", "BTCUSDT_1h: epoch 2/2", "ETHUSDT_1h: epoch 1/2", "ETHUSDT_1h: epoch 2/2"]
    done = [line for line in lines if ": done in " in line]
    assert len(done) == 2 and all("persistence" in line for line in done)  # one line each, however long
    assert "━" not in output  # no progress bars in a log


NATIVE_WRITER = """
import os, sys
from rich.console import Console
from trainer.report import console as reporting
reporting.console = Console(stderr=True, force_terminal=True, width=120)
with reporting.JobProgress().running(total=1, done=0):
    os.write(2, b"native line, as TensorFlow's C++ log writes it\\n")
    print("python line", file=sys.stderr)
os.write(2, b"native line after the display\\n")
"""


def test_what_native_code_writes_to_stderr_during_the_live_display_is_shown_as_a_line_of_its_own():
    """TensorFlow's C++ logging writes straight to file descriptor 2; under the live bars it would tear them.
    It goes through the console instead (dimmed, its own line), and fd 2 is given back afterwards."""
    result = subprocess.run([sys.executable, "-c", NATIVE_WRITER], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "\x1b[2mnative line, as TensorFlow's C++ log writes it\x1b[0m" in result.stderr
    assert "python line" in result.stderr
    assert result.stderr.endswith("native line after the display\n")


ONEDNN_RUN = """
import sys
from trainer.model import device
from trainer.cli import main
if sys.argv[1] == "unspent":
    device._spend_onednn_notice = lambda: None
main(["run", "--config", sys.argv[2], "--only", "BTCUSDT_1h", "--set", "train.epochs=1"])
"""


@pytest.mark.train
def test_tensorflows_onednn_notice_at_the_first_train_step_never_reaches_the_terminal(tiny_config, tmp_path):
    """With oneDNN on (the default on CPUs with AVX-512 VNNI), a CPU without AVX-512 gets "oneDNN supports DT_INT32
    only on platforms with AVX-512" from TensorFlow's C++ log at the first train step, at ERROR level."""
    notice = "oneDNN supports DT_INT32 only on platforms with AVX-512"
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}

    def run(variant: str) -> str:
        config = tiny_config(output_dir=str(tmp_path / variant))  # each trains its job
        result = subprocess.run([sys.executable, "-c", ONEDNN_RUN, variant, str(config)], capture_output=True,
                                text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stderr

    if notice not in run("unspent"):
        pytest.skip("this CPU and TensorFlow never log the notice")
    assert notice not in run("as shipped")


def test_a_job_without_skill_is_summarised_without_one():
    # persistence was exact on the test split (MAE 0): there is no skill to give
    summary = job_summary(epochs=2, head="ohlc.close", test_mae=0.5, persistence_mae=0.0, skill=None)
    assert summary_line(summary) == "done in 2 epochs, test MAE (ohlc.close) 0.5 vs persistence 0: skill -"


@pytest.mark.parametrize("skill, said", [(-0.0123, "skill -0.012 (WORSE than persistence: repeating the last close "
                                                  "forecasts better)"),
                                         (0.0456, "skill +0.046 (better than persistence)"),
                                         (0.00004, "skill +4.0e-05 (better than persistence)"),
                                         (-0.0003, "skill -3.0e-04 (WORSE than persistence: repeating the last "
                                                   "close forecasts better)")])
def test_a_jobs_line_says_plainly_whether_it_beats_persistence(skill, said):
    summary = job_summary(epochs=2, head="ohlc.close", test_mae=0.5, persistence_mae=0.6, skill=skill)
    assert summary_line(summary).endswith(said)
    assert summary_line(summary.model_copy(update={"skill": 0.0, "shrink": 0.0})).endswith(
        "skill +0.000 (no better than persistence); validation found no deviation from no change worth keeping")


@pytest.mark.train
def test_non_finite_loss_fails_the_job_with_a_clear_error(tiny_config, tmp_path):
    config = tiny_config()
    result = _run("--config", str(config), "--only", "BTC*", "--retries", "0", "--set", "train.learning_rate=1e30")
    assert result.exit_code == 1
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        status, error = db.execute("SELECT status, error FROM jobs WHERE name = 'BTCUSDT_1h'").fetchone()
    assert status == "failed" and re.search(r"^local:\S+BTCUSDT_1h.csv.gz: loss became (nan|inf|-inf) in epoch 1; "
                                            "try a lower train.learning_rate or train.clipvalue$", error), error


@pytest.mark.train
@pytest.mark.parametrize("row, columns, value", [
    (-40, ["open", "high", "low", "close"], 1e150),  # a band far below zero, then infinite test metrics
    (-300, ["high"], 1e300),  # a training window: the loss diverges in the first epoch
])
def test_absurd_candles_never_count_as_done_and_every_json_file_is_strict(tiny_config, tmp_path, recwarn, row,
                                                                          columns, value):
    """One absurd candle: the job fails with one line naming the file and the candle (not the learning rate),
    without numpy's overflow warnings first; nothing is recorded as done, and no file holds a bare NaN/Infinity
    token."""
    table = pd.read_csv(CANDLES_DIR / "BTCUSDT_1h.csv.gz")
    table.loc[len(table) + row, columns] = value
    when = pd.Timestamp(table.loc[len(table) + row, "timestamp"])
    data_dir = tmp_path / "absurd"
    data_dir.mkdir()
    table.to_csv(data_dir / "BTCUSDT_1h.csv", index=False)
    config = tiny_config(data={"source": "local", "symbols": ["BTCUSDT"], "timeframes": ["1h"], "max_rows": 600,
                               "local": {"path": str(data_dir), "pattern": "{symbol}_{timeframe}.csv"}})
    result = _run("--config", str(config), "--retries", "0")
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("BTCUSDT_1h failed: ")]
    assert line.startswith(f"BTCUSDT_1h failed: local:{data_dir / 'BTCUSDT_1h.csv'}: "), line  # the file
    jump = rf"the candles are implausible: ({'|'.join(columns)}) goes from [0-9.e+]+ to {re.escape(f'{value:.6g}')}"
    assert re.search(rf"{jump} at {when:%Y-%m-%d %H:%M} UTC", line), line  # the candle, the column, the jump
    assert "learning_rate" not in line
    assert [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)] == []
    run_dir = tmp_path / "run"
    assert not (run_dir / "jobs" / "BTCUSDT_1h").exists()
    bare = []
    for path in run_dir.rglob("*.json"):
        json.loads(path.read_text(), parse_constant=bare.append)
    assert bare == []


def test_a_non_finite_number_is_found_by_its_key_path_and_never_written_as_json(tmp_path):
    metrics = {"heads": {"ohlc": {"model": {"mae": 1.0, "rmse": float("inf")}}}, "skill_by_step": [0.1, float("nan")]}
    assert non_finite(metrics) == ("heads.ohlc.model.rmse", float("inf"))
    assert non_finite({"skill_by_step": [0.1, None, 0.2]}) is None
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json(tmp_path / "metrics.json", metrics)


@pytest.mark.train
def test_a_failed_job_is_retried_once_its_candles_are_fixed_or_when_asked(tiny_config, tmp_path):
    data_dir = tmp_path / "candles"
    data_dir.mkdir()
    shutil.copy(CANDLES_DIR / "BTCUSDT_1h.csv.gz", data_dir)
    config = tiny_config(data={"source": "local", "local": {"path": str(data_dir)}, "symbols": ["BTCUSDT", "ETHUSDT"],
                               "timeframes": ["1h"], "max_rows": 600})

    def statuses():
        with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
            return dict(db.execute("SELECT name, status || ':' || attempts FROM jobs"))

    first = _run("--config", str(config), "--retries", "0")
    assert first.exit_code == 1 and statuses() == {"BTCUSDT_1h": "done:1", "ETHUSDT_1h": "failed:1"}
    assert "Failed jobs whose candles you fix are retried when you run the same command again; to retry the " \
           "others as they are, add --retry-failed (or --retries 1)" in " ".join(first.output.split())
    again = _run("--config", str(config), "--retries", "0")  # nothing changed: its retries are used up
    assert again.exit_code == 1 and statuses()["ETHUSDT_1h"] == "failed:1"

    asked = _run("--config", str(config), "--retries", "0", "--retry-failed")
    assert asked.exit_code == 1 and statuses()["ETHUSDT_1h"] == "failed:1"  # tried again, failed again

    shutil.copy(CANDLES_DIR / "ETHUSDT_1h.csv.gz", data_dir)  # the user fixes the input
    fixed = _run("--config", str(config), "--retries", "0")
    assert fixed.exit_code == 0, fixed.output
    assert statuses() == {"BTCUSDT_1h": "done:1", "ETHUSDT_1h": "done:1"}


@pytest.fixture
def small_disk(tmp_path):
    """A real 200 KB file system (tmpfs), enlarged later with grow(); skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        yield disk, lambda: subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.train
def test_a_full_disk_stops_the_run_with_one_line_and_loses_nothing(tiny_config, small_disk):
    disk, grow = small_disk
    config = tiny_config(output_dir=str(disk / "run"))
    full = _run("--config", str(config))
    assert full.exit_code == 1
    assert "BTCUSDT_1h: stopped: no space left on the device" in full.output and "Traceback" not in full.output
    with sqlite3.connect(disk / "run" / "ledger.sqlite") as db:  # not failed: released, or reclaimed next time
        statuses = dict(db.execute("SELECT name, status FROM jobs"))
    assert statuses["BTCUSDT_1h"] in ("pending", "running") and statuses["ETHUSDT_1h"] == "pending"

    grow()
    again = _run("--config", str(config))
    assert again.exit_code == 0, again.output
    assert {p.name for p in (disk / "run" / "jobs").iterdir()} == {"BTCUSDT_1h", "ETHUSDT_1h"}


def test_an_output_dir_that_is_a_file_is_one_line_of_bad_input(tiny_config, tmp_path):
    (tmp_path / "taken").write_text("not a directory")
    result = CliRunner().invoke(main, ["run", "--config", str(tiny_config(output_dir=str(tmp_path / "taken")))])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'taken'}: cannot be the run directory (File exists); set " \
        "output_dir to a directory you can write"


@pytest.fixture
def another_users_run_dir(tmp_path):
    """(config, run directory, a context to run in): a run directory of another user, which this one may read but
    not write. As root (who may write anywhere) the command runs under the uid of nobody meanwhile."""
    shared = Path(tempfile.mkdtemp(prefix="cryptotrain-shared-"))  # under /tmp: any user may look inside
    shared.chmod(0o755)
    run_dir = shared / "run"
    run_dir.mkdir()
    config = shared / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(tmp_path, output_dir=str(run_dir))))
    config.chmod(0o644)
    try:
        yield config, run_dir, lambda: _as_another_user(run_dir)
    finally:
        shutil.rmtree(shared)


@contextlib.contextmanager
def _as_another_user(run_dir: Path):
    """This process as a user who may read `run_dir` but not write it: as root (who may write anywhere) under the
    uid of nobody meanwhile; else with every directory in it made read-only meanwhile."""
    if os.geteuid() == 0:
        os.seteuid(65534)  # nobody
        try:
            yield
        finally:
            os.seteuid(0)
        return
    directories = [run_dir, *(path for path in run_dir.rglob("*") if path.is_dir())]
    for directory in directories:
        directory.chmod(0o555)
    try:
        yield
    finally:
        for directory in directories:
            directory.chmod(0o755)


@pytest.fixture
def read_only_run_dir(tmp_path):
    """An existing run directory on a read-only mount; skipped where mounting is not allowed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _mounted_read_only(run_dir)
    try:
        yield run_dir
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], check=False)


def test_a_run_directory_this_user_cannot_write_is_one_line_of_bad_input(another_users_run_dir):
    config, run_dir, as_another_user = another_users_run_dir
    with as_another_user():
        result = CliRunner().invoke(main, ["run", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {run_dir}: cannot be the run directory (Permission denied); set " \
        "output_dir to a directory you can write"
    assert list(run_dir.iterdir()) == []


def test_a_run_directory_on_a_read_only_disk_is_one_line_of_bad_input(tiny_config, read_only_run_dir):
    result = CliRunner().invoke(main, ["run", "--config", str(tiny_config(output_dir=str(read_only_run_dir)))])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {read_only_run_dir}: cannot be the run directory (Read-only file " \
        "system); set output_dir to a directory you can write"


@pytest.fixture(params=["another user's", "on a read-only disk"])
def unwritable_run(request, trained_run, tmp_path_factory):
    """(a copy of trained_run this user can read but not write, its config, a context to read it in, why a
    write fails)."""
    if request.param == "on a read-only disk":
        shared = tmp_path_factory.mktemp("read-only")
        run_dir = _mounted_read_only(shutil.copytree(trained_run[0], shared / "run"))
        reading, reason = contextlib.nullcontext, "Read-only file system"
    else:
        shared = Path(tempfile.mkdtemp(prefix="cryptotrain-shared-"))  # under /tmp: any user may look inside
        run_dir = shutil.copytree(trained_run[0], shared / "run")
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        reading, reason = functools.partial(_as_another_user, run_dir), "Permission denied"
    (shared / "out").mkdir()
    (shared / "out").chmod(0o777)  # where the report goes
    config = shared / "tiny.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(trained_run[1].read_text()), "output_dir": str(run_dir)}))
    config.chmod(0o644)
    try:
        yield run_dir, config, reading, reason
    finally:
        if request.param == "on a read-only disk":
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
        shutil.rmtree(shared)


def _mounted_read_only(run_dir: Path) -> Path:
    """`run_dir`, bind-mounted read-only on itself (umount -l it after); skipped where mounting is not allowed."""
    mounted = subprocess.run(["mount", "--bind", str(run_dir), str(run_dir)], capture_output=True).returncode == 0
    if not mounted or subprocess.run(["mount", "-o", "remount,bind,ro", str(run_dir)], capture_output=True).returncode:
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
        pytest.skip("needs a read-only bind mount (root)")
    return run_dir


def test_a_run_directory_this_user_cannot_write_is_read_by_status_report_and_predict(trained_run, unwritable_run,
                                                                                      monkeypatch):
    """A colleague's run, or one on a read-only mount: status, report (to a file elsewhere) and predict read it
    as it is, and say what they say of the run it is a copy of; report into it, and run, which would change it,
    are refused in one line."""
    run_dir, config, reading, reason = unwritable_run
    monkeypatch.setenv("CRYPTOTRAIN_CACHE", str(run_dir.parent / "out" / "cache"))  # this user's own
    elsewhere = run_dir.parent / "out" / "report.html"
    # The candles the forecast starts from are this user's own file (the bundled ones sit in the checkout, which
    # in a private temp directory, CI's clone, another user cannot read).
    candles = Path(shutil.copy(CANDLES_DIR / "BTCUSDT_1h.csv.gz", run_dir.parent / "out"))
    candles.chmod(0o644)

    def predicting(run: Path) -> list[str]:
        return ["predict", "--model", str(run / "jobs" / "BTCUSDT_1h"), "--data", str(candles), "--json"]

    # What each command says of the run it is a copy of, first: this process then has the package's own files
    # (modules, the report's CSS and JS) as an installed cryptotrain gives them to every user.
    original = {command: CliRunner().invoke(main, args, catch_exceptions=False) for command, args in {
        "status": ["status", "--json", str(trained_run[0])],
        "report": ["report", str(trained_run[0]), "-o", str(run_dir.parent / "original.html")],
        "predict": predicting(trained_run[0])}.items()}
    with reading():
        status = CliRunner().invoke(main, ["status", "--json", str(run_dir)])
        report = CliRunner().invoke(main, ["report", str(run_dir), "-o", str(elsewhere)])
        report_inside = CliRunner().invoke(main, ["report", str(run_dir)])
        predict = CliRunner().invoke(main, predicting(run_dir))
        run = CliRunner().invoke(main, ["run", "--config", str(config)])

    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout) == json.loads(original["status"].stdout)
    assert report.exit_code == 0 and report.output.strip() == str(elsewhere), report.output
    assert "BTCUSDT_1h" in elsewhere.read_text()
    assert report_inside.exit_code == 2 and report_inside.output.strip().startswith(
        f"error: {run_dir / 'report.html'}: cannot write the report ("), report_inside.output
    assert predict.exit_code == 0, predict.output
    assert json.loads(predict.stdout)["forecast"] == json.loads(original["predict"].stdout)["forecast"]
    assert run.exit_code == 2
    assert run.output.strip() == f"error: {run_dir}: cannot be the run directory ({reason}); set output_dir to a " \
        "directory you can write"


@pytest.mark.train
def test_more_epochs_on_an_existing_run_extend_its_jobs_and_fewer_retrain_them(tiny_config, tmp_path):
    """train.epochs and early-stopping patience are a run's training budget, not its identity: changing them
    never needs --new-run. A job the new budget would train longer goes on from its last epoch; one it would
    have stopped sooner is trained again; one it trains the same is kept as it is."""
    config = str(tiny_config())
    job_dir = tmp_path / "run" / "jobs" / "BTCUSDT_1h"
    assert _run("--config", config, "--only", "BTC*").exit_code == 0  # 2 epochs, patience 20

    longer = _run("--config", config, "--only", "BTC*", "--set", "train.epochs=3")
    assert longer.exit_code == 0, longer.output
    assert "BTCUSDT_1h: train.epochs 2 -> 3: training goes on after epoch 2" in longer.output
    assert "BTCUSDT_1h: resuming at epoch 3 of 3 (epochs 1-2 were saved)" in longer.output
    history = pd.read_csv(job_dir / "history.csv")
    assert history["epoch"].tolist() == [1, 2, 3] and np.isfinite(history["val_loss"]).all()
    assert yaml.safe_load((job_dir / "config.yaml").read_text())["train"]["epochs"] == 3
    extended = (job_dir / "manifest.json").read_bytes()

    same = _run("--config", config, "--only", "BTC*", "--set", "train.epochs=3", "--set",
                "train.early_stopping.patience=10")  # three epochs leave patience 10 (or 20) untouched
    assert same.exit_code == 0 and "trained again" not in same.output and "goes on" not in same.output
    assert (job_dir / "manifest.json").read_bytes() == extended

    shorter = _run("--config", config, "--only", "BTC*", "--set", "train.epochs=1")
    assert shorter.exit_code == 0, shorter.output
    assert ("BTCUSDT_1h: train.epochs 3 -> 1: trained again from scratch (would have stopped at epoch 1 of its 3)"
            in shorter.output)
    assert pd.read_csv(job_dir / "history.csv")["epoch"].tolist() == [1]
    other = CliRunner().invoke(main, ["run", "--config", config, "--set", "train.batch_size=8"])
    assert other.exit_code == 2 and "train.batch_size 64 -> 8" in other.output  # what a job computes: refused


@pytest.mark.train
def test_collinear_features_are_reported_once_a_run_not_once_a_job(tiny_config, caplog):
    """V7 keeps volatility beside bb_width_pct (they carry the same information): the run says so once."""
    bands = [{"name": name, "window": 20, "std": 2.0} for name in ("bb_upper", "bb_lower", "bb_width_pct")]
    features = {"base": ["open", "high", "low", "close"], "indicators": [*bands, {"name": "volatility", "window": 20}]}
    result = _run("--config", str(tiny_config(features=features)), "--set", "train.epochs=1")
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "are collinear" in r.getMessage()]
    assert len(said) == 1 and "bb_width_pct" in said[0] and "volatility" in said[0], said
