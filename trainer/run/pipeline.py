"""One job, top to bottom: candles -> features (prepare) -> windows (job_windows) -> train -> evaluate -> the job's
files (train_one: TensorFlow's training.fit, then `evaluated`). A packed run (packing.PackExecutor) trains K jobs
together on JAX between job_windows and `evaluated`, the same two steps.

`prepare` runs where the data is (the driver, with its feature cache); `train_one` runs anywhere — in the
driver's process for a local run, in a Ray worker for a distributed one. Neither prints nor touches the run
directory: training progress goes to an Events object, the outcome comes back as a JobResult (its metrics and
what its job directory holds, in memory), which the driver writes straight into the staging directory it
commits (artifacts.commit_job), and the only path train_one writes to is the backup directory it is given (the
job's epoch checkpoints).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import keras
import numpy as np
import pandas as pd

from ..config import RunConfig
from ..data.features import implausible_jump, job_features
from ..data.market import Reference
from ..data.windows import Preprocessing, SplitWindows, Windows, make_windows
from ..errors import JobError
from ..evaluation.baselines import Baselines, Har, cached_baselines
from ..evaluation.evaluate import candle_head, candle_scores, choose_shrink, evaluate, predict_fixed_batches
from ..evaluation.results import DataInfo, JobMetrics, Timing
from ..model.callbacks import Diverged, FitResult, ReportProgress
from ..model.models import output_shapes
from .jobdir import JobDir
from .jobs import Job

if TYPE_CHECKING:
    from ..model.packed import Forecasts
    from ..model.training import ModelCache


class Events(Protocol):
    """Where a job's training progress goes: the driver's display (report.console.JobProgress), or, from a Ray
    worker, a mailbox actor the driver reads."""

    def training_started(self, job: str, epochs: int, done: int) -> None: ...

    def epoch_ended(self, job: str, epoch: int, logs: dict) -> None: ...


@dataclass(frozen=True)
class Prepared:
    """A job's input, made where the data is: its feature rows, where its candles came from (metrics.json's
    "data") and the reference series of its market input (preprocessing.json's "market")."""
    frame: pd.DataFrame
    data: DataInfo
    market: tuple[Reference, ...] = ()
    seconds: float = 0.0  # the time it took (metrics.json's timing.prepare)


class JobOutput(Protocol):
    """What an executor hands back for a job that trained: its metrics, and its files, which `write` puts into
    the directory the driver commits (every file of the job directory but its manifest, which commit adds)."""
    metrics: JobMetrics  # what its metrics.json holds

    def write(self, directory: Path) -> None: ...


@dataclass(frozen=True, eq=False)
class JobResult:
    """A job trained here (train_one): what its directory holds, in memory, each written once by `write`. The
    model is the ModelCache's: write the result before the cache's next job."""
    metrics: JobMetrics
    model: keras.Model
    preprocessing: Preprocessing  # with the job's symbol, timeframe and indicators: what predict reads
    config: dict  # the run's config as published with the model
    history: pd.DataFrame  # one row per epoch
    test: SplitWindows
    predictions: dict[str, np.ndarray]  # head -> the test split's forecasts in prices
    har_tod: Har | None = None  # predict's expected high / low and interval after the latest candles
    served: dict[str, np.ndarray] = field(default_factory=dict)  # what users get per test window (candle_scores)
    harx: Har | None = None  # HAR-X, where what is served weighs it (predict)

    def write(self, directory: Path) -> None:
        test, predictions = self.test, self.predictions
        close_head = next((h for h in self.preprocessing.heads if "close" in h.columns), None)
        closes = {}
        if close_head is not None:  # for the report's chart: the test split's actual close, and persistence's
            column = close_head.columns.index("close")
            closes = {"actual_close": test.y_raw[close_head.name][..., column],
                      "persistence_close": test.last_inputs[close_head.name][:, column]}
        JobDir(directory).write(self.model, self.preprocessing, self.metrics, self.config, self.history,
                                {"target_times": test.target_times.astype("datetime64[ns]"), **predictions, **closes,
                                 **self.served},
                                self.har_tod, self.harx)


def tensorboard_dir(run_dir: Path, job_name: str) -> Path:
    return run_dir / "tensorboard" / job_name


def prepare(cfg: RunConfig, job: Job) -> Prepared:
    started = time.perf_counter()
    features = job_features(cfg, job.symbol, job.timeframe)
    candles = features.candles
    return Prepared(features.frame, DataInfo(
        source=candles.attrs["source"], synthetic=bool(candles.attrs.get("synthetic")),
        first=candles.index[0].isoformat(), last=candles.index[-1].isoformat(), rows=len(candles),
        gaps=int(candles.attrs.get("gaps", 0))), features.market, time.perf_counter() - started)


def train_one(cfg: RunConfig, job: Job, prepared: Prepared, backup_dir: Path, cache: ModelCache, events: Events,
              callbacks: tuple[keras.callbacks.Callback, ...] = (), tensorboard: Path | None = None) -> JobResult:
    """Train and evaluate one job. `backup_dir` holds its epoch checkpoints: an interrupted or extended job goes
    on from the last one there. With train.tensorboard, Keras's TensorBoard callback writes the job's epoch logs
    into `tensorboard`. JobError: the job failed for its own reasons (data, a non-finite loss)."""
    from ..model.training import fit  # TensorFlow's: a packed run (packing.PackExecutor) never imports it

    started = time.perf_counter()
    if cfg.train.tensorboard:
        callbacks = (*callbacks, keras.callbacks.TensorBoard(log_dir=str(tensorboard), histogram_freq=0,
                                                             write_graph=False, update_freq="epoch"))
    model = cache.model_for(cfg.network, cfg.train)
    with named_after(prepared):  # what fails here (framing, a diverged loss, numbers not finite) names the candles
        windows, fitted = job_windows(cfg, job.timeframe, prepared.frame, output_shapes(model, cfg.heads))
        framed = time.perf_counter() - started
        # An epoch is reported after the given callbacks (a Ray worker's, sending its checkpoint) have seen it.
        result = fit(model, windows, cfg.train, backup_dir,
                     callbacks=[*callbacks, ReportProgress(events, job.name)])
    return evaluated(cfg, job, prepared, model, windows, fitted, result, started, framed)


def evaluated(cfg: RunConfig, job: Job, prepared: Prepared, model: keras.Model, windows: Windows,
              fitted: Baselines | None, result: FitResult, started: float, framed: float,
              forecasts: Forecasts | None = None) -> JobResult:
    """A job whose model has trained (`result`: training.fit's, or a pack's), evaluated: its forecasts of the
    validation and test splits, their scores against the baselines (`fitted`: job_windows's), and what its
    directory holds. `started`: when the job began (perf_counter), for its metrics' seconds; `framed`: the seconds
    job_windows took; `forecasts`: the model's outputs on both splits where its pack computed them (mapped over the
    pack's jobs: packed.Pack.forecasts), else the model's forward pass here."""
    evaluating = time.perf_counter() - (forecasts.seconds if forecasts else 0.0)
    with named_after(prepared):
        prep, test, val = windows.preprocessing, windows.test, windows.val
        # every output of the model
        val_raw = forecasts.val if forecasts else predict_fixed_batches(model, val.x)
        test_raw = forecasts.test if forecasts else predict_fixed_batches(model, test.x)
        val_outputs = prep.point(val_raw)
        gains = {}
        if cfg.window.shrink:  # each head mixed with its own persistence as validation says
            prep, gains = choose_shrink(val_outputs, val, prep)
        outputs = prep.point(test_raw)
        predictions = prep.to_prices(outputs, test.last)
        unshrunk = windows.preprocessing.to_prices(outputs, test.last)
        release_free_memory()
        scores = evaluate(predictions, test, prep, unshrunk, outputs=prep.to_prices(test_raw, test.last),
                          validation_gains=gains)
        candles, served = None, {}
        if fitted is not None:  # the size of the coming candles, against its baselines
            head = candle_head(prep)
            val_prices = prep.to_prices(val_outputs, val.last)[head.name]
            candles, served = candle_scores(
                head, prep.candle_quantities(head, test_raw, predictions[head.name], test.last_close),
                prep.candle_quantities(head, val_raw, val_prices, val.last_close), test, val, fitted, cfg.evaluation)
        metrics = JobMetrics(
            job=job.name, symbol=job.symbol, timeframe=job.timeframe, run=cfg.name, fingerprint=cfg.fingerprint(),
            data=prepared.data, epochs_run=int(result.history["epoch"].max()), best_epoch=result.best_epoch,
            best_val_loss=result.best_val_loss, seconds=round(time.perf_counter() - started, 2),
            train_step_seconds=round(result.step_seconds, 3), rss_mb=current_rss_mb(), engine=result.engine,
            timing=Timing(prepare=round(prepared.seconds, 3), windows=round(framed, 3),
                          epochs=[round(seconds, 3) for seconds in result.epoch_seconds],
                          train_windows=len(windows.train), evaluate=round(time.perf_counter() - evaluating, 3)),
            heads=scores.heads,
            headline=scores.headline, candles=candles, n_test=scores.n_test,
            test_range=[pd.Timestamp(t, tz="UTC").isoformat() for t in windows.test.target_times[[0, -1]]])
        if (bad := metrics.non_finite()) is not None:  # a number that means nothing never counts as done
            raise JobError(f"the test metrics are not finite ({bad[0]} is {bad[1]}); check the candles for absurd "
                           "values")
    indicators = tuple(indicator.model_dump(mode="json") for indicator in cfg.features.indicators)
    return JobResult(
        metrics, model,
        replace(prep, symbol=job.symbol, timeframe=job.timeframe, indicators=indicators, market=prepared.market),
        # Published with the model: where this machine keeps its runs and caches, and trains, is nobody's business.
        cfg.model_dump(mode="json", exclude={"output_dir", "cache_dir", "executor"}),
        result.history, windows.test, predictions, None if fitted is None else fitted.har_tod, served,
        None if fitted is None else fitted.harx)


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
def named_after(prepared: Prepared):
    """A job error raised inside (a value the windows cannot frame, a loss that diverged, predictions or metrics
    that are not finite) names the candles it comes from, and the implausible price in them that likely caused
    it, when there is one: then a diverged loss is not blamed on the learning rate."""
    try:
        yield
    except JobError as exc:
        jump = implausible_jump(prepared.frame)
        cause = (f"; the candles are implausible: {jump}" if jump else
                 "; try a lower train.learning_rate or train.clipvalue" if isinstance(exc, Diverged) else "")
        raise JobError(f"{prepared.data.source}: {exc}{cause}") from None


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

