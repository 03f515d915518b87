"""One job's training sequence, whichever loop runs its epochs: Keras's `fit` on TensorFlow (training.fit) or a pack
on JAX (packed.Pack, driven by trainer.run.packing). Imports no TensorFlow."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import keras

from ..errors import JobError
from .callbacks import EpochSummaries, ReportProgress, StepTimer, StopOnNaN
from .resume import EpochCheckpoint, resumable_callbacks, resume
from .settings import Engine, TrainConfig
from .trained import Events, FitResult


class JobTraining:
    """A job's training from its backup directory to its FitResult: where an interrupted run of it left off (resume),
    its callbacks (the non-finite rule, early stopping, LR reduction, its epoch checkpoint, its timer, then the
    caller's), its warm start or its best weights, and its result.

    The loop that trains it, given `model` (the job's model, or its view in a pack: packed.JobView), does, in order:
    - start(warm_start), once;
    - if `trains`: the epochs first_epoch .. end - 1, firing `callbacks` as Keras's fit fires them: on_train_begin;
      each epoch's on_epoch_begin before it trains, on_test_begin once its training steps are done (its validation
      begins: the step timer stops there) and on_epoch_end after its validation, with its logs; then on_train_end;
      then close(). A callback that raises ends the job with that exception (StopOnNaN's Diverged: a loss no longer
      finite; a non-finite val_loss alone is early stopping's to judge, as in Keras). Each callback sees its hooks
      in that order; a loop may fire the `observers`' (which change nothing of the job's state: they write the
      checkpoint, report) later than the `deciding` ones', while the next epoch trains: a pack does;
    - result(engine).
    Batch-level hooks are not part of it: the pack runs an epoch's steps in one compiled loop, and a per-batch hook
    would make every step of a job alone wait for the device."""

    def __init__(self, model: keras.Model, train: TrainConfig, backup_dir: Path, job: str, events: Events,
                 tensorboard: Path | None = None, callbacks: Sequence[keras.callbacks.Callback] = ()) -> None:
        """`job`'s training; its progress goes to `events`, its epoch logs (with train.tensorboard) under
        `tensorboard`; `callbacks`: the caller's own (a Ray worker's, sending each checkpoint to the driver)."""
        self.model = model
        self.restores_best = bool(train.early_stopping and train.early_stopping.restore_best_weights)
        resumed = resume(backup_dir, model)  # weights, optimizer state: the epoch to go on at
        early_stopping, reduce_lr = resumable_callbacks(train, resumed)
        self.checkpoint = EpochCheckpoint(backup_dir, resumed, early_stopping, reduce_lr)
        self.timer = StepTimer()
        # a job that early stopping had ended when it was killed trains no further epoch
        self.first_epoch, self.end = resumed.epochs, resumed.end(train)
        self._best_weights = resumed.best_weights
        # A diverged epoch is never checkpointed; the checkpoint takes the epoch's state once everything the epoch
        # changed is in it (a job killed at any moment resumes from a checkpointed epoch with its rows and best
        # weights). Those decide the next epoch; the timer is fired with them, at the epoch's own moments (its begin
        # before the epoch is dispatched: a pack's compilation is its first epoch's). After them, the observers, in
        # this order on either loop: the checkpoint's writer, the caller's (a Ray worker's: the epoch is at the
        # driver), progress, TensorBoard: an epoch they see is one the checkpoint holds.
        self.summaries = EpochSummaries(tensorboard) if train.tensorboard and tensorboard is not None else None
        self.deciding = [StopOnNaN(), *(c for c in (early_stopping, reduce_lr) if c), self.checkpoint, self.timer]
        self.observers = [self.checkpoint.writer, *callbacks, ReportProgress(events, job),
                          *((self.summaries,) if self.summaries else ())]

    @property
    def callbacks(self) -> list[keras.callbacks.Callback]:
        """Every callback of the job, in the order Keras's fit fires each hook."""
        return [*self.deciding, *self.observers]

    @property
    def trains(self) -> bool:
        """Whether an epoch is left to train (not: killed after training ended, before the artifacts were safe)."""
        return self.first_epoch < self.end

    def start(self, warm_start: Callable[[], None]) -> None:
        """Before the first epoch: a fresh job's warm start (a resumed job's weights are its checkpoint's); a job
        whose training had ended ends as training did, restoring early stopping's best weights."""
        if self.trains:
            if self.first_epoch == 0:
                warm_start()
        elif self.restores_best and self._best_weights is not None:
            self.model.set_weights(self._best_weights)

    def close(self) -> None:
        """What it holds open (its TensorBoard event files) closed: after training, however it ended (a job that
        failed gets no on_train_end)."""
        if self.summaries is not None:
            self.summaries.close()

    def result(self, engine: Engine) -> FitResult:
        """The history (the checkpoint's rows, earlier processes' epochs included), the epoch whose weights the model
        ends with (early stopping's best when it restores them, else the last), and this process's time in its
        epochs (a pack's: the pack's epochs, validation included)."""
        history = self.checkpoint.history_frame()
        if history.empty:
            raise JobError("training produced no epoch (no training windows?)")
        last = self.checkpoint.rows[-1]
        epoch = last.early_stopping.best_epoch + 1 if self.restores_best else last.epoch
        val_loss = history.loc[history["epoch"] == epoch, "val_loss"].item()
        return FitResult(history=history, best_epoch=epoch, best_val_loss=float(val_loss),
                         step_seconds=self.timer.seconds, engine=engine, epoch_seconds=tuple(self.timer.epochs))
