"""What trains jobs in this process - the driver's in a local run, each Ray worker's in a distributed one: one at a
time with TensorFlow (LocalExecutor) or K at a time packed on Keras's JAX backend (packing.PackExecutor), made in one
place (in_process_trainer) for the engine chosen before Keras was imported; and what every executor is (Executor:
these, and the Ray executor that drives Ray workers, run.distributed).

An executor takes prepared jobs (submit) up to its capacity and hands back each one's outcome (wait): a
pipeline.JobOutput (its metrics and its files, which the driver writes into the job directory it commits), or
the exception the job failed with. Its `host` (run.host) is where the jobs' host work runs: the driver prepares
jobs there, an executor in this process evaluates them there. Everything about the run directory and the ledger
stays with the driver (runner.run_config).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..config import RunConfig
from ..errors import JobError
from .jobs import Job
from .pipeline import Events, Host, JobOutput, Prepared, tensorboard_dir, train_one


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
