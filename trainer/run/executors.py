"""Where jobs train: in the driver's own process (LocalExecutor), or on Ray workers (distributed.RayExecutor,
imported only when asked for, so a local run never imports Ray).

An executor takes prepared jobs (submit) up to its capacity and hands back each one's outcome (wait): a
pipeline.JobOutput (its metrics and its files, which the driver writes into the job directory it commits), or
the exception the job failed with. Everything about the run directory and the ledger stays with the driver
(runner.run_config).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from ..config import ExecutorConfig, RunConfig
from ..errors import JobError
from ..model.training import ModelCache
from .jobs import Job
from .pipeline import Events, JobOutput, Prepared, tensorboard_dir, train_one


class Executor(Protocol):
    capacity: int  # jobs it trains at once

    def submit(self, job: Job, prepared: Prepared, backup: Path) -> None: ...

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        """Blocks until at least one submitted job has ended; their outcomes. Training progress meanwhile goes
        to `events`."""


class LocalExecutor:
    """One job at a time, in this process: one TensorFlow context, one compiled model per shape (ModelCache)."""

    capacity = 1

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.cache = ModelCache.of_process()  # a run after a run in this process reuses its traced model
        self.cache.model_for(cfg.network, cfg.train)  # a model the config cannot build is bad input
        self._next: tuple[Job, Prepared, Path] | None = None

    def submit(self, job: Job, prepared: Prepared, backup: Path) -> None:
        self._next = (job, prepared, backup)

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        job, prepared, backup = self._next
        self._next = None
        try:
            return [(job, train_one(self.cfg, job, prepared, backup, self.cache, events,
                                    tensorboard=tensorboard_dir(self.cfg.run_dir, job.name)))]
        except Exception as exc:  # KeyboardInterrupt and SystemExit go on up: the driver stops
            if not isinstance(exc, JobError):
                self.cache.forget()  # the model may be in a broken state (e.g. after out-of-memory)
            return [(job, exc)]


@contextlib.contextmanager
def open_executor(cfg: RunConfig, executor: ExecutorConfig) -> Iterator[Executor]:
    if executor.kind == "local":
        yield LocalExecutor(cfg)
        return
    from .distributed import RayExecutor

    with RayExecutor(cfg, executor) as workers:
        yield workers
