"""Resume, in one place: what a job's backup directory holds and how training goes on from it after a kill, an
interruption or a longer budget.

A job's backup directory (RUN/.backup/JOB) holds one file per epoch, written by EpochCheckpoint:
  checkpoint.npz           everything training needs to go on after the last finished epoch: the model's
                           weights, the optimizer's state, early stopping's best weights, and every epoch's row
                           so far (losses, learning rate, whether training stopped, early stopping's and LR
                           reduction's counters from their own state())
  checkpoint.previous.npz  the epoch before's, for resume() to fall back on
Each epoch the previous file becomes the next one's temp file (written over in place, then renamed into place): no
checkpoint file is ever deleted, so none piles up in a cloud drive's trash.
No mark says that training has ended: it has when the last checkpoint reaches the budget's epochs, or early
stopping had ended it (Resumed.end), so a longer budget goes on from the same file.
resume() reads back the newest checkpoint that is whole; resumable_callbacks() makes early stopping and LR
reduction go on from it. budget_plan() decides what a finished job needs when train.epochs or the patience change
(replay_budget replays early stopping's own rule, ResumableEarlyStopping.observe, over the recorded epochs).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import pandas as pd
from pydantic import BaseModel, TypeAdapter

from ..errors import first_line
from ..files import atomic_write, temp_path
from .settings import BUDGET_KEYS, TrainConfig

log = logging.getLogger(__name__)

# In a job's backup directory, newest first.
CHECKPOINTS = ("checkpoint.npz", "checkpoint.previous.npz")


class EarlyStoppingState(BaseModel, extra="forbid"):
    wait: int
    best: float
    best_epoch: int  # 0-based, as Keras counts


class ReduceLrState(BaseModel, extra="forbid"):
    wait: int
    best: float
    cooldown_counter: int


class EpochRow(BaseModel, extra="forbid"):
    """One epoch as a checkpoint records it: what history.csv shows of it, and what going on after it needs."""
    epoch: int  # 1-based
    logs: dict[str, float]  # its losses, metrics and learning rate, in history.csv's column order
    stopped: bool  # training stopped after it (early stopping)
    early_stopping: EarlyStoppingState | None = None
    reduce_lr: ReduceLrState | None = None


_ROWS = TypeAdapter(list[EpochRow])


@dataclass(frozen=True)
class Resumed:
    """Where an earlier run of a job left off, as resume() read it back from the job's backup directory."""
    epochs: int  # the epochs done, which training goes on after (0: a fresh start)
    rows: list[EpochRow]
    best_weights: list[np.ndarray] | None = None  # early stopping's best so far

    def end(self, train: TrainConfig) -> int:
        """The epoch training ends after: train.epochs, or the last one done when early stopping had ended
        training there and would with train's patience too (a job extended with more patience goes on).
        Training has ended when it is the epochs done."""
        last = self.rows[-1] if self.rows else None
        patience = train.early_stopping.patience if train.early_stopping else None
        if last is None or not last.stopped or patience is None \
                or (last.early_stopping.wait if last.early_stopping else 0) < patience:
            return train.epochs
        return last.epoch


def resume(backup_dir: Path, model: keras.Model) -> Resumed:
    """Load into `model` the newest checkpoint that an earlier run of this job left in `backup_dir` and that reads
    back whole, every array checked against the model: the latest; else the one before it; else nothing: a fresh
    start.

    Nothing a kill, a full disk or a damaged file leaves there can fail the job: whatever is unusable is named
    in one warning, with what training does instead. (Keras's BackupAndRestore writes its file in place and
    falls back only on OSError: a kill while it wrote left a truncated file that failed every later run.)"""
    unusable: list[str] = []
    for path in checkpoint_paths(backup_dir):
        if not path.exists():
            continue
        try:
            checkpoint = Checkpoint.read(path, model)
        except Exception as exc:  # whatever is wrong with the file, the job goes on without it
            unusable.append(f"{path.name} unusable ({type(exc).__name__}: {first_line(exc)})")
            continue
        assign(model.variables, checkpoint.weights)
        assign(model.optimizer.variables, checkpoint.optimizer_state)
        if unusable:
            log.warning("%s: %s; going on after epoch %d (%s)", backup_dir, "; ".join(unusable), checkpoint.epoch,
                        path.name)
        if checkpoint.engine not in (None, keras.backend.backend()):  # Keras's state is the same on both
            log.warning("%s: going on after epoch %d on Keras's %s backend, from a checkpoint trained on %s",
                        backup_dir.name, checkpoint.epoch, keras.backend.backend(), checkpoint.engine)
        return Resumed(checkpoint.epoch, checkpoint.rows, checkpoint.best_weights)
    if unusable:
        log.warning("%s: %s; training this job from its first epoch", backup_dir, "; ".join(unusable))
        for path in checkpoint_paths(backup_dir):  # never to be mixed with the epochs to come
            path.unlink(missing_ok=True)
    return Resumed(0, [])


def checkpoint_paths(backup_dir: Path) -> tuple[Path, Path]:
    """A job's latest checkpoint and the one before it."""
    latest, previous = (backup_dir / name for name in CHECKPOINTS)
    return latest, previous


# ----------------------------------------------------------------------------- the training budget
def replay_budget(history: pd.DataFrame, train: TrainConfig) -> int | None:
    """The epoch (1-based) at which `train`'s epochs and early stopping would have ended a training that went as
    `history` records (its rows, one per epoch, hold the monitored values), or None when it would go on after
    the recorded epochs. Early stopping decides as it does in training (ResumableEarlyStopping.observe)."""
    limit = train.epochs if train.epochs <= len(history) else None
    if train.early_stopping is not None:
        early_stopping = ResumableEarlyStopping(**train.early_stopping.model_dump(),
                                                mode=_mode(train.early_stopping.monitor))
        early_stopping.on_train_begin()
        for epoch, logs in enumerate(history.to_dict("records")[:limit]):
            if early_stopping.observe(epoch, early_stopping.get_monitor_value(logs)).stops:
                return epoch + 1
    return limit


@dataclass(frozen=True)
class BudgetPlan:
    action: str  # keep | extend | retrain
    reason: str


def budget_plan(train: TrainConfig, trained: TrainConfig, history: Callable[[], pd.DataFrame],
                backup: Path) -> BudgetPlan | None:
    """What a finished job needs when the config's training budget (BUDGET_KEYS) is not the one it `trained` with;
    None when it is. Its recorded epochs (`history`, read when needed: its history.csv) are replayed against the
    new budget (replay_budget):
    - the new budget would have stopped it before its last epoch: trained again from scratch (the weights of
      that epoch are not kept);
    - it would have stopped at the same epoch: kept as it is;
    - it would have gone on: training goes on from its last epoch's checkpoint, as if never stopped (from
      scratch when no checkpoint was kept)."""
    changes = [f"{key} {old} -> {new}" for key, old, new in zip(BUDGET_KEYS, _budget(trained), _budget(train))
               if old != new]
    if not changes:
        return None
    epochs = history()
    stop, ran = replay_budget(epochs, train), len(epochs)
    if stop == ran:
        return BudgetPlan("keep", f"{', '.join(changes)}: trains it the same ({ran} epochs)")
    if stop is None and any(path.exists() for path in checkpoint_paths(backup)):
        return BudgetPlan("extend", f"{', '.join(changes)}: training goes on after epoch {ran}")
    why = f"would have stopped at epoch {stop} of its {ran}" if stop is not None else "no checkpoint kept to go on from"
    return BudgetPlan("retrain", f"{', '.join(changes)}: trained again from scratch ({why})")


def _budget(train: TrainConfig) -> tuple[int, int | None]:
    """train's values of BUDGET_KEYS, in that order."""
    return train.epochs, train.early_stopping.patience if train.early_stopping else None


# ----------------------------------------------------------------------------- the checkpoint
@dataclass(frozen=True)
class Checkpoint:
    """What one checkpoint file holds, checked against the model it is for."""
    epoch: int  # the epochs done (1-based: the last one's number)
    rows: list[EpochRow]  # theirs, epochs 1, 2, ...
    weights: list[np.ndarray]  # the model's variables
    optimizer_state: list[np.ndarray]  # the optimizer's variables (moments, step count, learning rate)
    best_weights: list[np.ndarray] | None  # early stopping's best weights (model.weights), when it keeps them
    engine: str | None = None  # the Keras backend that trained it ("tensorflow", "jax"); None: not recorded

    def arrays(self) -> dict[str, np.ndarray]:
        """As the .npz holds them: the epoch, the rows as JSON, the engine, and the arrays by kind and position."""
        return {"epoch": np.asarray(self.epoch), "rows": np.asarray(json.dumps([r.model_dump() for r in self.rows])),
                **({"engine": np.asarray(self.engine)} if self.engine else {}),
                **{f"w{i}": value for i, value in enumerate(self.weights)},
                **{f"o{i}": value for i, value in enumerate(self.optimizer_state)},
                **{f"b{i}": value for i, value in enumerate(self.best_weights or ())}}

    @staticmethod
    def read(path: Path, model: keras.Model) -> Checkpoint:
        """The checkpoint in `path`; ValueError (or whatever reading it raised) unless every part is one that
        `model` can go on from."""
        with np.load(path) as saved:
            if "rows" not in saved.files and "w0" in saved.files:
                raise ValueError("written by a cryptotrain before 2026-11-26, whose checkpoints hold no epoch rows")
            epoch = int(saved["epoch"])
            rows = _ROWS.validate_json(saved["rows"].item())
            weights = [saved[f"w{i}"] for i in range(len(model.variables))]
            optimizer_state = [saved[f"o{i}"] for i in range(len(model.optimizer.variables))]
            best = [saved[f"b{i}"] for i in range(len(model.weights))] if "b0" in saved.files else None
            engine = str(saved["engine"]) if "engine" in saved.files else None
        if epoch < 1 or [row.epoch for row in rows] != list(range(1, epoch + 1)):
            raise ValueError(f"its rows are not those of epochs 1-{epoch}")
        _check_arrays("weight", weights, model.variables)
        _check_arrays("optimizer", optimizer_state, model.optimizer.variables)
        if best is not None:
            _check_arrays("best weight", best, model.weights)
        return Checkpoint(epoch, rows, weights, optimizer_state, best, engine)


def _check_arrays(kind: str, values: list[np.ndarray], variables: list) -> None:
    """ValueError unless `values` are numbers shaped as `variables`, one for one."""
    if len(values) != len(variables):
        raise ValueError(f"{len(values)} {kind} arrays, the model has {len(variables)}")
    for value, variable in zip(values, variables):
        if tuple(value.shape) != tuple(variable.shape) or value.dtype.kind not in "biuf":
            raise ValueError(f"{kind} {variable.path}: {value.dtype} {value.shape}, the model's {variable.shape}")


class EpochCheckpoint(keras.callbacks.Callback):
    """At each epoch's end, everything training needs to go on after it (a Checkpoint: weights, optimizer state,
    early stopping's best weights, every epoch's row with the resumable callbacks' state()) in one file, written
    atomically and read back before it counts; the previous epoch's file is kept beside it, for resume() to fall
    back on. Must come after the callbacks whose state it records.

    In two steps: its on_epoch_end takes the epoch's state (on the host: its arrays, its row), and its `writer`, a
    callback of its own that comes right after it, writes what it took. Keras's fit fires them one after the other;
    a pack fires the writer, and the callbacks after it, while the next epoch trains (packed.Pack).

    Declared safe to run in the background: it does nothing per batch, so the device never waits for a batch's
    loss to reach Python."""
    async_safe = True

    def __init__(self, backup_dir: Path, resumed: Resumed, early_stopping: ResumableEarlyStopping | None,
                 reduce_lr: ResumableReduceLROnPlateau | None) -> None:
        super().__init__()
        self.latest, self.previous = checkpoint_paths(backup_dir)
        self.early_stopping, self.reduce_lr = early_stopping, reduce_lr
        self.rows: list[EpochRow] = list(resumed.rows)
        self.writer = CheckpointWriter(self)
        self._taken: Checkpoint | None = None  # the epoch's, until the writer writes it

    def on_epoch_end(self, epoch, logs=None):
        model, early_stopping = self.model, self.early_stopping
        history = {k: float(v) for k, v in (logs or {}).items()}
        history["learning_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        self.rows.append(EpochRow(epoch=epoch + 1, logs=history, stopped=bool(model.stop_training),
                                  early_stopping=early_stopping.state() if early_stopping else None,
                                  reduce_lr=self.reduce_lr.state() if self.reduce_lr else None))
        self._taken = Checkpoint(epoch + 1, list(self.rows), [keras.ops.convert_to_numpy(v) for v in model.variables],
                                 [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables],
                                 early_stopping.best_weights if early_stopping else None, keras.backend.backend())

    def write(self) -> None:
        """Write the checkpoint the last epoch's end took (nothing if written already)."""
        checkpoint, self._taken = self._taken, None
        if checkpoint is None:
            return
        if self.latest.exists():
            # The one before the previous is written over in place, never deleted: on a cloud drive (Google Drive in
            # Colab) a deleted or replaced file goes to the trash, which counts against the quota for 30 days.
            if self.previous.exists():
                os.replace(self.previous, temp_path(self.latest))  # killed now: the latest is still there
            os.replace(self.latest, self.previous)  # killed now: the previous one is still there
        atomic_write(self.latest, lambda tmp: self._write(tmp, checkpoint.arrays()))
        Checkpoint.read(self.latest, self.model)  # a checkpoint that does not read back is an error now, not at resume

    @staticmethod
    def _write(tmp: Path, arrays: dict[str, np.ndarray]) -> None:
        np.savez(tmp, **arrays)

    def history_frame(self) -> pd.DataFrame:
        """Per epoch: the losses, metrics and learning rate (not the callbacks' bookkeeping)."""
        return pd.DataFrame([{"epoch": row.epoch, **row.logs} for row in self.rows])


class CheckpointWriter(keras.callbacks.Callback):
    """Writes what its EpochCheckpoint took at the epoch's end (EpochCheckpoint.writer): the callbacks after it see
    an epoch whose checkpoint is on disk."""
    async_safe = True

    def __init__(self, checkpoint: EpochCheckpoint) -> None:
        super().__init__()
        self.checkpoint = checkpoint

    def on_epoch_end(self, epoch, logs=None):
        self.checkpoint.write()


# ----------------------------------------------------------------------------- callbacks that go on
class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """Keras's EarlyStopping, whose counters go on after a restart: `state()` is what an epoch's row keeps of it;
    given the row's state (and the best weights) it starts from there instead of afresh. Its rule, observe(),
    needs no model, so that replay_budget can replay it over a recorded history."""

    def __init__(self, resumed: EarlyStoppingState | None = None, best_weights: list[np.ndarray] | None = None,
                 **settings) -> None:
        super().__init__(**settings)
        self._resumed, self._resumed_best_weights = resumed, best_weights

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resumed:
            self.wait, self.best, self.best_epoch = self._resumed.wait, self._resumed.best, self._resumed.best_epoch
            if self._resumed_best_weights is not None:
                self.best_weights = self._resumed_best_weights

    def on_epoch_end(self, epoch, logs=None):
        seen = self.observe(epoch, self.get_monitor_value(logs))
        if seen.improved and self.restore_best_weights:
            self.best_weights = self.model.get_weights()
        if seen.stops:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def observe(self, epoch: int, value: float | None) -> Observed:
        """Keras's EarlyStopping rule for one epoch's monitored value, counted in: an improvement on the best (by
        min_delta) resets the wait; patience epochs without one stop training (never after the first epoch).
        A missing value counts for nothing. (Keras's own on_epoch_end does this with the model in hand; the
        settings here leave out what else it does: no baseline, no warm-up epochs, and the best weights are
        those of an improving epoch, the first being one.)"""
        if value is None:
            return Observed(improved=False, stops=False)
        self.wait += 1
        if self.improves(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return Observed(improved=True, stops=False)
        return Observed(improved=False, stops=self.wait >= self.patience and epoch > 0)

    def improves(self, value: float) -> bool:
        """Whether `value` beats the best so far by more than min_delta, in the direction `mode` says ("auto": a
        loss goes down; the trainer compiles no other metric), compared in float32 as Keras compares it."""
        if self.mode == "auto" and self.monitor.removeprefix("val_") != "loss":
            raise ValueError(f"early_stopping.monitor {self.monitor}: whether it should go up or down is "
                             "unknown (a loss goes down: loss, val_loss, or a head's, e.g. val_ohlc_loss)")
        if self.best is None:
            return True
        if self.mode == "max":
            return bool(np.float32(value - self.min_delta) > np.float32(self.best))
        return bool(np.float32(value + self.min_delta) < np.float32(self.best))

    def state(self) -> EarlyStoppingState:
        return EarlyStoppingState(wait=self.wait, best=float(self.best), best_epoch=self.best_epoch)


@dataclass(frozen=True)
class Observed:
    improved: bool  # the epoch's value is the new best
    stops: bool  # training stops after the epoch


class ResumableReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
    """Keras's ReduceLROnPlateau, whose counters go on after a restart (the learning rate itself is the
    optimizer's, in the epoch checkpoint)."""

    def __init__(self, resumed: ReduceLrState | None = None, **settings) -> None:
        super().__init__(**settings)
        self._resumed = resumed

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resumed:
            self.wait, self.best, self.cooldown_counter = (self._resumed.wait, self._resumed.best,
                                                           self._resumed.cooldown_counter)

    def state(self) -> ReduceLrState:
        return ReduceLrState(wait=self.wait, best=float(self.best), cooldown_counter=self.cooldown_counter)


def resumable_callbacks(train: TrainConfig, resumed: Resumed) -> tuple[ResumableEarlyStopping | None,
                                                                      ResumableReduceLROnPlateau | None]:
    """train's early stopping and LR reduction (None where off), going on from the last resumed epoch's row."""
    last = resumed.rows[-1] if resumed.rows else None
    early_stopping = ResumableEarlyStopping(last and last.early_stopping, resumed.best_weights,
                                            **train.early_stopping.model_dump(),
                                            mode=_mode(train.early_stopping.monitor)) if train.early_stopping else None
    reduce_lr = ResumableReduceLROnPlateau(last and last.reduce_lr, **train.reduce_lr.model_dump(),
                                           mode=_mode(train.reduce_lr.monitor)) if train.reduce_lr else None
    return early_stopping, reduce_lr


def _mode(monitor: str) -> str:
    """A loss goes down - the whole one, or a head's (val_ohlc_loss): Keras's mode "auto" tells it from the
    compiled metrics, which do not hold a head's loss."""
    return "min" if monitor.endswith("loss") else "auto"


def assign(variables: list, values: list[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
