"""The driver: claim a job -> prepare its data (pipeline.prepare) -> hand it to an executor (this process, or
Ray workers) -> commit its artifacts -> record it in the ledger.

The driver alone touches the run directory and its ledger. Locally: one process, one TensorFlow context, one
compiled model per shape. Every job's outcome is in the ledger; running the same command again skips what is
done and resumes what was interrupted.
"""
from __future__ import annotations

import contextlib
import csv
import errno
import functools
import io
import json
import logging
import math
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

from ..config import ExecutorConfig, RunConfig
from ..data import input_digest
from ..errors import Interrupted, JobError, RunStopped, UserError, first_line, out_of_memory
from ..evaluation.results import JobMetrics, JobSummary
from ..files import atomic_write, remove_abandoned_temp_files
from ..model.resume import budget_plan
from . import artifacts
from .executors import open_executor
from .jobdir import FORMAT, JobDir, JobFileError
from .jobs import Job, make_jobs
from .ledger import STALE_AFTER, Heartbeat, JobRecord, Ledger, LostClaim
from .pipeline import Events, JobOutput, Prepared, prepare
from .rundir import TIMING, DeviceTime, RunDir
from .trainers import Executor

log = logging.getLogger(__name__)

# `run --push`: the done jobs among the names not on the Hub yet pushed, a failure said through the note (never
# raised); returns how many are still not there.
Push = Callable[[RunDir, list[str], Callable[..., None]], int]
# `run --push` commits at most once a minute (jobs finished meanwhile go in the next commit): fast jobs
# would otherwise approach the Hub's limit of about 128 commits per hour per repo.
PUSH_EVERY_S = 60.0
# In the run directory: per job, the checkpoint of its last epoch, which an interrupted job resumes from and a
# finished job's training goes on from when the config allows it more epochs or patience (budget_plan).
BACKUPS = ".backup"


@dataclass
class Outcome:
    run_dir: Path
    records: list[JobRecord]  # the ledger's records of the jobs asked for, after the run
    retries: int
    not_pushed: int  # with --push: finished jobs still not on the Hub at the end
    device: DeviceTime | None = None  # where this process's time went (timing.json)

    def count(self, status: str) -> int:
        return sum(1 for record in self.records if record.status == status)

    @property
    def complete(self) -> bool:
        """Every job asked for is done (or running in another process sharing the run directory), and pushed."""
        return self.count("failed") == self.count("pending") == self.not_pushed == 0


def run_config(cfg: RunConfig, jobs: list[Job], display: Display | None = None, new_run: bool = False,
               retries: int = 1, push: Push | None = None, retry_failed: bool = False,
               executor: ExecutorConfig | None = None, stale_after: float = STALE_AFTER,
               host_workers: int | str = "auto", *, engine: str) -> Outcome:
    """Train the jobs in this process, or (executor.kind "ray") on Ray workers; this process is the driver
    either way: it alone touches the run directory and its ledger. What happens goes to `display` (the CLI's
    report.console.JobProgress; by default nowhere). `push` (`run --push`: publish.hub.push_pending) publishes the
    jobs done, every PUSH_EVERY_S and at the end. `stale_after`: seconds without a heartbeat after which another
    process sharing the run directory takes a running job over. `host_workers`: processes for the jobs' host work
    (run.host). `engine`: what this process trains on, chosen before Keras was imported (engine.engine_for: what
    `cryptotrain run`'s set-up chose, process.set_up_run). Interrupted (Ctrl-C, SIGTERM): raises
    errors.Interrupted once the jobs under way are released to resume."""
    if push is not None and not cfg.hub.repo_id:
        raise UserError("--push needs hub.repo_id in the config (or --set hub.repo_id=NS/NAME)")
    display = display or Display()
    with contextlib.ExitStack() as opened:
        # A model the config cannot build, or a cluster that is not there, is said before a run directory records it.
        with open_executor(cfg, executor or cfg.executor, len(jobs), engine, display.note, host_workers) as workers:
            run = opened.enter_context(RunDir.create(cfg, new_run, display.note, stale_after))
            run_dir, ledger = run.path, run.ledger
            names = [job.name for job in jobs]
            by_name = {job.name: job for job in jobs}
            ledger.add_jobs([job.name for job in make_jobs(cfg)], selected=names)
            artifacts.remove_abandoned_staging(run_dir)
            for directory in (run_dir, cfg.cache_path):  # what writes cut short by a kill left (checkpoints, entries)
                remove_abandoned_temp_files(directory)
            _reconcile(cfg, ledger, by_name, retries, retry_failed)

            driver = _Driver(run, jobs, retries, display, push, workers)
            with display.running(total=len(names), done=_count(ledger, names, "done")):
                try:
                    while True:
                        for job, prepared in driver.take(workers.capacity - len(driver.training)):
                            workers.submit(job, prepared, driver.backup(job))
                        driver.prepare_ahead()  # the next jobs, on the host while these train
                        if driver.training:
                            driver.wait(display)
                        elif not driver.claimable():
                            break
                except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (errors.Terminated)
                    driver.release_all()
                    raise Interrupted(sorted(driver.stopped), getattr(stop, "exit_code", 130)) from None
                except BaseException:
                    driver.release_all()
                    raise
            if (device := driver.device_time()) is not None:
                atomic_write(run_dir / TIMING, lambda tmp: tmp.write_text(device.model_dump_json(indent=1)))

        not_pushed = push(run, names, display.note) if push else 0
        write_summary(run_dir, ledger)
        records = [j for j in ledger.jobs() if j.name in by_name]
        return Outcome(run_dir=run_dir, records=records, retries=retries, not_pushed=not_pushed, device=device)


class Display:
    """Where a run's events go (pipeline.Events and the rest): nowhere. report.console.JobProgress shows them."""

    @contextlib.contextmanager
    def running(self, total: int, done: int) -> Iterator[None]:
        yield

    def start_job(self, job: Job) -> None: ...

    def finish_job(self, job: Job, line: str, failed: bool = False) -> None: ...

    def job_done(self, job: Job, summary: JobSummary) -> None: ...

    def training_started(self, job: str, epochs: int, done: int) -> None: ...

    def epoch_ended(self, job: str, epoch: int, logs: dict) -> None: ...

    def note(self, line: str, style: str | None = None) -> None: ...


class _Driver:
    """The jobs this process prepares on the host, claims and hands to the workers, and what becomes of each: its
    artifacts committed and the ledger told, or its failure recorded.

    A job is prepared before it is claimed (prepare_ahead: the next ones this process could claim, while the workers
    train), and claimed when the workers have room for it: a process sharing the run directory is never kept from a
    job this one merely prepares (it takes it, and what this one prepared of it is let go). Jobs trained together
    (packed, on Ray workers) are claimed in groups of like lengths (like_lengths) among those prepared."""

    def __init__(self, run: RunDir, jobs: list[Job], retries: int, progress: Display, push: Push | None,
                 workers: Executor) -> None:
        self.run, self.jobs, self.retries = run, {job.name: job for job in jobs}, retries
        self.progress, self.push, self.workers = progress, push, workers
        self.names = list(self.jobs)
        self.cfg, self.ledger, self.run_dir = run.config, run.ledger, run.path
        self.in_flight: dict[str, tuple[float, Heartbeat]] = {}  # every job claimed and not finished
        self.preparing: dict[str, Future] = {}  # each job's preparation on the host, claimed or not
        self.training: set[str] = set()  # handed to the workers
        # prepared at most: the jobs the workers take and, where the host has workers of its own, as many again
        self.ahead = workers.capacity * (1 if workers.host.workers == 1 else 2)
        self.stopped: set[str] = set()  # jobs released by an interrupt, for the resume hint
        self.last_push = -math.inf
        self.features_checked = False  # for collinear feature pairs, once a run
        self.started, self.training_before = time.perf_counter(), workers.training_seconds  # None: on Ray workers
        self.waited = {"preparing": 0.0, "evaluating": 0.0, "writing": 0.0}

    def backup(self, job: Job) -> Path:
        return self.run_dir / BACKUPS / job.name

    def claimable(self) -> list[str]:
        return self.ledger.claimable(self.retries, [name for name in self.names if name not in self.in_flight])

    def prepare_ahead(self) -> list[str]:
        """The next jobs this process could claim, as many as it prepares ahead beside those training, each one's
        preparation started on the host (inline: done now, while nothing trains); a preparation of a job another
        process took since is let go."""
        began = time.perf_counter()
        following = self.claimable()[:max(0, self.ahead - len(self.training))]
        for name in [name for name in self.preparing if name not in following and name not in self.in_flight]:
            self.preparing.pop(name).cancel()
        for name in following:
            if name not in self.preparing:
                self.preparing[name] = self.workers.host.submit(prepare, self.cfg, self.jobs[name],
                                                                self.workers.target_shapes)
        self.waited["preparing"] += time.perf_counter() - began
        return following

    def take(self, room: int) -> list[tuple[Job, Prepared]]:
        """Up to `room` jobs claimed for the workers, prepared, of like lengths among those prepared ahead (for one,
        the first once it is prepared; for more, once every one prepared ahead is, to choose among them); meanwhile
        a device with nothing to train waits. A job whose preparation failed (its candles could not be read, say) is
        claimed and finished with that failure; one finished already (by a process that died before recording it),
        finished as it is."""
        if room <= 0:
            return []
        following = self.prepare_ahead()
        began = time.perf_counter()
        wait([self.preparing[name] for name in following[:1 if room == 1 else None]])
        self.waited["preparing"] += time.perf_counter() - began
        done = [name for name in following if self.preparing[name].done()]
        failed = [name for name in done if self.preparing[name].exception() is not None]
        prepared = {name: self.preparing[name].result() for name in done if name not in failed}
        chosen = [list(prepared)[i] for i in like_lengths([len(p.windows.train) for p in prepared.values()], room)]
        taken = []
        for name in [*failed, *chosen]:
            if self.ledger.claim(self.retries, [name]) is None:  # another process took it meanwhile
                self.preparing.pop(name).cancel()
                continue
            job, future = self.jobs[name], self.preparing.pop(name)
            if self.start(job):
                if name in failed:
                    self.finish(job, future.exception())
                    continue
                if not self.features_checked:  # the first job's features stand for the run's
                    self.features_checked = True
                    for a, b, corr in prepared[name].collinear:
                        log.warning("features %s and %s are collinear (correlation %.5f): one of them adds no "
                                    "information", a, b, corr)
                taken.append((job, prepared[name]))
                self.training.add(name)
        return taken

    def start(self, job: Job) -> bool:
        """Claimed: whether it is to train; not if done already (finished by a process that died before recording
        it), which is finished here."""
        self.progress.start_job(job)
        heartbeat = self.ledger.keep_alive(job.name)
        self.in_flight[job.name] = (time.perf_counter(), heartbeat)
        try:
            finished = _finished_already(self.cfg, job, self.run_dir, self.backup(job), self.progress)
        except Exception as exc:  # its directory could not be read, say
            self.finish(job, exc)
            return False
        if finished is not None:
            self.finish(job, finished)
            return False
        return True

    def wait(self, events: Events) -> None:
        """The workers' wait (training progress to `events`), then each job it handed back finished with its
        outcome; what was not training in it (evaluation) and the writing after it are what the device waited for."""
        began, training = time.perf_counter(), self.workers.training_seconds
        outcomes = self.workers.wait(events)
        if training is not None:
            self.waited["evaluating"] += time.perf_counter() - began - (self.workers.training_seconds - training)
        for job, outcome in outcomes:
            began = time.perf_counter()
            self.training.discard(job.name)
            self.finish(job, outcome)
            self.waited["writing"] += time.perf_counter() - began

    def device_time(self) -> DeviceTime | None:
        """Where the time went, where the device is this process's (None: Ray's workers')."""
        if self.training_before is None:
            return None
        return DeviceTime(host_workers=self.workers.host.workers, seconds=round(time.perf_counter() - self.started, 2),
                          training=round(self.workers.training_seconds - self.training_before, 2),
                          **{what: round(waited, 2) for what, waited in self.waited.items()})

    def finish(self, job: Job, outcome: JobOutput | tuple[str, JobMetrics] | BaseException) -> None:
        name = job.name
        started, heartbeat = self.in_flight.pop(name)
        heartbeat.stop()
        seconds = time.perf_counter() - started
        stage = None  # this process's files of the job, sealed, until committed
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            if isinstance(outcome, tuple):  # its directory was committed already (_finished_already)
                manifest_sha, metrics = outcome
            else:
                metrics = outcome.metrics
                stage, manifest_sha = artifacts.stage_job(self.run_dir, name, outcome.write)
            summary = metrics.summary()
            self.ledger.mark_done(name, functools.partial(self._commit, name, stage, manifest_sha), summary, seconds)
        except UserError:  # bad input found in a job: every job would fail alike, so stop, count nothing
            self._release(name)
            raise
        except LostClaim:  # another process took it over while this one was silent (paused, say): its files stay
            log.warning("%s: another process took this job over while this one went silent (no heartbeat for %.0f s);"
                        " this one's files were discarded, that one's kept", name, self.ledger.stale_after)
            return
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                self._release(name)
                raise _full_disk(name, exc) from None
            error = _describe_failure(exc, self.run_dir, name)
            self.ledger.mark_failed(name, error, seconds, inputs=input_digest(self.cfg, job.symbol, job.timeframe))
            self.progress.finish_job(job, error, failed=True)
            return
        finally:
            if stage is not None:  # committed: renamed away already; not committed (a claim lost, a failure): gone
                shutil.rmtree(stage, ignore_errors=True)
        self.progress.job_done(job, summary)
        write_summary(self.run_dir, self.ledger)
        if self.push and time.monotonic() - self.last_push >= PUSH_EVERY_S:
            self.push(self.run, self.names, self.progress.note)
            self.last_push = time.monotonic()

    def _commit(self, name: str, stage: Path | None, manifest_sha: str) -> str:
        """Put the job's sealed staging directory in place as jobs/JOB (none: it is there already); called by the
        ledger while it confirms this process holds the job (Ledger.mark_done)."""
        if stage is not None:
            artifacts.commit(stage, artifacts.jobs_dir(self.run_dir) / name)
        return manifest_sha

    def release_all(self) -> None:
        """Interrupted: the jobs in hand go back to pending (not a failed attempt), to resume from their last
        checkpointed epoch; their preparation, where it has not started, is not."""
        for future in self.preparing.values():
            future.cancel()
        self.preparing = {}
        for name in list(self.in_flight):
            _, heartbeat = self.in_flight.pop(name)
            heartbeat.stop()
            self._release(name)
            self.stopped.add(name)

    def _release(self, name: str) -> None:
        with contextlib.suppress(Exception):  # the ledger may not be writable (a full disk): the job is reclaimed
            self.ledger.release(name)


def like_lengths(lengths: list[int], n: int) -> list[int]:
    """Which `n` of the jobs of train windows `lengths` to train together, by position: of the jobs sorted by length,
    the n in a row that leave the fewest lanes of their pack idle (each epoch runs as many steps as its longest job:
    packing.idle_share), the earliest claimed where that is a tie; all of them where there are n or fewer."""
    if len(lengths) <= n:
        return list(range(len(lengths)))
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))

    def idle(start: int) -> tuple[float, int]:
        group = [lengths[i] for i in order[start:start + n]]
        return 1 - sum(group) / (n * max(max(group), 1)), min(order[start:start + n])
    best = min(range(len(order) - n + 1), key=idle)
    return sorted(order[best:best + n])


def _finished_already(cfg: RunConfig, job: Job, run_dir: Path, backup: Path,
                      progress: Display) -> tuple[str, JobMetrics] | None:
    """(manifest sha256, metrics) of a job directory this config finished (a process that died before the
    ledger knew, or a ledger moved aside), unless the training budget now asks for more or less (budget_plan:
    its checkpoint is then kept to go on from, or cleared)."""
    final = JobDir(artifacts.jobs_dir(run_dir) / job.name)
    existing = final.verify()
    if not existing or final.format < FORMAT:  # an earlier cryptotrain's: trained again (a later one's is refused)
        return None
    try:
        metrics = final.metrics()
    except JobFileError:  # not a metrics.json this version can read: trained again, not trusted
        return None
    if metrics.fingerprint != cfg.fingerprint():
        return None
    plan = budget_plan(cfg.train, final.config().train, final.history, backup)
    if plan is None or plan.action == "keep":
        return existing, metrics
    progress.note(f"{job.name}: {plan.reason}")
    if plan.action == "retrain":  # extend: training goes on from the checkpoint of its last epoch
        shutil.rmtree(backup, ignore_errors=True)
    return None


def _reconcile(cfg: RunConfig, ledger: Ledger, jobs: dict[str, Job], retries: int, retry_failed: bool) -> None:
    """One pass over the run's jobs before any is claimed: each of `jobs` that must train again goes back to
    pending, all in one transaction (_why_again says which and why)."""
    reasons = {record.name: reason for record in ledger.jobs() if record.name in jobs
               and (reason := _why_again(cfg, record, jobs[record.name], retries, retry_failed))}
    ledger.mark_pending(reasons)


def _why_again(cfg: RunConfig, record: JobRecord, job: Job, retries: int, retry_failed: bool) -> str | None:
    """Why a job must train again, or None:
    - a done job whose files no longer match its manifest: trained again, not trusted;
    - a done job written by an earlier cryptotrain (an older jobdir.FORMAT, which this version does not read);
    - a done job that the training budget (BUDGET_KEYS) would now have trained otherwise (resume.budget_plan:
      train_job extends or retrains it);
    - a failed job that used up its retries, when asked to (--retry-failed) or when what it was given has
      changed since it failed (a fixed or added candle file)."""
    if record.status == "done":
        job_dir = JobDir(artifacts.jobs_dir(cfg.run_dir) / record.name)
        if job_dir.verify() != record.manifest_sha256:
            log.warning("%s: artifacts missing or modified since the job finished; training it again", record.name)
            return "artifacts failed verification"
        if job_dir.format < FORMAT:
            log.warning("%s: written by an earlier cryptotrain (job directory format %d); training it again",
                        record.name, job_dir.format)
            return f"written by an earlier cryptotrain (format {job_dir.format})"
        plan = budget_plan(cfg.train, job_dir.config().train, job_dir.history, cfg.run_dir / BACKUPS / record.name)
        return plan.reason if plan is not None and plan.action != "keep" else None
    if record.status != "failed" or record.attempts <= retries:
        return None
    if retry_failed:
        return f"retried (--retry-failed) after: {record.error}"
    if record.inputs != input_digest(cfg, job.symbol, job.timeframe):
        log.info("%s: its input changed since it failed; trying it again", record.name)
        return f"input changed since it failed with: {record.error}"
    return None


def _describe_failure(exc: Exception, run_dir: Path, name: str) -> str:
    """One line for the ledger and the screen; the traceback of an unexpected error goes to a log file."""
    if isinstance(exc, JobError):
        return str(exc)
    line = first_line(exc, limit=300)
    hint = "; out of memory: lower train.batch_size" if out_of_memory(exc) else ""
    log_file = run_dir / "logs" / f"{name}.log"
    try:
        log_file.parent.mkdir(exist_ok=True)
        log_file.write_text("".join(traceback.format_exception(exc)))
    except OSError as unwritable:
        return f"{type(exc).__name__}: {line}{hint} (no traceback log: {unwritable.strerror})"
    return f"{type(exc).__name__}: {line}{hint} (traceback in {log_file})"


def _full_disk(name: str, exc: OSError) -> RunStopped:
    """No job can be done on a full disk: the job is left resumable (released, not a failed attempt), and the
    run stops."""
    where = f" writing {exc.filename}" if exc.filename else ""
    return RunStopped(f"{name}: stopped: no space left on the device{where}; free some space and run the same "
                      "command again (finished epochs are kept)")


def _count(ledger: Ledger, names: list[str], status: str) -> int:
    return sum(1 for j in ledger.jobs() if j.name in names and j.status == status)


# ----------------------------------------------------------------------------- summary.json, summary.csv
SUMMARY_COLUMNS = ["job", "epochs", "best_epoch", "best_val_loss", "head", "test_mae", "persistence_mae", "skill",
                   "shrink", "direction_accuracy", "majority_rate", "high_skill_har", "low_skill_har",
                   "range_skill_har", "network_weight", "interval_coverage", "seconds", "train_step_seconds", "rss_mb",
                   "synthetic"]


def write_summary(run_dir: Path, ledger: Ledger) -> None:
    # The ledger's seconds cover the whole job, artifacts included (metrics.json's stop before them).
    rows = [{**j.summary.model_dump(), "seconds": round(j.seconds, 2)}
            for j in ledger.jobs() if j.status == "done" and j.summary]
    atomic_write(run_dir / "summary.json", lambda tmp: tmp.write_text(json.dumps(rows, indent=1, allow_nan=False)))
    table = io.StringIO()
    writer = csv.DictWriter(table, SUMMARY_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)  # a value a job has none of (None, or absent) is an empty field
    atomic_write(run_dir / "summary.csv", lambda tmp: tmp.write_text(table.getvalue()))
