"""kill -9 at several points of a real run, then the same command again: every job ends done exactly
once, every manifest verifies, and nothing partial is left behind."""
from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests import kill_points
from tests.conftest import CANDLES_DIR, REPO
from tests.forkserver import Forked, ForkServer
from trainer.cli import main
from trainer.run.jobdir import JobDir

pytestmark = pytest.mark.processes  # real `cryptotrain run` processes, stopped by signals

JOBS = ["BTCUSDT_15m", "BTCUSDT_1h", "ETHUSDT_15m", "ETHUSDT_1h"]


def _start_paused(forked: ForkServer, point: str, marker: Path, epoch_log: Path, config: Path, *args: str) -> Forked:
    """`cryptotrain run --config CONFIG ARGS` through tests/kill_points.py, Ctrl-C working as at a terminal."""
    return forked.start("run", "--config", str(config), *args, cwd=REPO,
                        kill_point=[point, str(marker), str(epoch_log)], default_sigint=True)


def _rerun(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The same command again, in the test's own process (nothing kills it); returns the epochs it began, per job
    (and writes what it printed to rerun.log)."""
    epoch_log = tmp_path / "rerun_epochs.log"
    kill_points.log_epochs(epoch_log, monkeypatch.setattr)
    rerun = CliRunner().invoke(main, ["run", "--config", str(config)], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.output[-3000:]
    (tmp_path / "rerun.log").write_text(rerun.output)
    began: dict[str, list[int]] = {}
    for line in epoch_log.read_text().splitlines() if epoch_log.exists() else []:
        job, epoch = line.split()
        began.setdefault(job, []).append(int(epoch))
    return began


def _wait_for(marker: Path, process: Forked, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"run ended before the kill point: {process.stderr[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("kill point not reached in time")
        time.sleep(0.05)


def _four_job_config(tiny_config, symbols: tuple[str, ...] = ("BTCUSDT", "ETHUSDT")) -> Path:
    """JOBS, 3 epochs each (or those of `symbols`): the first job is stopped in, the others trained after it."""
    return tiny_config(data={
        "source": "local", "local": {"path": str(CANDLES_DIR)},
        "symbols": list(symbols), "timeframes": ["15m", "1h"], "max_rows": 500,
    }, train={"batch_size": 32, "epochs": 3, "learning_rate": 0.003, "seed": 1,
              "early_stopping": {"patience": 5}, "reduce_lr": {"patience": 2}})


def _two_job_config(tiny_config) -> Path:
    """BTCUSDT's two jobs (JOBS[:2]): for a test about the first job, stopped, and one after it."""
    return _four_job_config(tiny_config, ("BTCUSDT",))


def test_ctrl_c_saves_prints_the_resume_command_and_the_rerun_finishes(forked, tiny_config, tmp_path, monkeypatch):
    config = _two_job_config(tiny_config)
    marker = tmp_path / "paused"
    victim = _start_paused(forked, "mid-epoch", marker, tmp_path / "epochs.log", config)
    _wait_for(marker, victim)
    victim.send_signal(signal.SIGINT)
    assert victim.wait(timeout=60) == 130
    message = victim.stderr
    assert "Resume with:" in message and f"run --config {config}" in message
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        first = db.execute("SELECT name, status, attempts FROM jobs ORDER BY position LIMIT 1").fetchone()
    assert first == ("BTCUSDT_15m", "pending", 0)  # released, not counted as a failed attempt
    with np.load(tmp_path / "run" / ".backup" / "BTCUSDT_15m" / "checkpoint.npz") as kept:
        assert int(kept["epoch"]) == 1  # its finished epoch is kept

    began = _rerun(tmp_path, config, monkeypatch)
    assert began["BTCUSDT_15m"] == [2, 3]  # resumed after its finished epoch, not trained again
    assert "BTCUSDT_15m: resuming at epoch 2 of 3 (epoch 1 was saved)" in (tmp_path / "rerun.log").read_text()
    history = pd.read_csv(tmp_path / "run" / "jobs" / "BTCUSDT_15m" / "history.csv")
    assert history["epoch"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("stop, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130),
                                        (signal.SIGTERM, 143)])
def test_a_stop_while_a_checkpoint_is_written_never_bricks_the_job(forked, tiny_config, tmp_path, monkeypatch, stop,
                                                                   code):
    """Stopped with half of the second epoch's checkpoint on disk: the rerun goes on from the first epoch's,
    and finishes. Ctrl-C and SIGTERM stop cleanly, saying how to resume."""
    config = _two_job_config(tiny_config)
    marker = tmp_path / "paused"
    victim = _start_paused(forked, "checkpoint", marker, tmp_path / "epochs.log", config)
    _wait_for(marker, victim)
    victim.send_signal(stop)
    assert victim.wait(timeout=60) == code
    if stop != signal.SIGKILL:
        assert "Resume with:" in victim.stderr

    began = _rerun(tmp_path, config, monkeypatch)
    assert began["BTCUSDT_15m"] == [2, 3]
    history = pd.read_csv(tmp_path / "run" / "jobs" / "BTCUSDT_15m" / "history.csv")
    assert history["epoch"].tolist() == [1, 2, 3]
    with np.load(tmp_path / "run" / ".backup" / "BTCUSDT_15m" / "checkpoint.npz") as kept:
        assert int(kept["epoch"]) == 3  # the last epoch's: what more epochs would go on from


# The epochs the rerun begins for the first job: all of them, those after the backed-up one, or none
# (its training had finished; only its artifacts were not committed).
@pytest.mark.parametrize("point,first_job_epochs", [("features", [1, 2, 3]), ("mid-epoch", [2, 3]),
                                                    ("artifacts", [])])
def test_sigkill_then_rerun_finishes_every_job_exactly_once(forked, tiny_config, tmp_path, monkeypatch, point,
                                                           first_job_epochs):
    config = _two_job_config(tiny_config)
    jobs = JOBS[:2]
    run_dir = tmp_path / "run"
    marker = tmp_path / "paused"

    victim = _start_paused(forked, point, marker, tmp_path / "epochs.log", config)
    _wait_for(marker, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    began = _rerun(tmp_path, config, monkeypatch)
    assert began.get("BTCUSDT_15m", []) == first_job_epochs
    assert all(began[job] == [1, 2, 3] for job in jobs[1:])

    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        statuses = dict(db.execute("SELECT name, status FROM jobs"))
        done_attempts = db.execute("SELECT job, COUNT(*) FROM attempts WHERE outcome = 'done' GROUP BY job")
        done_attempts = dict(done_attempts.fetchall())
        manifests = dict(db.execute("SELECT name, manifest_sha256 FROM jobs"))
    assert statuses == {job: "done" for job in jobs}
    assert done_attempts == {job: 1 for job in jobs}
    for job in jobs:
        assert JobDir(run_dir / "jobs" / job).verify() == manifests[job]
        history = pd.read_csv(run_dir / "jobs" / job / "history.csv")
        assert history["epoch"].tolist() == list(range(1, len(history) + 1))  # no epoch lost or repeated
    leftovers = [p for p in run_dir.rglob("*") if p.is_file() and (p.name.startswith("tmp") or ".staging-" in str(p))]
    assert leftovers == []
    for job in jobs:  # each job's last checkpoint is kept, and the one before it, nothing else
        kept = {p.name for p in (run_dir / ".backup" / job).iterdir()}
        assert kept == {"checkpoint.npz", "checkpoint.previous.npz"}, (job, kept)
    assert sorted(p.name for p in (run_dir / "jobs").iterdir()) == jobs


def test_two_processes_on_one_run_directory_share_the_jobs_without_doing_one_twice(forked, tiny_config, tmp_path):
    config = _four_job_config(tiny_config)
    run_dir = tmp_path / "run"
    workers = [forked.start("run", "--config", str(config), cwd=REPO) for _ in range(2)]
    errors = [worker.communicate(timeout=600)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [e[-600:] for e in errors]

    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        attempts = db.execute("SELECT job, pid, outcome FROM attempts").fetchall()
        manifests = dict(db.execute("SELECT name, manifest_sha256 FROM jobs WHERE status = 'done'"))
    assert sorted(job for job, _, _ in attempts) == JOBS and {outcome for _, _, outcome in attempts} == {"done"}
    assert len({pid for _, pid, _ in attempts}) == 2  # both took part
    for job in JOBS:
        assert JobDir(run_dir / "jobs" / job).verify() == manifests[job]


def test_new_run_never_moves_a_run_directory_another_process_is_training_in(forked, tiny_config, tmp_path):
    config = _two_job_config(tiny_config)
    marker = tmp_path / "paused"
    victim = _start_paused(forked, "mid-epoch", marker, tmp_path / "epochs.log", config)
    try:
        _wait_for(marker, victim)
        changed = forked.run("run", "--config", str(config), "--set", "window.lookback=12", "--new-run", cwd=REPO,
                             timeout=300)
        assert changed.returncode == 2, changed.stderr[-2000:]
        lines = [line for line in changed.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "--new-run cannot move this run directory: another process is training in " \
            f"it (BTCUSDT_15m (pid {victim.pid} on " in lines[0], changed.stderr[-2000:]
        assert victim.poll() is None and (tmp_path / "run" / "ledger.sqlite").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("run-")] == []  # nothing moved
    finally:
        victim.kill()
        victim.wait()


def test_a_process_woken_after_another_took_its_job_over_commits_nothing(forked, tiny_config, tmp_path):
    """A laptop asleep: a process paused (SIGSTOP) with its job's files staged, for longer than the stale limit;
    another takes the job over and finishes the run; then the first wakes. It must neither move its files into
    jobs/ nor record the job: the job is done once, the ledger's hash is the directory's manifest's, the winner's
    files are intact, and the first says so in one line and leaves no staging directory."""
    config = tiny_config(data={"source": "local", "local": {"path": str(CANDLES_DIR)}, "symbols": ["BTCUSDT"],
                               "timeframes": ["1h"], "max_rows": 500},
                         train={"batch_size": 64, "epochs": 1, "seed": 1})
    run_dir, marker, stale = tmp_path / "run", tmp_path / "paused", "3"
    sleeper = _start_paused(forked, "artifacts", marker, tmp_path / "epochs.log", config, "--stale-after", stale)
    try:
        _wait_for(marker, sleeper)  # its files staged and sealed, about to be committed
        sleeper.send_signal(signal.SIGSTOP)  # asleep: no heartbeat either
        time.sleep(float(stale) + 1)
        other = forked.run("run", "--config", str(config), "--stale-after", stale, cwd=REPO, timeout=300)
        assert other.returncode == 0, other.stderr[-2000:]
        job = JobDir(run_dir / "jobs" / "BTCUSDT_1h")
        winner = job.verify()
        files = {p.name: p.read_bytes() for p in job.path.iterdir()}
        sleeper.send_signal(signal.SIGCONT)
        marker.unlink()  # woken: it goes on to commit
        _, stderr = sleeper.communicate(timeout=120)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.returncode == 0, stderr[-2000:]
    said = [line for line in stderr.splitlines() if "took this job over" in line]
    assert len(said) == 1 and "BTCUSDT_1h: another process took this job over while this one went silent (no " \
        "heartbeat for 3 s); this one's files were discarded, that one's kept" in said[0], stderr[-2000:]
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        (status, manifest), = db.execute("SELECT status, manifest_sha256 FROM jobs").fetchall()
        outcomes = [outcome for (outcome,) in db.execute("SELECT outcome FROM attempts ORDER BY attempt")]
    assert (status, outcomes) == ("done", ["lost", "done"])  # done once: by the other process
    assert manifest == winner == job.verify()
    assert {p.name: p.read_bytes() for p in job.path.iterdir()} == files  # the winner's, intact
    assert not list((run_dir / "jobs").glob(".staging-*"))


# Each kind of file written with files.atomic_write in a local run, as a glob of its temp file's path (#N: its
# Nth write). A job's backup is one checkpoint per epoch (its rows and best weights in it): killed while the first
# is written, none is whole; while the last (the 2nd) is, the one before it has been moved aside and training
# has ended.
ATOMIC_WRITES = {
    "checkpoint": "*/run/.backup/*/tmp*-checkpoint.npz",
    "last epoch's checkpoint": "*/run/.backup/*/tmp*-checkpoint.npz#2",
    "feature cache entry": "*/cache/features/tmp*",
    "parsed candles cache entry": "*/cache/candles/parsed/tmp*",
    "run config": "*/run/tmp*-config.yaml",
    "summary": "*/run/tmp*-summary.json",
    "report": "*/run/tmp*-report.html",
}


def _temp_files(*directories: Path) -> list[Path]:
    """files.atomic_write's temp files (tmp<pid>-<name>) under the directories, at any depth."""
    return [path for directory in directories for path in directory.rglob("tmp*-*")
            if path.name[3:].split("-", 1)[0].isdigit()]


@pytest.mark.parametrize("kind", list(ATOMIC_WRITES))
def test_sigkill_during_each_kind_of_atomic_write_leaves_no_temp_file_once_the_run_is_done(forked, tiny_config,
                                                                                            tmp_path, kind):
    config = tiny_config(data={"source": "local", "local": {"path": str(CANDLES_DIR)}, "symbols": ["BTCUSDT"],
                               "timeframes": ["1h"], "max_rows": 600})
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    marker = tmp_path / "paused"
    victim = _start_paused(forked, f"write:{ATOMIC_WRITES[kind]}", marker, tmp_path / "epochs.log", config)
    _wait_for(marker, victim)
    assert len(_temp_files(run_dir, cache)) == 1  # killed with the write under way
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    rerun = CliRunner().invoke(main, ["run", "--config", str(config)], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.output
    assert _temp_files(run_dir, cache) == []
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        assert db.execute("SELECT status FROM jobs").fetchall() == [("done",)]
