"""The loop: claim a job -> data -> features -> windows -> train -> evaluate -> artifacts -> ledger.

One process, one TensorFlow context, one compiled model per shape. Every job's outcome is in the
ledger; running the same command again skips what is done and resumes what was interrupted.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import json
import logging
import math
import os
import shlex
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import keras
import numpy as np
import pandas as pd

from . import artifacts
from .config import HubConfig, RunConfig
from .data import input_digest, load_candles
from .device import cudnn_report, setup
from .errors import JobError, UserError
from .evaluate import choose_shrink, evaluate, predict_fixed_batches
from .features import collinear_columns, load_features
from .files import atomic_write, remove_abandoned_temp_files
from .jobs import Job, make_jobs
from .ledger import JobRecord, Ledger, LostClaim
from .models import output_shapes
from .reporting import JobProgress, console, print_summary_table, summary_line, write_summary
from .training import FitResult, ModelCache, ReportProgress, fit
from .windows import Preprocessing, Windows, make_windows

log = logging.getLogger("cryptotrain")

# `run --push` commits at most once a minute (jobs finished meanwhile go in the next commit): fast jobs
# would otherwise approach the Hub's limit of about 128 commits per hour per repo.
PUSH_EVERY_S = 60.0
BACKUPS = ".backup"  # in the run directory: per job, the epoch backups an interrupted job resumes from


@dataclass
class Outcome:
    done: int
    failed: int
    pending: int  # left unclaimed (none, unless the ledger changed under this process)
    running_elsewhere: int  # claimed by other live processes sharing the run directory: theirs to report
    not_pushed: int  # with --push: finished jobs still not on the Hub at the end

    @property
    def exit_code(self) -> int:
        return 0 if self.failed == self.pending == self.not_pushed == 0 else 1


def run_config(cfg: RunConfig, jobs: list[Job], new_run: bool = False, retries: int = 1,
               push: bool = False, retry_failed: bool = False) -> Outcome:
    if push and not cfg.hub.repo_id:
        raise UserError("--push needs hub.repo_id in the config (or --set hub.repo_id=NS/NAME)")
    device = setup(cfg.train)
    cache = ModelCache()
    cache.model_for(cfg, len(cfg.features.columns))  # a model the config cannot build is bad input: say so
    ledger = _open_run(cfg, new_run)                 # before a run directory records that config
    run_dir = ledger.run_dir
    names = [job.name for job in jobs]
    by_name = {job.name: job for job in jobs}
    ledger.add_jobs([job.name for job in make_jobs(cfg)])
    artifacts.remove_abandoned_staging(run_dir)
    remove_abandoned_temp_files(run_dir)
    _recheck_done_jobs(run_dir, ledger, names)
    _retry_failed_jobs(cfg, ledger, by_name, retries, retry_failed)
    _warn_cudnn(cfg, device)

    last_push = -math.inf
    with JobProgress(total=len(names), done=_count(ledger, names, "done")) as progress, _unfreeze_at_exit():
        while (name := ledger.claim(retries, names)) is not None:
            job = by_name[name]
            progress.start_job(job)
            started = time.perf_counter()
            try:
                with Heartbeat(ledger, name):
                    manifest_sha, summary = train_job(cfg, job, run_dir, cache, progress)
                ledger.mark_done(name, manifest_sha, summary, time.perf_counter() - started)
            except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (errors.Terminated)
                ledger.release(name)
                _print_resume_hint(name)
                raise SystemExit(getattr(stop, "exit_code", 130)) from None
            except UserError:  # bad input found in a job: every job would fail alike, so stop, count nothing
                ledger.release(name)
                raise
            except LostClaim:
                log.warning("%s: another process reclaimed this job; leaving it to that process", name)
                continue
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    _stop_on_full_disk(ledger, name, exc)
                error = _describe_failure(exc, run_dir, name)
                ledger.mark_failed(name, error, time.perf_counter() - started,
                                   inputs=input_digest(cfg, job.symbol, job.timeframe))
                progress.finish_job(job, f"[red]failed[/]: {error}")
                if not isinstance(exc, JobError):
                    cache = ModelCache()  # the model may be in a broken state (e.g. after out-of-memory)
                continue
            progress.finish_job(job, summary_line(summary))
            write_summary(run_dir, ledger)
            if push and time.monotonic() - last_push >= PUSH_EVERY_S:
                _push(run_dir, _unpushed(ledger.jobs(), names, cfg.hub), cfg)
                last_push = time.monotonic()

    if push and (unpushed := _unpushed(ledger.jobs(), names, cfg.hub)):
        _push(run_dir, unpushed, cfg)
    write_summary(run_dir, ledger)
    with contextlib.suppress(OSError):  # no interrupted job left a backup to resume from
        (run_dir / BACKUPS).rmdir()
    records = [j for j in ledger.jobs() if j.name in by_name]
    print_summary_table(records)
    statuses = [j.status for j in records]
    outcome = Outcome(done=statuses.count("done"), failed=statuses.count("failed"), pending=statuses.count("pending"),
                      running_elsewhere=statuses.count("running"),
                      not_pushed=len(_unpushed(records, names, cfg.hub)) if push else 0)
    notes = [f"{outcome.pending} pending"] if outcome.pending else []
    notes += [f"{outcome.running_elsewhere} still running in another process"] if outcome.running_elsewhere else []
    notes += [f"{outcome.not_pushed} not pushed to the Hub"] if outcome.not_pushed else []
    console.print(f"{outcome.done}/{len(records)} jobs done, {outcome.failed} failed"
                  + "".join(f", {note}" for note in notes) + f"; run directory: {run_dir}", soft_wrap=True)
    if outcome.failed:
        console.print("Failed jobs whose candles you fix are retried when you run the same command again; to retry "
                      f"the others as they are, add --retry-failed (or --retries {retries + 1})", soft_wrap=True,
                      markup=False, highlight=False)
    return outcome


def _open_run(cfg: RunConfig, new_run: bool) -> Ledger:
    """The run's ledger; a run directory made with another config is refused, or moved aside with
    --new-run (kept, renamed with a timestamp: nothing already done is lost)."""
    run_dir = cfg.run_dir
    ledger = Ledger(run_dir)
    try:
        ledger.open_run(cfg.fingerprint(), cfg.fingerprint_data())
    except UserError:
        busy = ledger.in_use() if new_run else []
        ledger.close()
        if not new_run:
            raise
        if busy:  # moving it would pull the directory from under that process, which would go on writing there
            raise UserError(f"{run_dir}: --new-run cannot move this run directory: another process is training in it "
                            f"({', '.join(busy)}); stop it first, or give this config another output_dir") from None
        kept = run_dir.with_name(f"{run_dir.name}-{datetime.now():%Y%m%d-%H%M%S}")
        run_dir.rename(kept)
        console.print(f"Config changed: the previous run was moved to {kept}")
        ledger = Ledger(run_dir)
        ledger.open_run(cfg.fingerprint(), cfg.fingerprint_data())
    atomic_write(run_dir / "config.yaml", lambda tmp: artifacts.write_config(tmp, cfg.model_dump(mode="json")))
    return ledger


def _recheck_done_jobs(run_dir: Path, ledger: Ledger, names: list[str]) -> None:
    """A done job whose files no longer match its manifest is trained again, not trusted."""
    for record in ledger.jobs():
        if record.name not in names or record.status != "done":
            continue
        if artifacts.verify(artifacts.jobs_dir(run_dir) / record.name) != record.manifest_sha256:
            log.warning("%s: artifacts missing or modified since the job finished; training it again", record.name)
            ledger.mark_pending(record.name, "artifacts failed verification")


def _retry_failed_jobs(cfg: RunConfig, ledger: Ledger, jobs: dict[str, Job], retries: int,
                       retry_failed: bool) -> None:
    """Failed jobs that used up their retries go back to pending when asked to (--retry-failed), or when
    what they were given has changed since they failed (a fixed or added candle file)."""
    for record in ledger.jobs():
        job = jobs.get(record.name)
        if job is None or record.status != "failed" or record.attempts <= retries:
            continue
        if retry_failed:
            ledger.mark_pending(record.name, f"retried (--retry-failed) after: {record.error}")
        elif record.inputs != input_digest(cfg, job.symbol, job.timeframe):
            log.info("%s: its input changed since it failed; trying it again", record.name)
            ledger.mark_pending(record.name, f"input changed since it failed with: {record.error}")


def _warn_cudnn(cfg: RunConfig, device: dict) -> None:
    blocked = [layer for layer in cudnn_report(cfg) if not layer.eligible]
    for layer in blocked:
        log.warning("model.layers[%d] (%s) cannot use the fused cuDNN kernel on a GPU: %s",
                    layer.index, layer.kind, "; ".join(layer.blockers))


# ----------------------------------------------------------------------------- one job
def train_job(cfg: RunConfig, job: Job, run_dir: Path, cache: ModelCache,
              progress: JobProgress) -> tuple[str, dict]:
    final = artifacts.jobs_dir(run_dir) / job.name
    backup = run_dir / BACKUPS / job.name
    existing = artifacts.verify(final)
    if existing:  # finished by a process that died before recording it, unless it was made by another config
        metrics = json.loads((final / "metrics.json").read_text())
        if metrics.get("fingerprint") == cfg.fingerprint():
            shutil.rmtree(backup, ignore_errors=True)
            return existing, _job_summary(metrics)

    started = time.perf_counter()
    candles = load_candles(cfg, job.symbol, job.timeframe)
    frame, _ = load_features(candles, cfg.features, cfg.cache_path)
    _warn_collinear_once(frame, cfg)
    model = cache.model_for(cfg, len(cfg.features.columns))
    source = candles.attrs["source"]
    with _naming(source):
        windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, output_shapes(model))
    result = fit(model, windows, cfg, backup, callbacks=[ReportProgress(progress)])
    prep = windows.preprocessing
    if cfg.window.shrink:
        prep = choose_shrink(predict_fixed_batches(model, windows.val.x), windows.val, prep)
    outputs = predict_fixed_batches(model, windows.test.x)
    predictions = prep.to_prices(outputs, windows.test.last_close)
    unshrunk = windows.preprocessing.to_prices(outputs, windows.test.last_close)
    release_free_memory()
    with _naming(source):
        scores = evaluate(predictions, windows.test, prep, unshrunk)
    metrics = {
        "job": job.name, "symbol": job.symbol, "timeframe": job.timeframe,
        "run": cfg.name, "fingerprint": cfg.fingerprint(),
        "data": {"source": candles.attrs.get("source"), "synthetic": bool(candles.attrs.get("synthetic")),
                 "first": candles.index[0].isoformat(), "last": candles.index[-1].isoformat(),
                 "rows": len(candles), "gaps": int(candles.attrs.get("gaps", 0))},
        "epochs_run": int(result.history["epoch"].max()), "best_epoch": result.best_epoch,
        "best_val_loss": result.best_val_loss, "seconds": round(time.perf_counter() - started, 2),
        "train_step_seconds": round(result.step_seconds, 3), "rss_mb": current_rss_mb(),
        **scores,
    }
    metrics["test_range"] = [pd.Timestamp(t, tz="UTC").isoformat() for t in windows.test.target_times[[0, -1]]]
    if (bad := artifacts.non_finite(metrics)) is not None:  # a number that means nothing never counts as done
        raise JobError(f"{source}: the test metrics are not finite ({bad[0]} is {bad[1]}); "
                       "check the candles for absurd values")
    stage = artifacts.staging_dir(run_dir, job.name)
    write_job_files(stage, cfg, job, model, prep, windows, result, metrics, predictions)
    manifest_sha = artifacts.commit(stage, final)
    shutil.rmtree(backup, ignore_errors=True)
    return manifest_sha, _job_summary(metrics)


@contextlib.contextmanager
def _naming(source: str):
    """A job error raised inside (a value the windows cannot frame, predictions that are not finite) names the
    candles it comes from."""
    try:
        yield
    except JobError as exc:
        raise JobError(f"{source}: {exc}") from None


def write_job_files(stage: Path, cfg: RunConfig, job: Job, model: keras.Model, prep: Preprocessing,
                    windows: Windows, result: FitResult, metrics: dict, predictions: dict[str, np.ndarray]) -> None:
    model.save(stage / "model.keras")
    preprocessing = {**prep.to_dict(), "symbol": job.symbol, "timeframe": job.timeframe,
                     "indicators": [ind.model_dump(mode="json") for ind in cfg.features.indicators]}
    artifacts.write_json(stage / "preprocessing.json", preprocessing)
    artifacts.write_json(stage / "metrics.json", metrics)
    # Published with the model: where this machine keeps its runs and caches is nobody's business.
    artifacts.write_config(stage / "config.yaml", cfg.model_dump(mode="json", exclude={"output_dir", "cache_dir"}))
    result.history.to_csv(stage / "history.csv", index=False)
    np.savez(stage / "predictions.npz", target_times=windows.test.target_times.astype("datetime64[ns]"),
             **predictions)
    close_head = next((h for h in cfg.heads if "close" in h.columns), None)
    if close_head is not None:
        column = close_head.columns.index("close")
        actual = windows.test.y_raw[close_head.name]
        first_step = (slice(None), 0, column) if actual.ndim == 3 else (slice(None), column)
        artifacts.plot(stage / "plot.png", result.history, windows.test.target_times,
                       predictions[close_head.name][first_step], actual[first_step], job.name)


def _job_summary(metrics: dict) -> dict:
    """The row of the run's summary table: the job's headline test metrics (evaluate.headline) next to
    persistence's."""
    line = metrics["headline"]
    return {
        "job": metrics["job"], "epochs": metrics["epochs_run"], "best_epoch": metrics["best_epoch"],
        "best_val_loss": metrics["best_val_loss"],
        "head": line["head"] + (f".{line['column']}" if line["column"] else ""),
        "test_mae": line["mae"], "persistence_mae": line["persistence_mae"], "skill": line["skill"],
        "direction_accuracy": line["direction_accuracy"], "majority_rate": line["majority_rate"],
        "shrink": line["shrink"],
        "seconds": metrics["seconds"], "train_step_seconds": metrics["train_step_seconds"],
        "rss_mb": metrics["rss_mb"], "synthetic": metrics["data"]["synthetic"],
    }


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps them after each job's arrays are freed, which over
    40 jobs reads like a leak of ~25 MB a job; with this the RSS stays flat (malloc_trim: a no-op off glibc).

    The survivors of each collection (TensorFlow, Keras, the compiled model) live for the whole run; frozen,
    the next job's collection skips them and scans only that job's objects: 5 ms instead of 150 ms.
    ModelCache unfreezes them when it replaces the model."""
    gc.collect()
    gc.freeze()
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


@contextlib.contextmanager
def _unfreeze_at_exit():
    """After the run, the calling process (a notebook, say) gets its usual garbage collection back."""
    try:
        yield
    finally:
        gc.unfreeze()


def current_rss_mb() -> float | None:
    """Resident memory now (not the peak), to show it stays flat across jobs; None off Linux."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        return None
    pages = int(statm.read_text().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


_collinear_warned: set[str] = set()


def _warn_collinear_once(frame, cfg: RunConfig) -> None:
    if cfg.name in _collinear_warned:
        return
    _collinear_warned.add(cfg.name)
    for a, b, corr in collinear_columns(frame, cfg.features.columns):
        log.warning("features %s and %s are collinear (correlation %.5f): one of them adds no information",
                    a, b, corr)


def _describe_failure(exc: Exception, run_dir: Path, name: str) -> str:
    """One line for the ledger and the screen; the traceback of an unexpected error goes to a log file."""
    if isinstance(exc, JobError):
        return str(exc)
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    hint = "; out of memory: lower train.batch_size" if "ResourceExhausted" in type(exc).__name__ else ""
    log_file = run_dir / "logs" / f"{name}.log"
    try:
        log_file.parent.mkdir(exist_ok=True)
        log_file.write_text("".join(traceback.format_exception(exc)))
    except OSError as unwritable:
        return f"{type(exc).__name__}: {first_line}{hint} (no traceback log: {unwritable.strerror})"
    return f"{type(exc).__name__}: {first_line}{hint} (traceback in {log_file})"


def _stop_on_full_disk(ledger: Ledger, name: str, exc: OSError) -> None:
    """No job can be done on a full disk: leave this one resumable (not a failed attempt) and stop the run."""
    with contextlib.suppress(Exception):  # the ledger may not be writable either; the job is then reclaimed
        ledger.release(name)
    where = f" writing {exc.filename}" if exc.filename else ""
    console.print(f"{name}: stopped: no space left on the device{where}; free some space and run the same "
                  "command again (finished epochs are kept)", soft_wrap=True, markup=False, highlight=False)
    raise SystemExit(1)


def _unpushed(records: list[JobRecord], names: list[str], hub: HubConfig) -> list[str]:
    """Done jobs whose artifacts are not yet on the Hub, in the repo the config now names."""
    from .hub import repo_of

    return [r.name for r in records if r.name in names and r.status == "done"
            and not (r.pushed_commit and r.pushed_repo == repo_of(hub, r.name))]


def _push(run_dir: Path, names: list[str], cfg: RunConfig) -> None:
    from huggingface_hub.utils import disable_progress_bars

    from .hub import push_jobs, scrub

    disable_progress_bars()  # tqdm bars would tear through the rich progress display
    try:
        push_jobs(run_dir, names, cfg.hub)
    except Exception as exc:  # whatever went wrong, a failed push never ends the training run
        reason = str(exc) if isinstance(exc, (UserError, JobError)) else f"{type(exc).__name__}: {scrub(str(exc))}"
        console.print(f"push failed for {', '.join(names)}: {reason} (retry with: cryptotrain push {run_dir})",
                      style="red", soft_wrap=True, markup=False, highlight=False)


def _print_resume_hint(name: str) -> None:
    command = shlex.join(["cryptotrain", *sys.argv[1:]])
    console.print(f"\nInterrupted during {name}; finished epochs are saved. Resume with:\n  {command}",
                  soft_wrap=True, markup=False, highlight=False)  # one line, to copy and paste


def _count(ledger: Ledger, names: list[str], status: str) -> int:
    return sum(1 for j in ledger.jobs() if j.name in names and j.status == status)


# ----------------------------------------------------------------------------- liveness
class Heartbeat:
    """While a job runs, tells the ledger from a background thread that this process is alive, so that
    no other process reclaims the job however long one stage takes."""

    def __init__(self, ledger: Ledger, name: str, every: float = 15.0) -> None:
        self.ledger, self.name, self.every = ledger, name, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"heartbeat-{name}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.ledger.heartbeat(self.name)
            except LostClaim:
                return  # the main thread finds out when it records the outcome
