"""`cryptotrain run --executor ray` against a real Ray cluster started here (127.0.0.1 only, 2 CPUs): the same
results as a local run, a worker killed with SIGKILL mid-job costs only the epoch under way, an unreachable
cluster or a missing Ray is one line."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, tiny_config_dict

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")

JOBS = ["BTCUSDT_15m", "BTCUSDT_1h", "ETHUSDT_15m", "ETHUSDT_1h"]
# Ray >= 2.59 authenticates every client of a cluster with a token: the cluster and its drivers share this one.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head on 127.0.0.1 with 2 CPUs, as `ray start --head` makes one; stopped after the module."""
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_cli = str(Path(sys.executable).parent / "ray")
    started = subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                              "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                             capture_output=True, text=True, timeout=180, env=ENV)
    assert started.returncode == 0, started.stderr[-3000:]
    yield f"127.0.0.1:{port}"
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120, env=ENV)


def _config(tmp_path: Path, name: str, **train) -> Path:
    raw = tiny_config_dict(tmp_path)
    raw["output_dir"] = str(tmp_path / name)
    raw["data"]["timeframes"] = ["15m", "1h"]
    raw["train"].update(train)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "run", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _ledger(run_dir: Path) -> tuple[dict, dict]:
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        statuses = dict(db.execute("SELECT name, status FROM jobs"))
        attempts = {}
        for job, outcome in db.execute("SELECT job, outcome FROM attempts ORDER BY job, attempt"):
            attempts.setdefault(job, []).append(outcome)
    return statuses, attempts


def test_jobs_on_two_ray_workers_end_as_they_do_locally(cluster, tmp_path):
    local = _run("--config", str(_config(tmp_path, "local")))
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = _run("--config", str(_config(tmp_path, "ray")), "--executor", "ray", "--ray-address", cluster,
                  "--workers", "2", "--cpus-per-worker", "1", "--tensorboard")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert "Ray" not in on_ray.stderr  # none of Ray's own start-up lines through the display

    assert _ledger(tmp_path / "ray") == _ledger(tmp_path / "local") == (
        dict.fromkeys(JOBS, "done"), {job: ["done"] for job in JOBS})
    for job in JOBS:
        here, there = (tmp_path / where / "jobs" / job for where in ("local", "ray"))
        assert json.loads((there / "manifest.json").read_text()).keys() == \
            json.loads((here / "manifest.json").read_text()).keys()
        assert sorted(p.name for p in there.iterdir()) == sorted(p.name for p in here.iterdir())
        mine, theirs = (json.loads((d / "metrics.json").read_text()) for d in (here, there))
        assert theirs["epochs_run"] == mine["epochs_run"]
        np.testing.assert_allclose(theirs["best_val_loss"], mine["best_val_loss"], rtol=1e-3)
        for head, scores in mine["heads"].items():  # test MAE of each head's forecast, in price units
            np.testing.assert_allclose(theirs["heads"][head]["model"]["mae"], scores["model"]["mae"], rtol=1e-3)
        # the driver holds each job's last checkpoint, as a local run does: a longer budget goes on from it
        assert (tmp_path / "ray" / ".backup" / job / "checkpoint.npz").is_file()
        # and the TensorBoard logs the worker wrote, where a local run writes them
        for split in ("train", "validation"):
            assert list((tmp_path / "ray" / "tensorboard" / job / split).glob("events.out.tfevents.*")), (job, split)


def _worker_pids(name: str) -> list[int]:
    """Processes whose title is Ray's for an actor method under way, e.g. "ray::_Worker.train"."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"ray::{name}"):
                pids.append(int(proc.name))
    return pids


def _checkpointed_epoch(backup: Path) -> int:
    try:
        with np.load(backup / "checkpoint.npz") as saved:
            return int(saved["epoch"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_worker_killed_mid_job_costs_only_the_epoch_under_way(cluster, tmp_path):
    """SIGKILL of the worker processes while they train: each of their jobs goes on in a new worker from the last
    epoch whose checkpoint reached the driver; no epoch ends twice, no attempt counts as failed, every job is
    done exactly once."""
    config = _config(tmp_path, "run", epochs=4, batch_size=16)
    raw = yaml.safe_load(config.read_text())
    raw["data"]["max_rows"] = 3000  # epochs long enough to be killed in
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    driver = subprocess.Popen([sys.executable, "-m", "trainer", "run", "--config", str(config), "-v", "--executor",
                               "ray", "--ray-address", cluster, "--workers", "2", "--cpus-per-worker", "1"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    first = tmp_path / "run" / ".backup" / JOBS[0]
    deadline = time.monotonic() + 300
    while _checkpointed_epoch(first) < 1:  # the first job has an epoch on the driver, and more to go
        assert driver.poll() is None and time.monotonic() < deadline, driver.stdout.read()[-3000:]
        time.sleep(0.05)
    killed = {}
    for pid in _worker_pids("_Worker.train"):
        killed[pid] = {job: _checkpointed_epoch(tmp_path / "run" / ".backup" / job) for job in JOBS}
        os.kill(pid, signal.SIGKILL)
    assert killed, "no worker was training"
    output, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, output[-3000:]

    statuses, attempts = _ledger(tmp_path / "run")
    assert statuses == dict.fromkeys(JOBS, "done") and attempts == {job: ["done"] for job in JOBS}
    resumed = dict(re.findall(r"^(\w+): resuming at epoch (\d+) of 4", output, re.MULTILINE))
    assert JOBS[0] in resumed and "its Ray worker died" in output
    at_kill = next(iter(killed.values()))
    for job, epoch in resumed.items():  # it began again after the last checkpoint the driver had: none lost
        assert int(epoch) - 1 >= max(at_kill[job], 1), (job, epoch, at_kill)
    for job in JOBS:  # every epoch ended exactly once, in order: the one under way at the kill began twice
        ended = [int(e) for e in re.findall(rf"^{job}: epoch (\d)/4", output, re.MULTILINE)]
        history = pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")
        assert ended == history["epoch"].tolist() == list(range(1, len(history) + 1)), (job, output[-3000:])


def test_a_killed_driver_resumes_as_a_local_run_does(cluster, tmp_path):
    """SIGKILL of the `cryptotrain run` process itself while its Ray workers train: the same command again
    finishes every job exactly once, going on after the checkpoints the first driver received; no attempt failed."""
    config = _config(tmp_path, "run", epochs=3, batch_size=16)
    raw = yaml.safe_load(config.read_text())
    raw["data"]["max_rows"] = 3000  # epochs long enough to be killed in
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    args = ["--config", str(config), "-v", "--executor", "ray", "--ray-address", cluster, "--workers", "2",
            "--cpus-per-worker", "1"]
    driver = subprocess.Popen([sys.executable, "-m", "trainer", "run", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=ENV)
    first = tmp_path / "run" / ".backup" / JOBS[0]
    deadline = time.monotonic() + 300
    while _checkpointed_epoch(first) < 1:
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    driver.kill()
    driver.wait(timeout=60)
    at_kill = {job: _checkpointed_epoch(tmp_path / "run" / ".backup" / job) for job in JOBS}

    again = _run(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    statuses, attempts = _ledger(tmp_path / "run")
    assert statuses == dict.fromkeys(JOBS, "done")
    assert all(outcomes.count("done") == 1 and "failed" not in outcomes for outcomes in attempts.values()), attempts
    said = again.stdout + again.stderr  # notes such as "resuming at epoch" go to stderr
    resumed = dict(re.findall(r"^(\w+): resuming at epoch (\d+) of 3", said, re.MULTILINE))
    assert int(resumed.get(JOBS[0], 0)) == at_kill[JOBS[0]] + 1, (resumed, at_kill, said[-3000:])
    for job in JOBS:  # no epoch lost or repeated in what the job kept
        history = pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")
        assert history["epoch"].tolist() == list(range(1, len(history) + 1)), job


def test_an_unreachable_cluster_is_one_line_and_nothing_is_written(tmp_path):
    config = _config(tmp_path, "run")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once the probe is closed
    result = _run("--config", str(config), "--executor", "ray", "--ray-address", f"127.0.0.1:{port}", timeout=120)
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: --ray-address 127.0.0.1:{port}: cannot reach the Ray cluster at 127.0.0.1:{port} ([Errno 111] "
        "Connection refused); start one with `ray start --head`, or leave --ray-address out for a Ray on this machine"]
    assert not (tmp_path / "run").exists()


NO_RAY = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed: `import ray` raises ImportError
from trainer.cli import main
main(sys.argv[1:])
"""


def test_without_ray_local_runs_work_and_the_ray_executor_says_how_to_install_it(tmp_path):
    config = str(_config(tmp_path, "run", epochs=1))
    local = subprocess.run([sys.executable, "-c", NO_RAY, "run", "--config", config, "--only", "BTCUSDT"],
                           cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)
    assert local.returncode == 0, local.stderr[-3000:]
    wanted = subprocess.run([sys.executable, "-c", NO_RAY, "run", "--config", config, "--executor", "ray"],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)
    assert wanted.returncode == 2
    assert wanted.stderr.strip().splitlines() == [
        "error: --executor ray needs Ray: pip install 'cryptotrain[ray]' (or pip install 'ray>=2.9'), or run "
        "without --executor ray"]
