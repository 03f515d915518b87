"""The run ledger against real SQLite files, shared by real OS processes."""
from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import job_summary
from trainer.config import load_config
from trainer.errors import JobError, UserError
from trainer.run.ledger import Ledger, LostClaim

REPO = Path(__file__).resolve().parents[2]

# One helper process per scenario, run as `python -c WORKER MODE RUN_DIR [JOB...]`.
WORKER = """
import os, signal, sys, time
from trainer.run.ledger import Ledger, LostClaim

mode, run_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "open-together":
    print("ready", flush=True)
    sys.stdin.readline()
    Ledger(run_dir).add_jobs(names)
    sys.exit()
ledger = Ledger(run_dir)
if mode == "race":
    from tests.conftest import job_summary  # here: open-together starts 40 processes, and it loads pytest
    ledger.open_run("fp", {"train": {"epochs": 1}}, lambda fingerprint, recorded: None)
    ledger.add_jobs(names)
    print("ready", flush=True)
    sys.stdin.readline()
    while (name := ledger.claim(retries=0)) is not None:
        time.sleep(0.01)  # the "work", so that the other workers get to claim in between
        ledger.mark_done(name, lambda: "sha-" + name, job_summary(name), 0.0)
        print(name, flush=True)
elif mode == "claim-and-die":
    print(ledger.claim(retries=0), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "claim-and-wait":
    print(ledger.claim(retries=0), flush=True)
    sys.stdin.readline()
    try:
        ledger.heartbeat(names[0])
        print("held")
    except LostClaim:
        print("lost")
"""


def start_worker(mode: str, run_dir: Path, *names: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, mode, str(run_dir), *names], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def attempt_rows(run_dir: Path, job: str) -> list[tuple]:
    with sqlite3.connect(run_dir / "ledger.sqlite") as conn:
        return conn.execute("SELECT attempt, pid, outcome, error FROM attempts WHERE job = ? ORDER BY attempt",
                            (job,)).fetchall()


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "run")
    yield ledger
    ledger.close()


@pytest.mark.processes
def test_racing_processes_do_every_job_exactly_once(tmp_path):
    run_dir = tmp_path / "run"
    names = [f"SYM{i:02d}USDT_1h" for i in range(30)]
    workers = [start_worker("race", run_dir, *names) for _ in range(4)]
    for worker in workers:  # every worker has created/opened the ledger before any claims
        assert worker.stdout.readline() == "ready\n"
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    claimed_by = {}
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        for name in out.split():
            assert name not in claimed_by, f"{name} claimed twice"
            claimed_by[name] = worker.pid

    ledger = Ledger(run_dir)
    records = ledger.jobs()
    assert [r.name for r in records] == names
    for record in records:
        assert (record.status, record.attempts) == ("done", 1)
        assert record.summary == job_summary(record.name)
        assert record.manifest_sha256 == "sha-" + record.name
        assert [(a, pid, outcome) for a, pid, outcome, _ in attempt_rows(run_dir, record.name)] == [
            (1, claimed_by[record.name], "done")]
    assert ledger.counts() == {"pending": 0, "running": 0, "done": 30, "failed": 0}
    ledger.close()


@pytest.mark.processes
def test_processes_creating_one_new_ledger_together_all_open_it(tmp_path):
    # SQLite refuses a concurrent switch to WAL at once ("database is locked") instead of waiting
    for attempt in range(5):
        run_dir = tmp_path / f"run{attempt}"
        workers = [start_worker("open-together", run_dir, f"JOB{i}") for i in range(8)]
        for worker in workers:
            assert worker.stdout.readline() == "ready\n"
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            worker.communicate(timeout=60)
            assert worker.returncode == 0
        ledger = Ledger(run_dir)
        assert sorted(record.name for record in ledger.jobs()) == [f"JOB{i}" for i in range(8)]
        ledger.close()


def test_job_of_a_killed_process_is_reclaimed(ledger):
    ledger.add_jobs(["BTCUSDT_1h", "ETHUSDT_1h"])
    worker = start_worker("claim-and-die", ledger.run_dir)
    assert worker.stdout.readline() == "BTCUSDT_1h\n"
    assert worker.wait(timeout=30) == -signal.SIGKILL
    assert ledger.jobs()[0].status == "running"

    assert ledger.claim(retries=0) == "BTCUSDT_1h"
    record = ledger.jobs()[0]
    assert (record.status, record.attempts, record.pid) == ("running", 2, os.getpid())
    (first, _, lost, error), (second, _, still_open, _) = attempt_rows(ledger.run_dir, "BTCUSDT_1h")
    assert (first, lost, second, still_open) == (1, "lost", 2, None)
    assert str(worker.pid) in error


def test_job_of_a_killed_process_not_yet_reaped_is_reclaimed(ledger):
    """Killed, a process stays a zombie until its parent waits for it (or, orphaned, while its threads are torn
    down): the same command started again at once must not take it for a process still running."""
    ledger.add_jobs(["BTCUSDT_1h"])
    worker = start_worker("claim-and-die", ledger.run_dir)
    assert worker.stdout.readline() == "BTCUSDT_1h\n"
    os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)  # dead, and left a zombie: not reaped
    try:
        assert ledger.claim(retries=0) == "BTCUSDT_1h"
        assert f"process {worker.pid} on " in attempt_rows(ledger.run_dir, "BTCUSDT_1h")[0][3]
    finally:
        worker.wait()


def test_job_left_by_an_earlier_process_with_this_pid_is_reclaimed(ledger):
    # e.g. a restarted container, whose entry point is PID 1 again: the pid is alive, the job is not
    ledger.add_jobs(["BTCUSDT_1h", "ETHUSDT_1h"])
    with sqlite3.connect(ledger.path) as db:
        db.execute("UPDATE jobs SET status = 'running', attempts = 1, pid = ?, host = ?, heartbeat_at = ? "
                   "WHERE name = 'BTCUSDT_1h'", (os.getpid(), socket.gethostname(), time.time()))
        db.execute("INSERT INTO attempts (job, attempt, pid, host, started_at) VALUES ('BTCUSDT_1h', 1, ?, ?, ?)",
                   (os.getpid(), socket.gethostname(), time.time()))
    assert ledger.claim(retries=0) == "BTCUSDT_1h"
    assert "an earlier process with pid" in attempt_rows(ledger.run_dir, "BTCUSDT_1h")[0][3]
    assert ledger.claim(retries=0) == "ETHUSDT_1h"  # the job it holds now is not handed out again
    assert ledger.claim(retries=0) is None


def test_live_job_is_left_alone_until_its_heartbeat_goes_stale(ledger):
    ledger.add_jobs(["BTCUSDT_1h"])
    worker = start_worker("claim-and-wait", ledger.run_dir, "BTCUSDT_1h")
    try:
        assert worker.stdout.readline() == "BTCUSDT_1h\n"
        assert ledger.claim(retries=5) is None  # alive, fresh heartbeat

        impatient = Ledger(ledger.run_dir, stale_after=0.0)
        assert impatient.claim(retries=0) == "BTCUSDT_1h"
        impatient.close()
        out, _ = worker.communicate("go\n", timeout=30)
    finally:
        worker.kill()
    assert out.split() == ["lost"]  # the first owner learns it no longer holds the job
    assert attempt_rows(ledger.run_dir, "BTCUSDT_1h")[0][2] == "lost"
    ledger.mark_done("BTCUSDT_1h", lambda: "sha", job_summary(), 1.0)  # the process of `impatient`: the owner
    assert ledger.counts()["done"] == 1


def test_a_run_records_its_config_once_and_checks_it_after(ledger):
    seen = []
    ledger.open_run("a", {"train": {"epochs": 1}}, lambda fingerprint, recorded: seen.append("first"))
    assert seen == []  # a new ledger: recorded, nothing to check
    ledger.open_run("b", {"train": {"epochs": 2}}, lambda fingerprint, recorded: seen.append((fingerprint, recorded)))
    assert seen == [("a", {"train": {"epochs": 1}})]  # the record follows the config the check let through

    def refuse(fingerprint, recorded):
        raise UserError("no")
    with pytest.raises(UserError, match="no"):
        ledger.open_run("c", {"train": {"epochs": 3}}, refuse)
    ledger.open_run("d", {}, lambda fingerprint, recorded: seen.append((fingerprint, recorded)))
    assert seen[-1] == ("b", {"train": {"epochs": 2}})  # refused: the record unchanged


def test_failed_jobs_are_retried_up_to_retries_and_release_does_not_count(ledger):
    ledger.add_jobs(["BTCUSDT_1h"])
    assert ledger.claim(retries=1) == "BTCUSDT_1h"
    ledger.mark_failed("BTCUSDT_1h", "NaN loss at epoch 3", 4.0)
    record = ledger.jobs()[0]
    assert (record.status, record.attempts, record.error, record.seconds) == ("failed", 1, "NaN loss at epoch 3", 4.0)

    assert ledger.claim(retries=1) == "BTCUSDT_1h"
    ledger.release("BTCUSDT_1h")  # Ctrl-C
    assert (ledger.jobs()[0].status, ledger.jobs()[0].attempts) == ("pending", 1)

    assert ledger.claim(retries=1) == "BTCUSDT_1h"
    ledger.mark_failed("BTCUSDT_1h", "NaN loss again", 2.0)
    assert ledger.claim(retries=1) is None
    assert (ledger.jobs()[0].status, ledger.jobs()[0].attempts) == ("failed", 2)
    assert ledger.claim(retries=2) == "BTCUSDT_1h"  # a later run allowing more retries
    outcomes = [outcome for _, _, outcome, _ in attempt_rows(ledger.run_dir, "BTCUSDT_1h")]
    assert outcomes == ["failed", "interrupted", "failed", None]


def test_jobs_keep_first_seen_order_and_claims_respect_names(ledger):
    ledger.add_jobs(["B", "A"])
    ledger.add_jobs(["A", "C", "B", "C"])
    assert [r.name for r in ledger.jobs()] == ["B", "A", "C"]
    assert ledger.claim(retries=0, names=["C"]) == "C"
    assert ledger.claim(retries=0, names=["C"]) is None
    assert ledger.claim(retries=0) == "B"
    assert ledger.counts() == {"pending": 1, "running": 2, "done": 0, "failed": 0}


def test_only_the_owner_records_an_attempt(ledger):
    ledger.add_jobs(["A"])
    ledger.claim(retries=0)
    ledger.release("A")
    with pytest.raises(LostClaim, match="A: no longer held by this process"):
        ledger.heartbeat("A")
    with pytest.raises(LostClaim):
        ledger.mark_done("A", lambda: "sha", job_summary("A"), 1.0)
    assert ledger.jobs()[0].status == "pending"


def test_mark_pending_and_record_push(ledger):
    ledger.add_jobs(["A"])
    ledger.claim(retries=0)
    ledger.mark_done("A", lambda: "f00d", job_summary("A", test_mae=1.5), 12.5)
    ledger.record_push("A", "you/cpb", "abc123", "https://hf.co/you/cpb/commit/abc123")
    record = ledger.jobs()[0]
    assert (record.status, record.summary, record.seconds) == ("done", job_summary("A", test_mae=1.5), 12.5)
    assert (record.pushed_repo, record.pushed_commit, record.pushed_url) == (
        "you/cpb", "abc123", "https://hf.co/you/cpb/commit/abc123")

    ledger.mark_pending({"A": "manifest mismatch: weights.keras"})
    record = ledger.jobs()[0]
    assert (record.status, record.attempts, record.error) == ("pending", 0, "manifest mismatch: weights.keras")
    assert (record.manifest_sha256, record.summary, record.pushed_commit) == (None, None, "abc123")

    assert ledger.claim(retries=0) == "A"
    with pytest.raises(JobError, match="A: is running"):
        ledger.mark_pending({"A": "again"})
    ledger.mark_done("A", lambda: "beef", job_summary("A"), 3.0)  # trained again: the push was of earlier files
    assert (ledger.jobs()[0].pushed_repo, ledger.jobs()[0].pushed_commit) == (None, None)
    with pytest.raises(JobError, match="NOPE: not a job of this run"):
        ledger.record_push("NOPE", "you/cpb", "abc", "url")


def test_heartbeat_thread_shares_the_instance(ledger):
    ledger.add_jobs(["A"])
    ledger.claim(retries=0)
    before = ledger.jobs()[0].heartbeat_at
    beats = threading.Thread(target=lambda: [ledger.heartbeat("A") for _ in range(50)])
    beats.start()
    for _ in range(50):
        assert ledger.counts()["running"] == 1
    beats.join()
    assert ledger.jobs()[0].heartbeat_at > before


def test_ledger_uses_wal_and_rejects_a_file_that_is_not_one(ledger, tmp_path):
    with sqlite3.connect(ledger.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ledger.sqlite").write_text("these are not the bytes of a database\n" * 100)
    with pytest.raises(UserError, match="broken/ledger.sqlite: cannot open the run ledger"):
        Ledger(broken)


@pytest.mark.parametrize("version", [1, 2])
def test_a_ledger_of_an_earlier_version_gains_the_columns_it_lacks(tmp_path, version):
    """Schema 1 had no jobs.inputs, 2 no jobs.selected_at: opened by this version, they are added and the jobs
    kept, every one of them counted as selected (what `status` showed then)."""
    from trainer.run import ledger as ledger_module

    lacking = ",\n        inputs TEXT,\n        selected_at REAL)" if version == 1 else ",\n        selected_at REAL)"
    old_schema = [statement.replace(lacking, ")") for statement in ledger_module._SCHEMA]
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        for statement in old_schema:
            db.execute(statement)
        db.execute("INSERT INTO run (id, fingerprint, config_json, created_at) VALUES (1, 'f', '{}', 1000.0)")
        db.execute("INSERT INTO jobs (name, position, status, attempts, error) VALUES ('BTCUSDT_1h', 0, 'failed', 2, "
                   "'boom')")
        db.execute(f"PRAGMA user_version={version}")
    records = Ledger(tmp_path).jobs()
    assert [(r.name, r.status, r.attempts, r.error, r.inputs, r.selected_at) for r in records] == [
        ("BTCUSDT_1h", "failed", 2, "boom", None, 1000.0)]


def test_a_read_only_ledger_reads_beside_a_run_writing_it_and_after_and_writes_nothing(tmp_path):
    """Read only (a run directory this user cannot write): while a run writes the ledger (its -wal file there),
    each read sees the run's latest commit; after the run (no -wal left, and no -shm made for the reader) the
    file is read as it is. A write is refused either way."""
    writer = Ledger(tmp_path)
    writer.add_jobs(["A_1h"])
    reader = Ledger(tmp_path, read_only=True)
    writer.add_jobs(["B_1h"])
    assert [job.name for job in reader.jobs()] == ["A_1h", "B_1h"]
    with pytest.raises(sqlite3.OperationalError, match="readonly database"):
        reader.add_jobs(["C_1h"])
    reader.close()
    writer.close()

    assert sorted(path.name for path in tmp_path.iterdir()) == ["ledger.sqlite"]
    after = Ledger(tmp_path, read_only=True)
    assert after.counts()["pending"] == 2
    with pytest.raises(sqlite3.OperationalError, match="readonly database"):
        after.add_jobs(["C_1h"])
    after.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ledger.sqlite"]


def test_a_ledger_of_an_earlier_version_read_only_is_one_line(tmp_path):
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        db.execute("PRAGMA user_version=2")
    with pytest.raises(UserError, match=r"ledger.sqlite: ledger schema version 2, this cryptotrain reads version 3, "
                                        "and upgrading it needs a run directory this user can write$"):
        Ledger(tmp_path, read_only=True)


def test_jobs_a_run_did_not_ask_for_are_recorded_as_never_selected(ledger):
    ledger.add_jobs(["A_1h", "B_1h", "C_1h"], selected=["B_1h"])
    ledger.add_jobs(["A_1h", "B_1h", "C_1h"], selected=["C_1h"])
    assert [r.selected_at is not None for r in ledger.jobs()] == [False, True, True]


def test_a_ledger_with_damaged_pages_is_one_line_in_status_and_run(tmp_path, tiny_config):
    """Damage found only when a read reaches the broken pages (after the ledger opened fine) is still one line
    naming the file and how to recover, in `status` and in `run`, exit 2."""
    from click.testing import CliRunner

    from trainer.cli import main

    config = tiny_config()
    run_dir = load_config(config).run_dir
    ledger = Ledger(run_dir)
    ledger.add_jobs([f"JOB{i}USDT_1h" for i in range(200)])  # a few pages of rows
    ledger.close()
    size = (run_dir / "ledger.sqlite").stat().st_size
    with open(run_dir / "ledger.sqlite", "r+b") as db:  # every page but the first (the schema) overwritten
        db.seek(4096)
        db.write(os.urandom(size - 4096))
    for args in (["status", str(run_dir)], ["run", "--config", str(config)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            f"error: {run_dir / 'ledger.sqlite'}: the run ledger is damaged (database disk image is malformed); "
            f"move it aside (mv {run_dir / 'ledger.sqlite'} {run_dir / 'ledger.sqlite'}.damaged) and run the same "
            "command again: finished jobs are recognised from their verified files"]
