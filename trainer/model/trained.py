"""What a job's training hands on, whichever engine trained it (training.fit with TensorFlow, or a pack on JAX): its
progress as it goes (to Events), its outcome (FitResult), its model's outputs on its validation and test windows
(Forecasts), and the one way training itself fails a job (Diverged). Imports no Keras: a host worker evaluating a
job (run.host) unpickles them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import JobError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .settings import Engine


class Events(Protocol):
    """Where a job's training progress goes: the driver's display (report.console.JobProgress), or, from a Ray
    worker, a mailbox actor the driver reads (callbacks.ReportProgress tells it)."""

    def training_started(self, job: str, epochs: int, done: int) -> None: ...

    def epoch_ended(self, job: str, epoch: int, logs: dict) -> None: ...


@dataclass
class FitResult:
    history: pd.DataFrame  # one row per epoch, including epochs run before a restart
    best_epoch: int  # 1-based
    best_val_loss: float
    step_seconds: float  # time in its train steps in this process, validation not included (callbacks.StepTimer)
    engine: Engine  # what trained it
    epoch_seconds: tuple[float, ...]  # each epoch's wall time in this process, validation included (packed: the pack's)


@dataclass(frozen=True)
class Forecasts:
    """A job's model outputs (inference, by output name) on its validation and test windows: what its evaluation
    scores. A job trained alone computes them with its model (models.forecasts); a pack, mapped over its jobs
    (packed.Pack.forecasts)."""
    val: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    seconds: float  # the time they took (a packed job: its share of its pack's pass)


class Diverged(JobError):
    """Training diverged: its loss is no longer a finite number. Whether the data or the settings are to blame
    is for the caller to tell (pipeline.named_after)."""
