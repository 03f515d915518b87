"""A run directory on Google Drive, as a Colab user keeps one: a real FUSE mount whose files refuse a shared mmap
(tests/drive.py), where SQLite's WAL cannot work. The quickstart there is killed with SIGKILL mid-run, then the same
command runs again in two processes at once while `status` (also read-only) reads the run as it is written: every job
ends done exactly once with its manifest verified, nothing temporary is left, no checkpoint went to the drive's
trash, and the report and a push to the Hub stand-in read the run there."""
from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.forkserver import Forked
from tests.hub_server import serve_hub
from trainer.run import rundir
from trainer.run.jobdir import JobDir
from trainer.run.ledger import LEDGER, ROLLBACK_NOTE, Ledger, journal_mode
from trainer.run.rundir import RunDir

JOBS = ["BTCUSDT_15m", "BTCUSDT_1h", "ETHUSDT_15m", "ETHUSDT_1h"]


def _wait_for(marker: Path, process: Forked, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert process.poll() is None, f"the run ended before the kill point: {process.stderr[-2000:]}"
        assert time.monotonic() < deadline, "kill point not reached in time"
        time.sleep(0.05)


@pytest.mark.processes  # real `cryptotrain run` processes, one stopped with SIGKILL
def test_the_quickstart_on_a_drive_survives_kill_9_shared_by_two_processes_read_by_status(
        drive, forked, tmp_path, monkeypatch):
    run_dir, cache = drive.path / "runs" / "quickstart", drive.path / "cache"
    command = ("run", "-c", "quickstart", "--set", f"output_dir={run_dir}", "--set", f"cache_dir={cache}",
               "--set", "data.max_rows=700")
    marker = tmp_path / "paused"
    victim = forked.start(*command, cwd=REPO, kill_point=["mid-epoch", str(marker), str(tmp_path / "epochs.log")])
    _wait_for(marker, victim)
    assert ROLLBACK_NOTE in victim.stderr  # said when the run started
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL

    # The same command, twice at once; `status` reads the run meanwhile, as it is and read-only
    workers = [forked.start(*command, cwd=REPO) for _ in range(2)]
    reads = 0
    while any(worker.poll() is None for worker in workers):
        with RunDir.open(run_dir) as opened:
            assert len(opened.ledger.jobs()) == len(JOBS)
        read_only = Ledger(run_dir, read_only=True)
        try:
            assert sum(read_only.counts().values()) == len(JOBS)
        finally:
            read_only.close()
        reads += 1
        time.sleep(0.2)
    errors = [worker.communicate(timeout=60)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [e[-1500:] for e in errors]
    assert reads >= 3
    assert "disk I/O error" not in "".join(errors) + victim.stderr

    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        statuses = dict(db.execute("SELECT name, status FROM jobs"))
        done = db.execute("SELECT job, pid FROM attempts WHERE outcome = 'done'").fetchall()
        manifests = dict(db.execute("SELECT name, manifest_sha256 FROM jobs"))
    assert statuses == dict.fromkeys(JOBS, "done")
    assert sorted(job for job, _ in done) == JOBS  # each done exactly once
    assert len({pid for _, pid in done}) == 2  # both processes took part
    for job in JOBS:
        assert JobDir(run_dir / "jobs" / job).verify() == manifests[job]
        assert {p.name for p in (run_dir / ".backup" / job).iterdir()} == {"checkpoint.npz", "checkpoint.previous.npz"}
    leftovers = [p for p in drive.path.rglob("*")
                 if p.name.startswith(("tmp", ".ledger-probe")) or ".staging-" in p.name or p.name.endswith("-shm")]
    assert leftovers == []
    # A checkpoint replaced each epoch is written over in place: none reaches the drive's trash. What does: small
    # files replaced whole (the summaries, the report, the config) and, once a command, the ledger's probe.
    trashed = drive.trashed()
    assert not [line for line in trashed if "checkpoint" in line], trashed
    assert {Path(line.split(" ", 1)[1]).name.split("-")[0] for line in trashed} <= {
        "summary.json", "summary.csv", "report.html", "config.yaml", "timing.json", ".ledger", "ledger.sqlite"}, trashed

    # The report and a push read the run on the drive (a user who cannot write it gets it read-only)
    monkeypatch.setattr(rundir, "_writable", lambda path: False)
    with RunDir.open(run_dir) as opened:
        assert opened.ledger.counts()["done"] == len(JOBS)
    status = forked.run("status", str(run_dir), "--json", cwd=REPO, timeout=120)
    assert status.returncode == 0 and status.stdout.count('"done"') >= len(JOBS), status.stderr[-1500:]
    report = forked.run("report", str(run_dir), "-o", str(tmp_path / "report.html"), cwd=REPO, timeout=120)
    assert report.returncode == 0 and (tmp_path / "report.html").stat().st_size > 10_000, report.stderr[-1500:]
    monkeypatch.undo()
    from trainer.publish.hub import push_run

    with serve_hub(monkeypatch, "hf_drive_test_token", tmp_path / "hf-cache"), \
            RunDir.open(run_dir, config_required=True) as opened:
        pushed = push_run(opened, repo_id="tester/drive", private=True, overwrite_cards=False, only=())
    assert sorted(pushed) == JOBS
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE pushed_repo = 'tester/drive'").fetchone() == (len(JOBS),)


def test_a_ledger_made_in_wal_elsewhere_and_copied_to_a_drive_is_read_and_written_there(drive, tmp_path):
    """A run directory made on a local disk (its ledger in WAL), then copied to Drive: the ledger is switched to the
    rollback journal there, keeps its jobs, and is read (also read-only) and written; on the local disk WAL stays."""
    local = tmp_path / "local-run"
    ledger = Ledger(local)
    assert (ledger.journal, journal_mode(local)) == ("wal", "wal")
    ledger.open_run("fingerprint", {"name": "copied"}, lambda fingerprint, config: None)
    ledger.add_jobs(["BTCUSDT_1h", "ETHUSDT_1h"])
    ledger.close()
    copied = drive.path / "run"
    copied.mkdir()
    (copied / LEDGER).write_bytes((local / LEDGER).read_bytes())
    assert (copied / LEDGER).read_bytes()[18] == 2  # the file says WAL

    assert journal_mode(copied) == "truncate"
    reader = Ledger(copied, read_only=True)  # before any writer: read as it is
    assert [job.name for job in reader.jobs()] == ["BTCUSDT_1h", "ETHUSDT_1h"]
    reader.close()
    ledger = Ledger(copied)
    try:
        assert ledger.journal == "truncate"
        assert ledger.claim(retries=1) == "BTCUSDT_1h"
        reader = Ledger(copied, read_only=True)
        assert reader.counts()["running"] == 1
        reader.close()
    finally:
        ledger.close()
    assert (copied / LEDGER).read_bytes()[18] == 1  # the rollback journal, for good
    assert sorted(p.name for p in copied.iterdir()) == [LEDGER, f"{LEDGER}-journal"]
