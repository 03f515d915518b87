"""One job, top to bottom: candles -> features -> windows and baselines (prepare) -> train -> evaluate -> the job's
files (train_one: TensorFlow's training.fit, then `evaluated`). A packed run (packing.PackExecutor) trains K jobs
together on JAX between `prepare` and `evaluated`, the same two steps.

`prepare` and `evaluated` are the job's host work: numpy, pandas and ta, no Keras, run in a host worker (run.host:
a process of their own, one per core, beside the device) or inline. `prepare` runs where the data is (the driver,
with its feature cache); training runs anywhere - in the driver's process for a local run, in a Ray worker for a
distributed one. None of them prints or touches the run directory: training progress goes to an Events object, the
outcome comes back as a JobOutput (its metrics and its files, in memory), which the driver writes straight into the
staging directory it commits (artifacts.commit_job), and the only path training writes to is the backup directory
it is given (the job's epoch checkpoints).

Imports no Keras at import time: a host worker imports this module.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pandas as pd

from ..config import RunConfig
from ..data.features import collinear_columns, implausible_jump, job_features
from ..data.market import Reference
from ..data.windows import Windows, make_windows
from ..errors import JobError
from ..evaluation.baselines import Baselines, cached_baselines
from ..evaluation.evaluate import candle_head, candle_scores, choose_shrink, evaluate
from ..evaluation.results import DataInfo, JobMetrics, Timing
from ..model.trained import Diverged, Events, FitResult, Forecasts
from .jobdir import JobDir
from .jobs import Job

if TYPE_CHECKING:
    import keras

    from ..model.training import ModelCache


class Host(Protocol):
    """Where a job's host work runs (run.host.HostPool: in a worker process of its own, or inline)."""

    def submit(self, fn, /, *args) -> Future: ...


@dataclass(frozen=True)
class Prepared:
    """A job's input, made where the data is (prepare): its windows as training takes them and the baselines of the
    size of the coming candles fitted on its train split (None without a candle head; held from its validation
    split on, what its evaluation reads), where its candles came from (metrics.json's "data"), the reference series
    of its market input (preprocessing.json's "market"), and what its feature rows say of themselves: the
    implausible price in its candles, where there is one (named_after), and its collinear feature columns (the run
    warns of its first job's). Not its feature rows: what crosses between the host's workers and the device's
    process is what they need of them (run.host)."""
    data: DataInfo
    windows: Windows
    fitted: Baselines | None
    market: tuple[Reference, ...] = ()
    implausible: str | None = None  # features.implausible_jump of its rows
    collinear: tuple[tuple[str, str, float], ...] = ()  # features.collinear_columns of its rows
    seconds: float = 0.0  # candles -> features (metrics.json's timing.prepare)
    framing: float = 0.0  # features -> windows and baselines (timing.windows)


class JobOutput(Protocol):
    """What an executor hands back for a job that trained: its metrics, and its files, which `write` puts into
    the directory the driver commits (every file of the job directory but its manifest, which commit adds)."""
    metrics: JobMetrics  # what its metrics.json holds

    def write(self, directory: Path) -> None: ...


@dataclass(frozen=True)
class Evaluated:
    """A trained job judged (`evaluated`): its metrics, and every file of its directory but the model and the
    manifest, as bytes (JobDir.files): what a host worker hands back."""
    metrics: JobMetrics
    files: dict[str, bytes]


@dataclass(frozen=True, eq=False)
class JobResult:
    """A job trained here: its evaluation, and its model (the ModelCache's, or a pack's with the job's state in it:
    write the result before that model changes)."""
    evaluated: Evaluated
    model: keras.Model
    training_seconds: float = 0.0  # its training and forecasts (train_one; a packed job's are its pack's)

    @property
    def metrics(self) -> JobMetrics:
        return self.evaluated.metrics

    def write(self, directory: Path) -> None:
        JobDir(directory).write(self.model, self.evaluated.files)


def tensorboard_dir(run_dir: Path, job_name: str) -> Path:
    return run_dir / "tensorboard" / job_name


def prepare(cfg: RunConfig, job: Job, target_shapes: dict[str, tuple[int, ...]]) -> Prepared:
    """A job's candles -> its features -> its windows (each head's targets shaped `target_shapes`: the model's,
    models.output_shapes) and the baselines fitted on its train split (job_windows)."""
    started = time.perf_counter()
    features = job_features(cfg, job.symbol, job.timeframe)
    candles, frame = features.candles, features.frame
    data = DataInfo(source=candles.attrs["source"], synthetic=bool(candles.attrs.get("synthetic")),
                    first=candles.index[0].isoformat(), last=candles.index[-1].isoformat(), rows=len(candles),
                    gaps=int(candles.attrs.get("gaps", 0)))
    featured, implausible = time.perf_counter(), implausible_jump(frame)
    with named_after(implausible, data):  # what fails here (a value the windows cannot frame) names the candles
        windows, fitted = job_windows(cfg, job.timeframe, frame, target_shapes)
    return Prepared(data, windows, None if fitted is None else fitted.since(windows.val.first_target_rows[0]),
                    features.market, implausible, tuple(collinear_columns(frame, cfg.features.columns)),
                    featured - started, time.perf_counter() - featured)


def train_one(cfg: RunConfig, job: Job, prepared: Prepared, backup_dir: Path, cache: ModelCache, events: Events,
              host: Host, callbacks: tuple[keras.callbacks.Callback, ...] = (),
              tensorboard: Path | None = None) -> JobResult:
    """Train one job, then evaluate it on `host`. `backup_dir` holds its epoch checkpoints: an interrupted or extended
    job goes on from the last one there. With train.tensorboard, the job's epoch logs go into `tensorboard`
    (sequence.JobTraining). JobError: the job failed for its own reasons (a non-finite loss, say)."""
    from ..model.models import forecasts
    from ..model.training import fit  # TensorFlow's: a packed run (packing.PackExecutor) never imports it

    started = time.perf_counter()
    model = cache.model_for(cfg.network, cfg.train)
    windows = prepared.windows
    with named_after(prepared.implausible, prepared.data):  # a diverged loss names the candles
        result = fit(model, windows, cfg.train, backup_dir, job.name, events, tensorboard, callbacks)
    outputs = forecasts(model, windows)
    trained = time.perf_counter() - started
    release_free_memory()
    evaluation = host.submit(evaluated, cfg, job, prepared, result, outputs, trained, current_rss_mb())
    return JobResult(evaluation.result(), model, trained)


def evaluated(cfg: RunConfig, job: Job, prepared: Prepared, result: FitResult, forecasts: Forecasts,
              trained_seconds: float, rss_mb: float | None) -> Evaluated:
    """A job whose model has trained (`result`), evaluated: its `forecasts` of the validation and test splits, their
    scores against the baselines (prepared.fitted), and what its directory holds but its model. `trained_seconds`:
    the job's time before its evaluation (metrics.json's seconds add this one's); `rss_mb`: the training process's
    resident memory, measured there."""
    evaluating = time.perf_counter()
    windows = prepared.windows
    with named_after(prepared.implausible, prepared.data):
        prep, test, val = windows.preprocessing, windows.test, windows.val
        val_raw, test_raw = forecasts.val, forecasts.test
        val_outputs = prep.point(val_raw)
        gains = {}
        if cfg.window.shrink:  # each head mixed with its own persistence as validation says
            prep, gains = choose_shrink(val_outputs, val, prep)
        outputs = prep.point(test_raw)
        predictions = prep.to_prices(outputs, test.last)
        unshrunk = windows.preprocessing.to_prices(outputs, test.last)
        scores = evaluate(predictions, test, prep, unshrunk, outputs=prep.to_prices(test_raw, test.last),
                          validation_gains=gains)
        candles, served, serving, fitted = None, {}, None, prepared.fitted
        if fitted is not None:  # the size of the coming candles, against its baselines
            head = candle_head(prep)
            val_prices = prep.to_prices(val_outputs, val.last)[head.name]
            candles, served, serving = candle_scores(
                head, prep.candle_quantities(head, test_raw, predictions[head.name], test.last_close),
                prep.candle_quantities(head, val_raw, val_prices, val.last_close), test, val, fitted, cfg.evaluation)
        scored = time.perf_counter() - evaluating
        metrics = JobMetrics(
            job=job.name, symbol=job.symbol, timeframe=job.timeframe, run=cfg.name, fingerprint=cfg.fingerprint(),
            data=prepared.data, epochs_run=int(result.history["epoch"].max()), best_epoch=result.best_epoch,
            best_val_loss=result.best_val_loss, seconds=round(trained_seconds + scored, 2),
            train_step_seconds=round(result.step_seconds, 3), rss_mb=rss_mb, engine=result.engine,
            timing=Timing(prepare=round(prepared.seconds, 3), windows=round(prepared.framing, 3),
                          epochs=[round(seconds, 3) for seconds in result.epoch_seconds],
                          train_windows=len(windows.train), evaluate=round(forecasts.seconds + scored, 3)),
            heads=scores.heads,
            headline=scores.headline, candles=candles, n_test=scores.n_test,
            test_range=[pd.Timestamp(t, tz="UTC").isoformat() for t in windows.test.target_times[[0, -1]]])
        if (bad := metrics.non_finite()) is not None:  # a number that means nothing never counts as done
            raise JobError(f"the test metrics are not finite ({bad[0]} is {bad[1]}); check the candles for absurd "
                           "values")
    indicators = tuple(indicator.model_dump(mode="json") for indicator in cfg.features.indicators)
    close_head = next((h for h in prep.heads if "close" in h.columns), None)
    closes = {}
    if close_head is not None:  # for the report's chart: the test split's actual close, and persistence's
        column = close_head.columns.index("close")
        closes = {"actual_close": test.y_raw[close_head.name][..., column],
                  "persistence_close": test.last_inputs[close_head.name][:, column]}
    return Evaluated(metrics, JobDir.files(
        replace(prep, symbol=job.symbol, timeframe=job.timeframe, indicators=indicators, market=prepared.market),
        metrics,
        # Published with the model: where this machine keeps its runs and caches, and trains, is nobody's business.
        cfg.model_dump(mode="json", exclude={"output_dir", "cache_dir", "executor"}),
        result.history, {"target_times": test.target_times.astype("datetime64[ns]"), **predictions, **closes, **served},
        None if fitted is None else fitted.har_tod, None if fitted is None else fitted.harx, serving))


def job_windows(cfg: RunConfig, timeframe: str, frame: pd.DataFrame,
                target_shapes: dict[str, tuple[int, ...]]) -> tuple[Windows, Baselines | None]:
    """A job's windows as fit takes them, and the baselines of the size of the coming candles fitted on its train
    split (None without a candle head; kept in the cache beside the features); the windows carry the inputs the heads
    read beside them, made from HAR's forecast of each window (a HAR head's start)."""
    windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, target_shapes)
    if candle_head(windows.preprocessing) is None:
        return windows, None
    fitted = cached_baselines(cfg.cache_path, frame, timeframe, cfg.window.horizon, windows.train.first_target_rows,
                              windows.val.first_target_rows)
    return windows.with_forecasts(fitted.har_inputs()), fitted


@contextlib.contextmanager
def named_after(implausible: str | None, data: DataInfo):
    """A job error raised inside (a value the windows cannot frame, a loss that diverged, predictions or metrics
    that are not finite) names the candles it comes from (`data`), and the implausible price in them that likely
    caused it (`implausible`: features.implausible_jump), when there is one: then a diverged loss is not blamed on
    the learning rate."""
    try:
        yield
    except JobError as exc:
        cause = (f"; the candles are implausible: {implausible}" if implausible else
                 "; try a lower train.learning_rate or train.clipvalue" if isinstance(exc, Diverged) else "")
        raise JobError(f"{data.source}: {exc}{cause}") from None


@contextlib.contextmanager
def long_lived_frozen() -> Iterator[None]:
    """What is alive before a run builds its first model (TensorFlow or JAX, Keras, pandas, this package: over a
    million objects) lives as long as the run: frozen (gc.freeze), every collection meanwhile skips it and scans only
    the model's objects and the job's. A full collection in a process that has imported TensorFlow takes 0.5-1 s of
    CPU, and Keras's clear_session and each job's release_free_memory made one, twice a process (2026-11-30). Then the
    calling process (a notebook, say) gets the collection it had back: unfrozen, unless it had frozen its heap."""
    had_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not had_frozen:
            gc.unfreeze()


def release_free_memory() -> None:
    """Collect a job's garbage and hand freed heap pages back to the OS. glibc keeps them after each job's arrays
    are freed, which over 40 jobs reads like a leak of ~25 MB a job; with this the RSS stays flat (malloc_trim: a
    no-op off glibc)."""
    gc.collect()
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


def current_rss_mb() -> float | None:
    """Resident memory now (not the peak), to show it stays flat across jobs; None off Linux."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        return None
    pages = int(statm.read_text().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)

