"""`cryptotrain run --pack K`: a run's jobs trained K at a time in one compiled step on Keras's JAX backend, as a user
runs it, in processes of their own (a process's Keras backend is chosen once; this suite's is TensorFlow). Packed
training itself (each job exactly as alone) is tested in tests/jax/test_packed.py."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, cli_without, tiny_config_dict
from tests.forkserver import KILL_POINTS
from tests.hub_server import serve_hub
from tests.model.test_tensorboard import epoch_values
from tests.publish.test_predict import predict_cli
from tests.test_jax import compilation_cache
from trainer.files import pid_alive

JOBS = ["BTCUSDT_1h", "ETHUSDT_1h", "SOLUSDT_1h"]
TOKEN = "hf_PackedRunTestToken0123456789abcdef"
EPOCHS = 4


def _config(tmp_path, **train):
    raw = tiny_config_dict(tmp_path)
    raw["data"] |= {"symbols": ["BTCUSDT", "ETHUSDT", "SOLUSDT"], "max_rows": 1500}  # epochs to be killed in
    raw["train"] |= {"epochs": EPOCHS, "batch_size": 16, **train}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _checkpointed_epoch(backup) -> int:
    try:
        with np.load(backup / "checkpoint.npz") as saved:
            return int(saved["epoch"])
    except (OSError, ValueError, KeyError):
        return 0


def test_pack_auto_fills_half_an_accelerators_memory_with_jobs_by_their_estimated_size():
    pytest.importorskip("jax")
    from trainer.config import load_config
    from trainer.run.packing import MAX_PACK, job_bytes, jobs_that_fit

    cfg = load_config("v7")
    per_job = job_bytes(cfg.network, cfg.train, rows=10_000)
    windows = 10_000 * cfg.network.lookback * len(cfg.network.columns) * 4
    assert windows < per_job < 2 * windows  # the job's windows on the device, most of it
    assert job_bytes(cfg.network, cfg.train, rows=20_000) > per_job
    h100 = 80 * 2**30
    assert jobs_that_fit(40, per_job, h100) == 40  # a family on one H100
    assert jobs_that_fit(400, per_job, h100) == MAX_PACK
    assert jobs_that_fit(40, per_job, 2**30) == 2**29 // per_job < 40  # a small device: what half of it holds
    assert jobs_that_fit(40, per_job, per_job) == 1  # never none


@pytest.mark.processes
def test_pack_without_jax_is_refused_in_one_line_before_any_work(tmp_path):
    config = _config(tmp_path)
    result = subprocess.run([*cli_without("jax"), "run", "--config", str(config), "--pack", "2"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --pack 2 (train.pack) trains on Keras's JAX backend, and JAX is not installed: pip install "
        "'cryptotrain[jax]' (JAX with CUDA for NVIDIA GPUs: pip install 'jax[cuda12]')"]
    assert not (tmp_path / "run").exists()


@pytest.mark.train
@pytest.mark.processes
def test_a_pack_killed_mid_run_resumes_each_job_after_its_own_epoch_and_ends_as_ordinary_job_directories(
        tmp_path, monkeypatch):
    """kill -9 while a pack of two of three jobs trains, on a machine without TensorFlow (hidden from the process);
    the same command, twice at once on the run directory: the two processes share the jobs (each packs what it
    claims), each interrupted job resumes after its own last checkpointed epoch, each job is done once; each ends as
    a job directory that this process's TensorFlow Keras loads without custom objects, `predict` (TensorFlow)
    forecasts from, and that forecasts the same after a round trip through a (local) Hugging Face Hub."""
    pytest.importorskip("jax")
    config = _config(tmp_path)
    command = [*cli_without("tensorflow"), "run", "--config", str(config), "--pack", "2", "-v", "--tensorboard"]
    env = {**os.environ, **compilation_cache(tmp_path / "xla")}  # the second process finds what the first compiled
    backups = tmp_path / "run" / ".backup"
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
    try:
        deadline = time.monotonic() + 400
        while sorted(_checkpointed_epoch(backups / job) for job in JOBS)[-2] < 1:  # the pack's two: an epoch each
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-3000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        output, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert "packed training on cpu: 2 jobs at a time (--pack 2)" in output, output[-3000:]
    kept = {job: epoch for job in JOBS if (epoch := _checkpointed_epoch(backups / job))}
    assert len(kept) == 2 and all(epoch < EPOCHS for epoch in kept.values()), kept

    # XLA's cache is written by one process at a time: the second its own
    caches = [env, {**env, **compilation_cache(tmp_path / "xla-second")}]
    both = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=environment) for environment in caches]
    outputs = ["".join(process.communicate(timeout=600)) for process in both]
    assert [process.returncode for process in both] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert all(re.search(r"^\w+_1h: done in", output, re.MULTILINE) for output in outputs), outputs  # both trained
    assert not any("Traceback" in output for output in outputs), outputs
    for job, epoch in kept.items():  # in whichever process resumed it, once
        assert sum(f"{job}: resuming at epoch {epoch + 1} of {EPOCHS}" in output for output in outputs) == 1, outputs
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        assert dict(db.execute("SELECT name, status FROM jobs")) == dict.fromkeys(JOBS, "done")
        attempts = [*db.execute("SELECT job, outcome FROM attempts")]
    for job in JOBS:  # the killed attempt is recorded lost, never failed; done once
        outcomes = [outcome for name, outcome in attempts if name == job]
        assert outcomes.count("done") == 1 and "failed" not in outcomes, attempts

    import keras  # this process's: TensorFlow's

    for job in JOBS:
        directory = tmp_path / "run" / "jobs" / job
        history = pd.read_csv(directory / "history.csv")["epoch"].tolist()
        assert history == list(range(1, len(history) + 1)) and len(history) >= kept.get(job, 0) + 1, (job, history)
        metrics = json.loads((directory / "metrics.json").read_text())
        assert metrics["epochs_run"] == len(history) and np.isfinite(metrics["best_val_loss"])
        assert metrics["engine"]["name"] == "jax" and metrics["engine"]["jobs"] in (1, 2)  # a pack of the job's own
        # its (pack's) training steps' time, its validation not in it, as a job's alone (tests/run/test_run.py)
        assert 0 < metrics["train_step_seconds"] < sum(metrics["timing"]["epochs"])
        # --tensorboard without TensorFlow: each epoch's losses, as Keras's callback writes them, in whichever
        # process trained it (the killed one's event file too; an epoch it ended but had not logged may lack)
        logs, losses = tmp_path / "run" / "tensorboard" / job, pd.read_csv(directory / "history.csv")
        for split, column in (("train", "loss"), ("validation", "val_loss")):
            logged = epoch_values(logs / split, "epoch_loss")
            assert set(range(kept.get(job, 0), len(history))) <= logged.keys(), (job, split, logged)
            np.testing.assert_allclose([logged[step] for step in sorted(logged)],
                                       losses[column].iloc[sorted(logged)], rtol=1e-6)
        model = keras.saving.load_model(directory / "model.keras")  # safe mode, no custom objects
        assert sorted(model.output_names) == ["bb", "ohlc"]
        assert model.optimizer.iterations.numpy() > 0  # its own optimizer's state, as a job trained alone saves it
        outputs = model.predict(np.zeros((2, *model.input.shape[1:]), "float32"), verbose=0)
        assert all(np.isfinite(values).all() for values in outputs.values())
    served = json.loads(predict_cli("--model", str(tmp_path / "run" / "jobs" / JOBS[0]), "--json"))  # TensorFlow's
    assert len(served["forecast"]) == 3 and all(np.isfinite(step[key]) for step in served["forecast"]
                                                 for key in ("expected_high", "expected_low", "close_80_high"))

    from trainer.publish.hub import push_run
    from trainer.publish.predict import predict_job
    from trainer.run.rundir import RunDir

    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache"):
        with RunDir.open(tmp_path / "run", config_required=True) as opened:
            push_run(opened, repo_id="tester/packed", private=True, overwrite_cards=False, only=())
        remote = predict_job("hf://tester/packed/BTCUSDT/1h", symbol=None, timeframe=None, data_path=None,
                             config_path=None)
    assert remote.as_dict()["forecast"] == served["forecast"]


def _descendants(pid: int) -> set[int]:
    """The processes under `pid` (its children, theirs, ...), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.train
@pytest.mark.processes
def test_a_packed_run_killed_while_the_host_evaluates_a_pack_resumes_each_job_once_and_leaves_no_worker(tmp_path):
    """kill -9 once a pack of two has trained and its jobs' evaluations are on the host's two workers (its last
    epoch's checkpoints not yet written): no worker outlives the run (its caller, reading its output, is not kept
    waiting); the same command resumes the pack's jobs from their last checkpointed epoch, and every job is done
    once."""
    pytest.importorskip("jax")
    epochs = 2
    config = _config(tmp_path, epochs=epochs)
    marker, backups = tmp_path / "paused", tmp_path / "run" / ".backup"
    env = {**os.environ, "KERAS_BACKEND": "jax", **compilation_cache(tmp_path / "xla")}
    command = ["run", "--config", str(config), "--pack", "2", "--host-workers", "2"]
    victim = subprocess.Popen([sys.executable, str(KILL_POINTS), "pack-end", str(marker), str(tmp_path / "epochs"),
                               *command], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 400
        while not marker.exists():
            assert victim.poll() is None and time.monotonic() < deadline, victim.stdout.read()[-3000:]
            time.sleep(0.05)
        workers = _descendants(victim.pid)  # the forkserver and its workers, multiprocessing's resource tracker
        assert len(workers) >= 3, workers
        victim.send_signal(signal.SIGKILL)
        output, _ = victim.communicate(timeout=60)  # no worker holds its output open
    finally:
        if victim.poll() is None:
            victim.kill()
    deadline = time.monotonic() + 30
    while [pid for pid in workers if pid_alive(pid)]:
        assert time.monotonic() < deadline, [pid for pid in workers if pid_alive(pid)]
        time.sleep(0.1)
    assert "host work (preparing and evaluating jobs) on 2 worker processes" in output, output[-3000:]
    evaluated = {job: epoch for job in JOBS if (epoch := _checkpointed_epoch(backups / job))}
    assert len(evaluated) == 2, evaluated  # the first pack's, its last epoch trained, not checkpointed

    again = subprocess.run([sys.executable, "-m", "trainer", *command], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    for job, epoch in evaluated.items():
        assert f"{job}: resuming at epoch {epoch + 1} of {epochs}" in again.stderr, again.stderr[-3000:]
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        assert dict(db.execute("SELECT name, status FROM jobs")) == dict.fromkeys(JOBS, "done")
        attempts = [*db.execute("SELECT job, outcome FROM attempts")]
    for job in JOBS:  # the killed attempts recorded lost; each job done once
        outcomes = [outcome for name, outcome in attempts if name == job]
        assert outcomes == (["lost", "done"] if job in evaluated else ["done"]), attempts
        history = pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")["epoch"].tolist()
        assert history == list(range(1, len(history) + 1)), (job, history)


@pytest.mark.train
@pytest.mark.processes
def test_without_tensorflow_every_command_works_and_a_second_process_compiles_nothing_anew(tmp_path, monkeypatch):
    """Where TensorFlow is not installed: `run` with no --pack trains each job alone on Keras's JAX backend (a pack
    of one), said when the run starts and in its metrics.json; `--pack 1` is the same (--pack 2: the kill test
    above). What JAX compiles is kept in its persistent compilation cache under the run's cache_dir (xla/, named when
    the run starts): the process after the first (a resumed run, the next family of the same model) compiles nothing
    anew. `plan`, `status`, `report`, `doctor` and `push` (to the local Hub) work; `predict` forecasts from it on JAX
    what TensorFlow forecasts."""
    pytest.importorskip("jax")
    config = _config(tmp_path, epochs=1)
    cache = tmp_path / "cache" / "xla"  # conftest: each test's CRYPTOTRAIN_CACHE is tmp_path/cache
    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny model's steps compile in well under 1 s

    def without_tensorflow(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run([*cli_without("tensorflow"), *args], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    def run(output: str, *args: str) -> str:
        return " ".join(without_tensorflow("run", "--config", str(config), "--only", "BTCUSDT", "--set",
                                           f"output_dir={tmp_path / output}", *args).stderr.split())

    said = run("first")
    assert "TensorFlow is not installed: training on Keras's JAX backend" in said
    assert f"packed training on cpu: 1 job at a time (a job alone); compiled steps kept in {cache}" in said
    metrics = json.loads((tmp_path / "first" / "jobs" / "BTCUSDT_1h" / "metrics.json").read_text())
    assert metrics["engine"] == {"name": "jax", "jobs": 1, "precision": "float32", "device": "cpu"}
    compiled = sorted(path.name for path in cache.iterdir())
    assert compiled
    run("second", "--pack", "1")
    assert sorted(path.name for path in cache.iterdir()) == compiled
    assert json.loads((tmp_path / "second" / "jobs" / "BTCUSDT_1h" / "metrics.json").read_text())["engine"] == \
        metrics["engine"]

    # `plan` without TensorFlow builds the model on Keras's JAX backend to count its parameters
    assert "parameters" in without_tensorflow("plan", "--config", str(config)).stdout
    assert "1 done" in without_tensorflow("status", str(tmp_path / "first")).stdout
    assert without_tensorflow("report", str(tmp_path / "first")).stdout.strip().endswith("report.html")
    # `doctor`: the machine, and what Keras on JAX does with it (a step timed there, packing)
    doctor = " ".join(without_tensorflow("doctor").stdout.split())
    assert "TensorFlow not installed, JAX " in doctor and re.search(r"JAX cpu\W+float32", doctor)
    assert "notice: TensorFlow is not installed: every command runs on Keras's JAX backend" in doctor
    assert "on cpu; --pack auto for V7's 40 jobs: auto: one job at a time" in doctor
    assert "verdict: no problems found" in doctor
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as hub:
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1",
                   HF_HUB_CACHE=str(tmp_path / "hf-cache"))
        without_tensorflow("push", str(tmp_path / "first"), "--repo-id", "tester/no-tensorflow")
        assert "BTCUSDT/1h/model.keras" in hub.files("tester/no-tensorflow")
    # `predict` without TensorFlow: the job's model on Keras's JAX backend forecasts what TensorFlow's does
    job = str(tmp_path / "first" / "jobs" / "BTCUSDT_1h")
    on_jax = json.loads(without_tensorflow("predict", "--model", job, "--json").stdout)["forecast"]
    on_tensorflow = json.loads(predict_cli("--model", job, "--json"))["forecast"]
    assert [row["timestamp"] for row in on_jax] == [row["timestamp"] for row in on_tensorflow]
    for jax_row, tensorflow_row in zip(on_jax, on_tensorflow):
        numbers = {key for key, value in tensorflow_row.items() if isinstance(value, float)}
        assert numbers and {key: jax_row[key] for key in numbers} == pytest.approx(
            {key: tensorflow_row[key] for key in numbers}, rel=1e-4)
