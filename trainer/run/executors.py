"""Where jobs train: in the driver's own process, one at a time with TensorFlow (LocalExecutor) or K at a time
packed on Keras's JAX backend (packing.PackExecutor: train.pack), or on Ray workers (distributed.RayExecutor). Each is
imported only when asked for: a local run never imports Ray, a packed one never TensorFlow.

An executor takes prepared jobs (submit) up to its capacity and hands back each one's outcome (wait): a
pipeline.JobOutput (its metrics and its files, which the driver writes into the job directory it commits), or
the exception the job failed with. Its `host` (run.host) is where the jobs' host work runs: the driver prepares
jobs there, an executor in this process evaluates them there. Everything about the run directory and the ledger
stays with the driver (runner.run_config).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import keras

from ..config import ExecutorConfig, RunConfig
from ..errors import JobError, UserError
from .host import host_workers, open_host
from .jobs import Job
from .pipeline import Events, Host, JobOutput, Prepared, long_lived_frozen, tensorboard_dir, train_one

log = logging.getLogger(__name__)


class Executor(Protocol):
    capacity: int  # jobs it trains at once
    host: Host  # where the jobs' host work runs (run.host)
    target_shapes: dict[str, tuple[int, ...]]  # each head's targets, as the model outputs them (pipeline.prepare)
    training_seconds: float | None  # time its device has trained (and forecast) in this process so far; None: Ray's

    def submit(self, job: Job, prepared: Prepared, backup: Path) -> None: ...

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        """Blocks until at least one submitted job has ended; their outcomes. Training progress meanwhile goes
        to `events`."""


class Trainer(Executor, Protocol):
    """An executor that trains in this process (the driver's in a local run, a Ray worker's): in_process_trainer
    builds one. Its jobs can be given callbacks of their own, fired after their checkpoint's (a Ray worker's, sending
    it), and where their TensorBoard logs go (default: the run's directory for them, pipeline.tensorboard_dir)."""

    def submit(self, job: Job, prepared: Prepared, backup: Path, callbacks: tuple = (),
               tensorboard: Path | None = None) -> None: ...


def in_process_trainer(cfg: RunConfig, engine: str, capacity: int, host: Host) -> Trainer:
    """The one place a trainer in this process is made, for the engine chosen before Keras was imported
    (engine.engine_for): on "jax", `capacity` jobs packed in one step (packing.PackExecutor; a job alone is a pack
    of one); on "tensorflow", one at a time (LocalExecutor)."""
    if engine == "jax":
        from .packing import PackExecutor

        return PackExecutor(cfg, capacity, host)
    return LocalExecutor(cfg, host)


class LocalExecutor:
    """One job at a time, in this process: one TensorFlow context, one compiled model per shape (ModelCache)."""

    capacity = 1

    def __init__(self, cfg: RunConfig, host: Host) -> None:
        from ..model.models import output_shapes
        from ..model.training import ModelCache

        self.cfg, self.host = cfg, host
        self.cache = ModelCache.of_process()  # a run after a run in this process reuses its traced model
        # a model the config cannot build is bad input
        self.target_shapes = output_shapes(self.cache.model_for(cfg.network, cfg.train), cfg.heads)
        self.training_seconds = 0.0
        self._next: tuple | None = None

    def submit(self, job: Job, prepared: Prepared, backup: Path, callbacks: tuple = (),
               tensorboard: Path | None = None) -> None:
        self._next = (job, prepared, backup, callbacks, tensorboard or tensorboard_dir(self.cfg.run_dir, job.name))

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        job, prepared, backup, callbacks, tensorboard = self._next
        self._next = None
        try:
            result = train_one(self.cfg, job, prepared, backup, self.cache, events, self.host, callbacks,
                               tensorboard)
            self.training_seconds += result.training_seconds
            return [(job, result)]
        except Exception as exc:  # KeyboardInterrupt and SystemExit go on up: the driver stops
            if not isinstance(exc, JobError):
                self.cache.forget()  # the model may be in a broken state (e.g. after out-of-memory)
            return [(job, exc)]


@contextlib.contextmanager
def open_executor(cfg: RunConfig, executor: ExecutorConfig, jobs: int, engine: str,
                  note: Callable[[str], None] = lambda line: None,
                  host_workers: int | str = "auto") -> Iterator[Executor]:
    """The executor of `jobs` jobs, for the engine chosen for this process before Keras was imported (`engine`:
    engine.engine_for's, "jax" or "tensorflow"): in this process (in_process_trainer), or on Ray workers, each with
    the same trainer of its own; `note` is told the pack's size and why, and where the host work runs
    (`host_workers`: run --host-workers, host.host_workers)."""
    if engine != keras.backend.backend():
        raise UserError(f"the run's engine is {engine}, and this process's Keras runs on {keras.backend.backend()}: "
                        f"set KERAS_BACKEND={engine} before Keras is imported (`cryptotrain run` does)")
    if engine == "tensorflow" and cfg.train.pack not in (1, "auto"):
        raise UserError(f"train.pack {cfg.train.pack} trains on Keras's JAX backend, and this process's Keras "
                        f"runs on {engine}: set KERAS_BACKEND=jax before Keras is imported (run --pack does)")
    pack = None  # jobs a Ray worker packs; None: one at a time, with TensorFlow
    if engine == "jax":  # packed: K jobs a step (a job alone is a pack of one)
        from .packing import plan_pack

        plan = plan_pack(cfg.train.pack, jobs, cfg.network, cfg.train, cfg.data.max_rows)
        at_a_time = f"{plan.k} job{'s' * (plan.k > 1)} at a time"
        if executor.kind == "local":
            with _host(host_workers, plan.k, note) as host, long_lived_frozen():
                workers = in_process_trainer(cfg, engine, plan.k, host)
                note(f"packed training on {plan.device}: {at_a_time} ({plan.why}); compiled steps kept in "
                     f"{workers.compilation_cache}")
                yield workers
            return
        note(f"packed training on Ray workers: {at_a_time} on each ({plan.why})")
        pack = plan.k
    else:
        if cfg.train.pack == "auto":
            note("--pack auto: one job at a time, with TensorFlow (packing is for an accelerator JAX sees)")
        from ..model.cudnn import cudnn_report
        from ..model.device import setup

        setup(cfg.train)  # TensorFlow, for this process (and a Ray run's driver), before any model is built
        for layer in cudnn_report(cfg.model):
            if not layer.eligible:
                log.warning("model.layers[%d] (%s) cannot use the fused cuDNN kernel on a GPU: %s",
                            layer.index, layer.kind, "; ".join(layer.blockers))
        if executor.kind == "local":
            with _host(host_workers, 1, note) as host, long_lived_frozen():
                yield in_process_trainer(cfg, engine, 1, host)
            return
    from .distributed import RayExecutor

    with _host(host_workers, executor.workers * (pack or 1), note) as host, \
            RayExecutor(cfg, executor, host, pack) as workers:
        yield workers


@contextlib.contextmanager
def _host(requested: int | str, capacity: int, note: Callable[[str], None]) -> Iterator[Host]:
    """Where the host work of an executor of `capacity` runs (host.host_workers), its workers started now, while the
    model is built; closed with the executor."""
    host = open_host(host_workers(requested, capacity))
    if host.workers > 1:
        note(f"host work (preparing and evaluating jobs) on {host.workers} worker processes")
    try:
        yield host
    finally:
        host.close()
