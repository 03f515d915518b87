"""Packed runs (`run --pack K`, train.pack): the driver claims up to K jobs and prepares each, as for any executor;
this one trains them together in one compiled step on Keras's JAX backend (model.packed.Pack), each exactly as if
alone, then evaluates each as a job trained alone is evaluated (pipeline.evaluated), every one at once on the host's
workers (run.host), while the pack's last checkpoints are written. Every job keeps its own epoch checkpoints in its
backup directory and is committed and recorded on its own by the driver: a pack killed at any moment resumes each
of its jobs after its own last finished epoch.

The jobs of a run share one model signature (one config, one model), so any K of them pack; jobs of different
lengths pack too: each has its own number of batches an epoch, and one with fewer is idle for the rest of it (the
driver packs jobs of like lengths together, of those it has prepared: runner.like_lengths; each pack says its idle
share).

Imports no TensorFlow: it runs where only JAX is installed.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import jax
import keras

from ..config import RunConfig
from ..errors import UserError, first_line, out_of_memory
from ..evaluation.results import JobMetrics
from ..model.models import build_network, output_shapes
from ..model.packed import JobState, Pack, PackedJob, PackSteps, windows_job
from ..model.resume import assign
from ..model.sequence import JobTraining
from ..model.settings import INFERENCE_BATCH_SIZE, Engine, NetworkSpec, TrainConfig
from ..model.trained import Forecasts
from .engine import on_accelerator
from .jobs import Job
from .pipeline import (
    Events,
    Host,
    JobOutput,
    JobResult,
    Prepared,
    current_rss_mb,
    evaluated,
    named_after,
    release_free_memory,
    tensorboard_dir,
)

log = logging.getLogger(__name__)

# The most jobs one step takes (../shared/docs/gpu.md measured the rate still rising at 160 on an H100), and the
# share of an accelerator's memory the pack may fill (the rest: XLA's workspace, evaluation, fragmentation).
MAX_PACK, MEMORY_SHARE = 160, 0.5
# Candles a job is assumed to have when the config does not cap them (data.max_rows): a year of 15m candles.
ASSUMED_ROWS = 35_000


@dataclass(frozen=True)
class PackPlan:
    """How many jobs train together, and why: what `run` and `doctor` print."""
    k: int
    device: str  # e.g. "gpu: NVIDIA H100 80GB HBM3", "cpu"
    why: str


def device_name() -> str:
    device = jax.devices()[0]
    return "cpu" if device.platform == "cpu" else f"{device.platform}: {device.device_kind}"


def job_bytes(spec: NetworkSpec, train: TrainConfig, rows: int) -> int:
    """An upper estimate of one packed job's device memory: its windows (train and validation, float32, as the pack
    stacks them), its weights with their gradients and Adam's two moments, and its batch's activations (each layer's
    units at every time step, kept for the backward pass, times a margin for the gates)."""
    from ..model.models import count_params

    features = len(spec.columns)
    windows = rows * spec.lookback * features * 4
    state = 4 * count_params(spec) * 4
    units = sum(getattr(layer, "units", 0) or 0 for layer in spec.model.layers)
    activations = train.batch_size * spec.lookback * max(units, features) * 8 * 4
    return windows + state + activations


def plan_pack(requested: int | str, jobs: int, spec: NetworkSpec, train: TrainConfig, rows: int | None) -> PackPlan:
    """K for `requested` (train.pack): a number is taken as it is (at most the jobs there are); "auto" is 1 on a CPU
    (packing gains nothing there: benchmarks/RESULTS.md, bench-pack) and, on an accelerator, as many jobs as fill
    MEMORY_SHARE of its memory by job_bytes' estimate, at most MAX_PACK."""
    device = device_name()
    if requested != "auto":
        k = max(1, min(int(requested), jobs))
        return PackPlan(k, device, "a job alone" if int(requested) == 1 else
                        f"--pack {requested}" + (f" ({jobs} jobs)" if k < int(requested) else ""))
    if not on_accelerator():
        return PackPlan(1, device, "auto: one job at a time on a CPU (packing gains nothing there)")
    stats = jax.devices()[0].memory_stats() or {}
    per_job = job_bytes(spec, train, rows or ASSUMED_ROWS)
    if "bytes_limit" not in stats:
        k = min(jobs, 8)
        return PackPlan(k, device, f"auto: {k} (the device does not report its memory)")
    k = jobs_that_fit(jobs, per_job, stats["bytes_limit"])
    return PackPlan(k, device, f"auto: {k} of {jobs} jobs ({per_job / 2**20:,.0f} MiB a job estimated, "
                               f"{MEMORY_SHARE:.0%} of {stats['bytes_limit'] / 2**30:,.1f} GiB)")


def jobs_that_fit(jobs: int, per_job: int, bytes_limit: int) -> int:
    """`--pack auto`'s K on an accelerator of `bytes_limit` bytes: as many of the jobs as fill MEMORY_SHARE of it at
    `per_job` bytes each, at most MAX_PACK, at least 1."""
    return max(1, min(jobs, MAX_PACK, int(bytes_limit * MEMORY_SHARE // per_job)))


def compilation_cache(cache: Path) -> Path:
    """Where JAX keeps what it compiles for packs (its persistent compilation cache): JAX_COMPILATION_CACHE_DIR
    where set, else `cache`/xla (the run's cache_dir). The next process (a resumed run, the next family of the same
    model) loads the compiled step from there instead of compiling it again (~25 s for V7 on an H100); within a
    process, a later pack and each half of a pack that ran out of memory reuse the one the executor holds
    (packed.PackSteps). Deleting the directory clears it. Set before anything is compiled: JAX reads the setting at
    its first compilation."""
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(cache / "xla"))
    return Path(jax.config.jax_compilation_cache_dir)


def idle_share(steps: list[int]) -> float:
    """The share of a pack's lanes idle in an epoch, its jobs having `steps` batches each: each epoch runs as many
    steps as its longest job, and a job with fewer idles for the rest."""
    return 1 - sum(steps) / (len(steps) * max(steps))


def pack_precision(precision: str) -> str:
    """train.precision for a pack: float32, or mixed_bfloat16 (no loss scaling); "auto" is float32 on a CPU and
    mixed_bfloat16 on an accelerator (../shared/docs/gpu.md: a packed V7 epoch 8.4 s in float32, 6.7 s so).
    mixed_float16 would need a loss scale per job: refused."""
    if precision == "mixed_float16":
        raise UserError("train.precision mixed_float16 is not available with --pack (its loss scale is not packed): "
                        "use mixed_bfloat16, float32 or auto")
    if precision == "auto":
        return "float32" if jax.default_backend() == "cpu" else "mixed_bfloat16"
    return precision


# A job as its pack left it, its training sequence, its state on the host and its forecasts (its pack is released)
Trained = tuple[PackedJob, JobTraining, JobState, Forecasts]


@dataclass(frozen=True)
class _PackedOutput:
    """A packed job's output (pipeline.JobOutput): its result, whose model is the executor's, shared by the pack's
    jobs, and the job's own state, given to that model as the job's files are written (the driver writes them once
    the whole pack is evaluated)."""
    result: JobResult
    state: JobState

    @property
    def metrics(self) -> JobMetrics:
        return self.result.metrics

    def write(self, directory: Path) -> None:
        assign(self.result.model.variables, self.state.variables)
        assign(self.result.model.optimizer.variables, self.state.optimizer_variables)
        self.result.write(directory)


@dataclass
class _Submitted:
    job: Job
    prepared: Prepared
    backup: Path
    callbacks: tuple[keras.callbacks.Callback, ...]  # the job's own, after its checkpoint's (a Ray worker's)
    tensorboard: Path  # where its epoch logs go, with train.tensorboard


class PackExecutor:
    """Trains the jobs submitted since the last wait (at most `capacity`) together, then evaluates each on `host`,
    all of them at once where it has a worker for each (run.host)."""

    def __init__(self, cfg: RunConfig, capacity: int, host: Host) -> None:
        self.cfg, self.capacity, self.host = cfg, capacity, host
        if not jax.config.jax_threefry_partitionable:
            raise UserError("packed training needs JAX's partitionable random bits (jax_threefry_partitionable, its "
                            "default from JAX 0.5): without them a packed job draws other dropout bits than alone; "
                            "unset JAX_THREEFRY_PARTITIONABLE, or pip install 'cryptotrain[jax]' (JAX >= 0.5)")
        self.compilation_cache = compilation_cache(cfg.cache_path)  # before the model compiles anything
        self.precision = pack_precision(cfg.train.precision)
        keras.mixed_precision.set_dtype_policy(self.precision)
        keras.utils.set_random_seed(cfg.train.seed)  # the initial weights a job trained alone starts from
        # A model the config cannot build is bad input, said before a run directory records it.
        self.model, self.warm_starts = build_network(cfg.network, cfg.train)
        self.target_shapes = output_shapes(self.model, cfg.heads)
        # The one batch it evaluates through Keras (to build its compiled metrics: packed.PackSteps) compiled, not run
        # op by op: every other forward pass is the pack's own, compiled and mapped over its jobs
        self.model.jit_compile = True
        self.model.optimizer.build(self.model.trainable_variables)
        # every job starts from them, as alone
        self.initial = [v.numpy() for v in self.model.variables]
        self.initial_optimizer = [v.numpy() for v in self.model.optimizer.variables]
        self.training_seconds = 0.0
        self._steps: PackSteps | None = None  # the model's compiled packed epoch, once a pack has made it
        self._submitted: list[_Submitted] = []

    def submit(self, job: Job, prepared: Prepared, backup: Path,
               callbacks: tuple[keras.callbacks.Callback, ...] = (), tensorboard: Path | None = None) -> None:
        """`tensorboard`: where the job's epoch logs go with train.tensorboard (default: the run's directory for
        them, pipeline.tensorboard_dir)."""
        self._submitted.append(_Submitted(job, prepared, backup, callbacks,
                                          tensorboard or tensorboard_dir(self.cfg.run_dir, job.name)))

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        submitted, self._submitted = self._submitted, []
        started = time.perf_counter()
        trained_jobs, ends = self._train_fitting(submitted, events)
        release_free_memory()
        rss_mb = current_rss_mb()
        engine = {}  # jobs a pack -> what trained them
        outcomes: dict[str, JobOutput | BaseException] = {}
        evaluating = {}  # job -> its evaluation's future
        for item in submitted:
            name = item.job.name
            if isinstance(trained_job := trained_jobs[name], BaseException):
                outcomes[name] = trained_job  # its pack could not train
                continue
            packed, training, state, forecasts = trained_job
            try:
                with named_after(item.prepared.implausible, item.prepared.data):
                    if packed.error is not None:  # a callback failed it: StopOnNaN's Diverged, say
                        raise packed.error
                    engine.setdefault(state.pack, Engine(name="jax", jobs=state.pack, precision=self.precision,
                                                         device=device_name()))
                    # its epochs' times: its pack's
                    result = replace(training.result(engine[state.pack]), epoch_seconds=tuple(packed.epoch_seconds))
            except Exception as exc:
                outcomes[name] = exc
                continue
            evaluating[name] = self.host.submit(evaluated, self.cfg, item.job, item.prepared, result, forecasts,
                                                time.perf_counter() - started, rss_mb)
        for end in ends:  # beside the evaluations: the last epoch's checkpoints written, its progress shown
            end()
        for item in submitted:
            if (name := item.job.name) not in evaluating:
                continue
            packed, _, state, _ = trained_jobs[name]
            try:
                with named_after(item.prepared.implausible, item.prepared.data):
                    if packed.error is not None:  # its last checkpoint could not be written, say
                        raise packed.error
                # saved with the job's own state (its optimizer's too: model.keras holds it, as a job trained alone
                # saves its own)
                outcomes[name] = _PackedOutput(JobResult(evaluating[name].result(), self.model), state)
            except Exception as exc:
                outcomes[name] = exc
        return [(item.job, outcomes[item.job.name]) for item in submitted]

    def _train_fitting(self, items: list[_Submitted],
                       events: Events) -> tuple[dict[str, Trained | BaseException], list[Callable[[], None]]]:
        """The jobs trained in one pack; should the device (or the host, building the pack) not hold them (more than
        auto's estimate allowed for, or --pack K), in two halves, one after the other, and theirs likewise. Each job
        goes on from its own last checkpoint, so it ends as in a pack that ran through. Per job: its trained
        PackedJob and its training sequence, or what failed it (a job alone the device cannot hold: the run's line
        says to lower train.batch_size); and what each pack left to do beside the evaluation (Pack.end)."""
        if len(items) > 1:  # what the progress display shows as jobs training at once
            steps = [math.ceil(len(item.prepared.windows.train) / self.cfg.train.batch_size) for item in items]
            log.info("training packed, %d jobs in one step: %s; %.0f %% of its lanes idle (%s steps an epoch)",
                     len(items), ", ".join(item.job.name for item in items), 100 * idle_share(steps),
                     f"{min(steps)}-{max(steps)}" if min(steps) < max(steps) else max(steps))
        try:
            trainings, trained, end = self._train(items, events)
        except Exception as exc:  # the pack could not train (and has released its buffers)
            if len(items) == 1 or not (out_of_memory(exc) or isinstance(exc, MemoryError)):
                return {item.job.name: exc for item in items}, []  # each job fails with it
            where = "host memory building it" if isinstance(exc, MemoryError) else f"memory on {device_name()}"
            why = first_line(exc) or type(exc).__name__
        else:
            return {item.job.name: (packed, trainings[packed.name], *trained[packed.name])
                    for item, packed in zip(items, trained.packed, strict=True)}, [end]
        # Out of memory: the halves train once the failed pack, its exception and what they held are gone
        half = len(items) // 2
        log.warning("a pack of %d jobs ran out of %s (%s): training them %d and %d at a time",
                    len(items), where, why, half, len(items) - half)
        first, first_ends = self._train_fitting(items[:half], events)
        second, second_ends = self._train_fitting(items[half:], events)
        return first | second, first_ends + second_ends

    def _train(self, items: list[_Submitted],
               events: Events) -> tuple[dict[str, JobTraining], _Trained, Callable[[], None]]:
        """The jobs trained in one pack, each with its own sequence (sequence.JobTraining, as a job trained alone):
        going on from its backup directory's checkpoint, or from the heads' warm start; each job's sequence,
        its packed job, its state on the host and its forecasts (Pack.forecasts); and the pack's end
        (Pack.end, then its jobs' sequences closed: their TensorBoard writers), left to the caller. The
        pack's device buffers are released before it returns (or raises): the next pack, or a half of this
        one, trains in their room."""
        model, began = self.model, time.perf_counter()
        assign(model.variables, self.initial)
        assign(model.optimizer.variables, self.initial_optimizer)
        trainings, pack = {}, None
        try:
            jobs = [windows_job(item.job.name, item.prepared.windows, self.cfg.train.seed) for item in items]
            pack = Pack(model, jobs, self.cfg.train.batch_size, INFERENCE_BATCH_SIZE, self._steps)
            self._steps = pack.steps  # the next pack's, and each half's after an out-of-memory
            for item, packed in zip(items, jobs, strict=True):
                training = trainings[packed.name] = JobTraining(packed.view, self.cfg.train, item.backup, packed.name,
                                                                events, item.tensorboard, item.callbacks)
                packed.follow(training)
                training.start(partial(pack.warm_start, packed, self.warm_starts))
            pack.train(self.cfg.train.epochs)
            trained = _Trained(jobs, dict(zip([packed.name for packed in jobs],
                                              zip(pack.states(), pack.forecasts(), strict=True), strict=True)))
        except BaseException:  # a job that failed ends without on_train_end
            if pack is not None:
                pack.release()  # now, not when the collector reaches it (what raised holds it until it goes)
            for training in trainings.values():
                training.close()
            raise
        finally:
            self.training_seconds += time.perf_counter() - began
        pack.release()

        def end() -> None:
            try:
                pack.end()
            finally:
                for training in trainings.values():
                    training.close()
        return trainings, trained, end


@dataclass(frozen=True)
class _Trained:
    """A pack's jobs as it trained them, and each one's state on the host and forecasts, by name."""
    packed: list[PackedJob]
    by_name: dict[str, tuple[JobState, Forecasts]]

    def __getitem__(self, name: str) -> tuple[JobState, Forecasts]:
        return self.by_name[name]
