"""The run ledger: one SQLite file per run directory recording the run's config and every job's state.

Several `cryptotrain run` processes (say one per GPU) may share one run directory: each claims the
next job in one write transaction (BEGIN IMMEDIATE), so no job is ever handed out twice. A job left
`running` by a process that died (its pid is gone from this host, or its heartbeat is older than
`stale_after` seconds) is handed out again. WAL journaling lets readers (`cryptotrain status`) run
beside the writers. WAL keeps its index in a shared-memory file that SQLite maps; on a filesystem that offers no
shared writable mmap (Google Drive in Colab, other cloud-drive and network FUSE mounts) the ledger uses the rollback
journal instead, truncated after each transaction rather than deleted (journal_mode=TRUNCATE: a drive keeps deleted
files in its trash): found out by a write to a scratch WAL database in the run directory, once a process, never by
the mount's name (journal_mode()). Several processes still share the run there (SQLite's file locks); a reader waits
for a write in progress (milliseconds) instead of reading beside it.

Times are unix seconds (UTC) as floats. `jobs.attempts` counts the attempts that count towards
--retries; the `attempts` table keeps every attempt, interrupted ones included, as history.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import JobError, UserError
from ..evaluation.results import JobSummary
from ..files import pid_alive

LEDGER = "ledger.sqlite"  # in the run directory
STALE_AFTER = 300.0  # seconds without a heartbeat after which a running job counts as abandoned (run --stale-after)
HEARTBEAT = 15.0  # seconds between a running job's heartbeats (a fifth of a shorter stale limit)
BUSY_TIMEOUT = 60.0  # seconds a write waits for another process's transaction; they last milliseconds
SCHEMA_VERSION = 3  # 2: jobs.inputs; 3: jobs.selected_at
STATUSES = ("pending", "running", "done", "failed")

_SCHEMA = (
    """CREATE TABLE run (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        fingerprint TEXT NOT NULL,
        config_json TEXT NOT NULL,
        created_at REAL NOT NULL)""",
    """CREATE TABLE jobs (
        name TEXT PRIMARY KEY,
        position INTEGER NOT NULL UNIQUE,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'running', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        started_at REAL,
        finished_at REAL,
        seconds REAL,
        manifest_sha256 TEXT,
        summary TEXT,
        pid INTEGER,
        host TEXT,
        heartbeat_at REAL,
        pushed_repo TEXT,
        pushed_commit TEXT,
        pushed_url TEXT,
        pushed_at REAL,
        inputs TEXT,
        selected_at REAL)""",
    """CREATE TABLE attempts (
        job TEXT NOT NULL REFERENCES jobs (name),
        attempt INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        outcome TEXT CHECK (outcome IN ('done', 'failed', 'interrupted', 'lost')),
        error TEXT,
        PRIMARY KEY (job, attempt))""",
)


class LostClaim(JobError):
    """This process no longer holds the job: another process reclaimed it as stale. Stop working on it
    and do not record anything for it."""


@dataclass(frozen=True)
class JobRecord:
    name: str
    status: str
    attempts: int
    error: str | None
    started_at: float | None
    finished_at: float | None
    seconds: float | None
    manifest_sha256: str | None
    summary: JobSummary | None  # a done job's
    pushed_repo: str | None
    pushed_commit: str | None
    pushed_url: str | None
    pushed_at: float | None
    pid: int | None
    host: str | None
    heartbeat_at: float | None
    inputs: str | None  # a digest of what a failed job was given (data.input_digest): changed, it is retried
    selected_at: float | None  # when a run first asked for it (--only, --timeframes); None: never yet

    def to_dict(self) -> dict:
        """The record as plain JSON values (`status --json`)."""
        return {**vars(self), "summary": None if self.summary is None else self.summary.model_dump()}


ROLLBACK_NOTE = ("the run ledger uses SQLite's rollback journal: this filesystem offers no shared memory for WAL (a "
                 "cloud-drive or network mount); several processes may still share the run, and `status` waits for a "
                 "write in progress")


class Ledger:
    """The run directory's LEDGER file, created on first use (opened through run.rundir.RunDir).

    One connection per instance; a lock serialises its use, so a heartbeat thread may share the
    instance with the thread doing the work (hence check_same_thread=False). A job is owned by the
    (pid, host) that claimed it: heartbeat / mark_done / mark_failed / release from anyone else raise
    LostClaim. Use one Ledger per process.
    """

    # (ledger file, job) this process holds, across its Ledger instances: a job recorded as running under
    # this very pid but missing here was left by an earlier process that had the same pid (a restarted
    # container's PID 1, say), not by this one.
    _held: set[tuple[str, str]] = set()

    def __init__(self, run_dir: Path, stale_after: float = STALE_AFTER, read_only: bool = False):
        """`read_only`: only read (a run directory this user cannot write: a colleague's, a read-only mount);
        every write is refused by SQLite."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LEDGER
        self.stale_after = stale_after
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self.journal = "wal"  # or "truncate": the rollback journal (journal_mode)
        if read_only:
            self._conn = _read_only_connection(self.path)
        else:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                check_writable(self.run_dir)  # SQLite would only say "unable to open database file"
            except OSError as exc:  # e.g. output_dir names a file, or a directory this user cannot write
                raise UserError(f"{self.run_dir}: cannot be the run directory ({exc.strerror}); set output_dir "
                                "to a directory you can write") from None
            self.journal = journal_mode(self.run_dir)
            self._conn = _connection(self.path)
        self._conn.row_factory = sqlite3.Row
        try:
            self._check_version() if read_only else self._set_up()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise UserError(f"{self.path}: cannot open the run ledger ({exc})") from exc
        except UserError:
            self._conn.close()
            raise

    def _set_up(self) -> None:
        if self.journal == "wal":
            mode = self._set_journal("WAL")
            if mode != "wal":
                raise UserError(f"{self.path}: SQLite cannot use WAL journaling here (got {mode!r}); "
                                "put the run directory on a local disk")
        elif _header_says_wal(self.path):  # made where WAL works, then copied here: to the rollback journal
            self._leave_wal()
        else:  # a rollback journal's mode is the connection's own
            self._conn.execute("PRAGMA journal_mode=TRUNCATE").fetchone()
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version in (1, 2):  # a ledger of an earlier cryptotrain: the columns it lacks
                if version == 1:
                    conn.execute("ALTER TABLE jobs ADD COLUMN inputs TEXT")
                conn.execute("ALTER TABLE jobs ADD COLUMN selected_at REAL")
                # Which of its jobs a run asked for was not recorded: all of them, as status then showed.
                conn.execute("UPDATE jobs SET selected_at = (SELECT created_at FROM run)")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise UserError(f"{self.path}: ledger schema version {version}, this cryptotrain reads "
                                f"version {SCHEMA_VERSION}; run with --new-run to start over")

    def _check_version(self) -> None:
        """A ledger read as it is: one of an earlier version is upgraded by the next command that may write it."""
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise UserError(f"{self.path}: ledger schema version {version}, this cryptotrain reads version "
                            f"{SCHEMA_VERSION}, and upgrading it needs a run directory this user can write")

    def _set_journal(self, mode: str) -> str:
        """SQLite answers "database is locked" at once, without waiting out the busy timeout, when
        several processes switch a ledger's journal mode together: retry until the timeout instead."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                return self._conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _leave_wal(self) -> None:
        """A ledger in WAL mode on a filesystem where WAL cannot work, to the rollback journal: in exclusive locking
        mode SQLite keeps WAL's index in its own memory, so it can open the file, fold its -wal file in and switch
        (no process can be using WAL here). Its -shm file, which nothing reads then, goes."""
        self._conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        self._set_journal("TRUNCATE")
        self._conn.execute("PRAGMA locking_mode=NORMAL")
        self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the next access drops the lock
        self.path.with_name(self.path.name + "-shm").unlink(missing_ok=True)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE takes the write lock before the first read, so a read-then-write (a claim)
        can never interleave with another process's."""
        with self._lock, self._intact():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _intact(self) -> Iterator[None]:
        """A ledger whose pages are damaged (a disk error, a copy taken mid-write) is found by whichever
        read touches them first: one line saying so and how to recover, whenever that happens."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):  # locked, busy, disk I/O: not damage to the file
                raise
            raise UserError(f"{self.path}: the run ledger is damaged ({exc}); move it aside (mv {self.path} "
                            f"{self.path}.damaged) and run the same command again: finished jobs are recognised "
                            "from their verified files") from None

    # --- the run -----------------------------------------------------------------------------

    def open_run(self, fingerprint: str, config_data: dict, check: Callable[[str, dict], None]) -> None:
        """Record the run's config on first use; afterwards `check(recorded fingerprint, recorded config)`, which
        raises to refuse this config (run.rundir.RunDir.create decides), and the record follows this config. In one
        write transaction: two processes opening one run directory never both record a config."""
        config_json = json.dumps(config_data)
        with self._transaction() as conn:
            row = conn.execute("SELECT fingerprint, config_json FROM run").fetchone()
            if row is None:
                conn.execute("INSERT INTO run (id, fingerprint, config_json, created_at) VALUES (1, ?, ?, ?)",
                             (fingerprint, config_json, time.time()))
                return
            check(row["fingerprint"], json.loads(row["config_json"]))
            conn.execute("UPDATE run SET fingerprint = ?, config_json = ?", (fingerprint, config_json))

    def add_jobs(self, names: list[str], selected: list[str] | None = None) -> None:
        """Add jobs not yet in the ledger, after the existing ones, in the given order. `selected`: those a run
        asks for now (default: all of `names`); the others are the config's, shown apart until one is."""
        with self._transaction() as conn:
            now = time.time()
            last = conn.execute("SELECT COALESCE(MAX(position), -1) FROM jobs").fetchone()[0]
            known = {row[0] for row in conn.execute("SELECT name FROM jobs")}
            new = [name for name in dict.fromkeys(names) if name not in known]
            conn.executemany("INSERT INTO jobs (name, position) VALUES (?, ?)",
                             [(name, last + 1 + i) for i, name in enumerate(new)])
            conn.executemany("UPDATE jobs SET selected_at = ? WHERE name = ? AND selected_at IS NULL",
                             [(now, name) for name in (names if selected is None else selected)])

    # --- one attempt at a job: claim, heartbeat, then done / failed / released ---------------

    def claim(self, retries: int, names: list[str] | None = None) -> str | None:
        """Take the first job, in the order of `names` if given (else the run's), that is pending, failed with
        attempts <= retries, or running but abandoned; mark it running by this process. None when
        there is nothing left to do."""
        with self._transaction() as conn:
            now = time.time()  # after the lock wait: it is when this claim starts
            for name, abandoned in self._claimable(conn, retries, names, now):
                self._start_attempt(conn, name, now, abandoned)
                return name
        return None

    def claimable(self, retries: int, names: list[str] | None = None) -> list[str]:
        """The jobs `claim` would take now, in the order it would take them, none taken (another process may take
        them first): what a driver prepares ahead."""
        with self._transaction() as conn:
            return [name for name, _ in self._claimable(conn, retries, names, time.time())]

    def _claimable(self, conn: sqlite3.Connection, retries: int, names: list[str] | None,
                   now: float) -> Iterator[tuple[str, str | None]]:
        """(name, why its process is presumed dead where it was running) of each job claim may take, in order."""
        rows = conn.execute("SELECT name, status, attempts, pid, host, heartbeat_at FROM jobs "
                            "WHERE status != 'done' ORDER BY position").fetchall()
        if names is not None:
            by_name = {row["name"]: row for row in rows}
            rows = [by_name[name] for name in names if name in by_name]
        for row in rows:
            abandoned = self._abandoned(row, now) if row["status"] == "running" else None
            if row["status"] == "pending" or abandoned or (row["status"] == "failed" and row["attempts"] <= retries):
                yield row["name"], abandoned

    def in_use(self) -> list[str]:
        """The jobs that live processes are running now, as "JOB (pid P on HOST)"."""
        with self._transaction() as conn:
            rows = conn.execute("SELECT name, status, attempts, pid, host, heartbeat_at FROM jobs "
                                "WHERE status = 'running' ORDER BY position").fetchall()
        now = time.time()
        return [f"{row['name']} (pid {row['pid']} on {row['host']})" for row in rows
                if self._abandoned(row, now) is None]

    def _abandoned(self, row: sqlite3.Row, now: float) -> str | None:
        """Why a running job's process is presumed dead, or None while it looks alive."""
        silent = now - row["heartbeat_at"]
        if silent > self.stale_after:
            return f"no heartbeat from pid {row['pid']} on {row['host']} for {silent:.0f} s"
        if row["host"] == self._host:
            if row["pid"] == os.getpid() and self._key(row["name"]) not in Ledger._held:
                return f"an earlier process with pid {row['pid']} on {row['host']} ended without finishing the job"
            if not pid_alive(row["pid"]):
                return f"process {row['pid']} on {row['host']} ended without finishing the job"
        return None

    def _key(self, name: str) -> tuple[str, str]:
        return str(self.path.resolve()), name

    def _start_attempt(self, conn: sqlite3.Connection, name: str, now: float, abandoned: str | None) -> None:
        if abandoned:
            conn.execute("UPDATE attempts SET ended_at = ?, outcome = 'lost', error = ? "
                         "WHERE job = ? AND ended_at IS NULL", (now, abandoned, name))
        pid = os.getpid()
        conn.execute("UPDATE jobs SET status = 'running', attempts = attempts + 1, pid = ?, host = ?, "
                     "started_at = ?, heartbeat_at = ?, finished_at = NULL, seconds = NULL, error = NULL "
                     "WHERE name = ?", (pid, self._host, now, now, name))
        conn.execute("INSERT INTO attempts (job, attempt, pid, host, started_at) "
                     "VALUES (?, (SELECT COUNT(*) + 1 FROM attempts WHERE job = ?), ?, ?, ?)",
                     (name, name, pid, self._host, now))
        Ledger._held.add(self._key(name))

    def keep_alive(self, name: str) -> Heartbeat:
        """Heartbeats for a claimed job from a background thread until stopped (or the `with` block ends), so
        that no other process reclaims it however long one stage takes: every HEARTBEAT seconds, or a fifth of a
        shorter stale limit."""
        return Heartbeat(self, name, min(HEARTBEAT, self.stale_after / 5))

    def heartbeat(self, name: str) -> None:
        """Tell other processes this job's process is alive. Raises LostClaim if it was reclaimed."""
        with self._transaction() as conn:
            self._update_owned(conn, name, "heartbeat_at = :now", now=time.time())

    def mark_done(self, name: str, commit: Callable[[], str], summary: JobSummary, seconds: float) -> str:
        """Put the job's files in place (`commit()`, which returns their manifest's sha256) and record it done, both
        only while this process still holds it: inside the one write transaction that another process needs to
        reclaim the job, so no process takes it over between the check and the commit (a process paused past the
        stale limit and woken finds it taken, and commits nothing: LostClaim). The job's files are new, so no push
        of an earlier attempt's stands for them. The summary is kept as Python's json writes it (pydantic's would
        write a NaN as null). -> the manifest's sha256."""
        done = {}

        def committed() -> dict:
            done["sha"] = commit()
            return {"manifest_sha256": done["sha"]}

        self._end_attempt(name, "done", None,
                          "status = 'done', finished_at = :now, seconds = :seconds, "
                          "manifest_sha256 = :manifest_sha256, summary = :summary, pushed_repo = NULL, "
                          "pushed_commit = NULL, pushed_url = NULL, pushed_at = NULL",
                          seconds=seconds, summary=json.dumps(summary.model_dump()), fenced=committed)
        return done["sha"]

    def mark_failed(self, name: str, error: str, seconds: float, inputs: str | None = None) -> None:
        """`inputs`: a digest of what the job was given, so that a later run can tell it was fixed."""
        self._end_attempt(name, "failed", error,
                          "status = 'failed', finished_at = :now, seconds = :seconds, error = :error, "
                          "inputs = :inputs", seconds=seconds, inputs=inputs)

    def release(self, name: str) -> None:
        """Interrupted (Ctrl-C): back to pending; this attempt does not count towards --retries."""
        self._end_attempt(name, "interrupted", None, "status = 'pending', attempts = attempts - 1")

    def _end_attempt(self, name: str, outcome: str, error: str | None, assignments: str,
                     fenced: Callable[[], dict] = dict, **values) -> None:
        """End this process's attempt at a job it holds; `fenced()`, called once the hold is checked and before
        anything is written, adds the values it returns."""
        try:
            with self._transaction() as conn:
                now = time.time()
                self._check_owned(conn, name)
                values |= fenced()
                self._update_owned(conn, name, assignments, now=now, error=error, **values)
                conn.execute("UPDATE attempts SET ended_at = ?, outcome = ?, error = ? "
                             "WHERE job = ? AND ended_at IS NULL", (now, outcome, error, name))
        finally:  # this process has stopped working on it, even if that could not be recorded (a full disk):
            Ledger._held.discard(self._key(name))  # a later claim in this process may reclaim it

    def _check_owned(self, conn: sqlite3.Connection, name: str) -> None:
        """LostClaim unless this process holds the job (inside a write transaction: it still does at its end)."""
        held = conn.execute("SELECT 1 FROM jobs WHERE name = ? AND status = 'running' AND pid = ? AND host = ?",
                            (name, os.getpid(), self._host)).fetchone()
        if held is None:
            Ledger._held.discard(self._key(name))
            raise LostClaim(f"{name}: no longer held by this process (pid {os.getpid()} on {self._host}); "
                            "another process took it over")

    def _update_owned(self, conn: sqlite3.Connection, name: str, assignments: str, **values) -> None:
        """Apply `assignments` to the job only while this process holds it."""
        self._check_owned(conn, name)
        conn.execute(f"UPDATE jobs SET {assignments} WHERE name = :name", {"name": name, **values})

    # --- after the fact ----------------------------------------------------------------------

    def mark_pending(self, reasons: dict[str, str]) -> None:
        """Send jobs that are not running back to pending with fresh retries, in one transaction (all or none),
        e.g. a done job whose artifacts no longer match their manifest; each job's reason shows as its error."""
        with self._transaction() as conn:
            for name, reason in reasons.items():
                if _status(conn, name) == "running":
                    raise JobError(f"{name}: is running; a running job cannot be sent back to pending")
                conn.execute("UPDATE jobs SET status = 'pending', attempts = 0, error = ?, finished_at = NULL, "
                             "seconds = NULL, manifest_sha256 = NULL, summary = NULL WHERE name = ?",
                             (reason, name))

    def record_push(self, name: str, repo_id: str, commit_sha: str, url: str) -> None:
        with self._transaction() as conn:
            _status(conn, name)
            conn.execute("UPDATE jobs SET pushed_repo = ?, pushed_commit = ?, pushed_url = ?, pushed_at = ? "
                         "WHERE name = ?", (repo_id, commit_sha, url, time.time(), name))

    # --- reading -----------------------------------------------------------------------------

    def jobs(self) -> list[JobRecord]:
        with self._lock, self._intact():
            rows = self._conn.execute("SELECT * FROM jobs ORDER BY position").fetchall()
        return [_record(row) for row in rows]

    def counts(self) -> dict[str, int]:
        """Jobs per status; every status is present, zero included."""
        with self._lock, self._intact():
            rows = self._conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {**dict.fromkeys(STATUSES, 0), **{status: count for status, count in rows}}


def check_writable(directory: Path) -> None:
    """Raises OSError (Permission denied, Read-only file system) where this user cannot make a file: asked of the
    filesystem, making none (on a cloud drive a file made and deleted goes to its trash)."""
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(directory))
    if not os.access(directory, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(directory))


_journals: dict[Path, str] = {}  # directory -> its journal_mode, as this process found it


def journal_mode(directory: Path) -> str:
    """"wal" where SQLite's WAL works in `directory`, else "truncate" (the rollback journal): found out by a write to
    a scratch WAL database there, once a process. On a filesystem without shared writable mmap, `PRAGMA
    journal_mode=WAL` may answer "wal" and the first write fail ("disk I/O error": SQLite cannot map the -shm index);
    trying it on the ledger itself could switch a ledger that other processes use in the rollback journal there."""
    directory = directory.resolve()
    if directory not in _journals:
        probe = directory / f".ledger-probe-{os.getpid()}-{threading.get_ident()}.sqlite"
        conn = _connection(probe)
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            conn.execute("CREATE TABLE probe (x)")
            _journals[directory] = "wal"
        except sqlite3.OperationalError as exc:
            if not (getattr(exc, "sqlite_errorname", "").startswith("SQLITE_IOERR") or "disk I/O" in str(exc)):
                raise
            _journals[directory] = "truncate"
        finally:
            conn.close()
            for suffix in ("", "-wal", "-shm", "-journal"):
                probe.with_name(probe.name + suffix).unlink(missing_ok=True)
    return _journals[directory]


def _connection(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)


def _header_says_wal(path: Path) -> bool:
    """Whether the database file at `path` is in WAL mode (its header's read and write versions are 2)."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except FileNotFoundError:
        return False
    return len(header) == 20 and header[18] == 2


def _read_only_connection(path: Path) -> sqlite3.Connection:
    """A connection that only reads the ledger, which is there. SQLite reads a WAL database by its -shm file,
    which it makes when missing: where no -wal file is left (no run writes it now), the file is read as immutable
    instead, which needs none. A ledger in the rollback journal is read under SQLite's file locks, as is."""
    immutable = "" if not _header_says_wal(path) or path.with_name(path.name + "-wal").exists() else "&immutable=1"
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=BUSY_TIMEOUT,
                           isolation_level=None, check_same_thread=False)


def _record(row: sqlite3.Row) -> JobRecord:
    values = {field.name: row[field.name] for field in fields(JobRecord)}
    summary = None if row["summary"] is None else JobSummary.model_validate_json(row["summary"])
    return JobRecord(**{**values, "summary": summary})


def _status(conn: sqlite3.Connection, name: str) -> str:
    row = conn.execute("SELECT status FROM jobs WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise JobError(f"{name}: not a job of this run")
    return row[0]


class Heartbeat:
    """Ledger.keep_alive's thread: a heartbeat every `every` seconds until stop(); a claim lost meanwhile ends it
    (the main thread finds out when it records the job's outcome)."""

    def __init__(self, ledger: Ledger, name: str, every: float) -> None:
        self.ledger, self.name, self.every = ledger, name, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"heartbeat-{name}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.ledger.heartbeat(self.name)
            except LostClaim:
                return
