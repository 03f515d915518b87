"""Resume, in one place: what a job's backup directory holds and how training goes on from it after a kill, an
interruption or a longer budget.

A job's backup directory (RUN/.backup/JOB) holds, after each epoch:
  checkpoint.npz (and checkpoint.previous.npz)  weights, optimizer state and the epoch (EpochCheckpoint)
  state.json                                    one row per epoch: losses, learning rate, whether training
                                                stopped, early stopping's and LR reduction's counters
                                                (ResumableState, from the callbacks' own state())
  best_weights_epochN.npz                       early stopping's best weights, as the last rows name them
  finished_weights.npz                          the weights training ended with, once it has (FINISHED)
resume() reads back the newest state that is whole; resumable_callbacks() makes early stopping and LR reduction
go on from it. budget_plan() decides what a finished job needs when train.epochs or the patience change
(replay_budget replays Keras's own EarlyStopping over the recorded epochs).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, TypeAdapter

from .config import BUDGET_KEYS, TrainConfig
from .errors import first_line
from .files import atomic_write

log = logging.getLogger(__name__)

# In a job's backup directory: the weights training ended with, and the epochs' rows (history and the callbacks'
# counters). EpochCheckpoint and ResumableState name their other files.
FINISHED = "finished_weights.npz"
STATE = "state.json"


@dataclass(frozen=True)
class Resumed:
    """Where an earlier run of a job left off, as resume() read it back from the job's backup directory."""
    epochs: int  # the epochs done, which training goes on after (0: a fresh start)
    rows: list[dict]  # their rows (state.json)
    best_weights: list[np.ndarray] | None = None  # early stopping's best so far, as the last row names them
    finished: bool = False  # training had ended: the model holds the weights it ended with


def resume(backup_dir: Path, model: keras.Model) -> Resumed:
    """Load into `model` the newest state that an earlier run of this job left in `backup_dir` and that reads back
    whole, every file checked against the model: the weights training ended with; else the latest epoch
    checkpoint (weights, optimizer state) whose epochs' rows and best weights are usable too; else the checkpoint
    before it; else nothing: a fresh start.

    Nothing a kill, a full disk or a damaged file leaves there can fail the job: whatever is unusable is named
    in one warning, with what training does instead. (Keras's BackupAndRestore writes its file in place and
    falls back only on OSError: a kill while it wrote left a truncated file that failed every later run.)"""
    checkpoint, finished = EpochCheckpoint(backup_dir), backup_dir / FINISHED
    unusable: list[str] = []

    def unusable_because(path: Path, exc: Exception) -> None:
        unusable.append(f"{path.name} unusable ({type(exc).__name__}: {first_line(exc)})")

    try:
        rows = _read_rows(backup_dir / STATE)
    except Exception as exc:  # the epochs' history is lost: no checkpoint can be gone on from
        unusable_because(backup_dir / STATE, exc)
    else:
        if rows and finished.exists():
            try:
                model.set_weights(load_weights(finished, model))
                return Resumed(len(rows), rows, finished=True)
            except Exception as exc:
                unusable_because(finished, exc)
        for path in checkpoint.paths:
            if not path.exists():
                continue
            try:
                epoch, weights, optimizer_state = checkpoint.read(path, model)
                if epoch > len(rows):
                    raise ValueError(f"{STATE} has no row for its epoch {epoch}")
                best = _best_weights(backup_dir, rows[epoch - 1], model)
            except Exception as exc:  # whatever is wrong with the file, the job goes on without it
                unusable_because(path, exc)
                continue
            assign(model.variables, weights)
            assign(model.optimizer.variables, optimizer_state)
            if unusable:
                log.warning("%s: %s; going on after epoch %d (%s)", backup_dir, "; ".join(unusable), epoch, path.name)
            return Resumed(epoch, rows[:epoch], best)
    if unusable:
        log.warning("%s: %s; training this job from its first epoch", backup_dir, "; ".join(unusable))
        for path in (*checkpoint.paths, finished, backup_dir / STATE):  # never to be mixed with the epochs to come
            path.unlink(missing_ok=True)
    return Resumed(0, [])


def replay_budget(history: pd.DataFrame, train: TrainConfig) -> int | None:
    """The epoch (1-based) at which `train`'s epochs and early stopping would have ended a training that went as
    `history` records (its rows, one per epoch, hold the monitored values), or None when it would go on after
    the recorded epochs. Keras's own EarlyStopping decides, replayed over the record."""
    limit = train.epochs if train.epochs <= len(history) else None
    if train.early_stopping is not None:
        early_stopping = keras.callbacks.EarlyStopping(**{**train.early_stopping.model_dump(),
                                                          "restore_best_weights": False})
        stops = SimpleNamespace(stop_training=False)  # all of a model that EarlyStopping touches
        early_stopping.set_model(stops)
        early_stopping.on_train_begin()
        for epoch, logs in enumerate(history.to_dict("records")[:limit]):
            early_stopping.on_epoch_end(epoch, logs)
            if stops.stop_training:
                return epoch + 1
    return limit


@dataclass(frozen=True)
class BudgetPlan:
    action: str  # keep | extend | retrain
    reason: str


def budget_plan(train: TrainConfig, job_dir: Path, backup: Path) -> BudgetPlan | None:
    """What a finished job needs when the config's training budget (BUDGET_KEYS) is not the one it trained with;
    None when it is. Its recorded epochs are replayed against the new budget (replay_budget):
    - the new budget would have stopped it before its last epoch: trained again from scratch (the weights of
      that epoch are not kept);
    - it would have stopped at the same epoch: kept as it is;
    - it would have gone on: training goes on from its last epoch's checkpoint, as if never stopped (from
      scratch when no checkpoint was kept)."""
    trained = TrainConfig.model_validate(yaml.safe_load((job_dir / "config.yaml").read_text())["train"])
    changes = [f"{key} {old} -> {new}" for key, old, new in zip(BUDGET_KEYS, _budget(trained), _budget(train))
               if old != new]
    if not changes:
        return None
    history = pd.read_csv(job_dir / "history.csv")
    stop, ran = replay_budget(history, train), len(history)
    if stop == ran:
        return BudgetPlan("keep", f"{', '.join(changes)}: trains it the same ({ran} epochs)")
    if stop is None and EpochCheckpoint(backup).exists():
        return BudgetPlan("extend", f"{', '.join(changes)}: training goes on after epoch {ran}")
    why = f"would have stopped at epoch {stop} of its {ran}" if stop is not None else "no checkpoint kept to go on from"
    return BudgetPlan("retrain", f"{', '.join(changes)}: trained again from scratch ({why})")


def _budget(train: TrainConfig) -> tuple[int, int | None]:
    """train's values of BUDGET_KEYS, in that order."""
    return train.epochs, train.early_stopping.patience if train.early_stopping else None


# ----------------------------------------------------------------------------- callbacks
class EpochCheckpoint(keras.callbacks.Callback):
    """Everything training needs to go on after an epoch — the model's weights, the optimizer's state (moments,
    step count, learning rate) and the epoch — saved at the epoch's end in one file, written atomically, and
    read back before it counts; the previous epoch's file is kept beside it, for resume() to fall back on.

    Declared safe to run in the background: it does nothing per batch, so the device never waits for a batch's
    loss to reach Python."""
    async_safe = True

    def __init__(self, backup_dir: Path) -> None:
        super().__init__()
        self.latest, self.previous = backup_dir / "checkpoint.npz", backup_dir / "checkpoint.previous.npz"
        self.paths = (self.latest, self.previous)  # newest first

    def exists(self) -> bool:
        return self.latest.exists() or self.previous.exists()

    def on_epoch_end(self, epoch, logs=None):
        if self.latest.exists():
            os.replace(self.latest, self.previous)  # killed right after this: the previous one is still there
        model, optimizer = self.model, self.model.optimizer
        arrays = {"epoch": np.asarray(epoch + 1),
                  **{f"w{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.variables)},
                  **{f"o{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(optimizer.variables)}}
        atomic_write(self.latest, lambda tmp: self._write(tmp, arrays))
        self.read(self.latest, model)  # a checkpoint that does not read back is an error now, not at resume

    @staticmethod
    def _write(tmp: Path, arrays: dict[str, np.ndarray]) -> None:
        np.savez(tmp, **arrays)

    @staticmethod
    def read(path: Path, model: keras.Model) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
        """The checkpoint's epoch, weights and optimizer state, checked against the model's variables."""
        with np.load(path) as saved:
            epoch = int(saved["epoch"])
            weights = [saved[f"w{i}"] for i in range(len(model.variables))]
            optimizer_state = [saved[f"o{i}"] for i in range(len(model.optimizer.variables))]
        _check_arrays("weight", weights, model.variables)
        _check_arrays("optimizer", optimizer_state, model.optimizer.variables)
        if epoch < 1:
            raise ValueError(f"epoch {epoch}")
        return epoch, weights, optimizer_state


def _check_arrays(kind: str, values: list[np.ndarray], variables: list) -> None:
    """ValueError unless `values` are numbers shaped as `variables`, one for one."""
    if len(values) != len(variables):
        raise ValueError(f"{len(values)} {kind} arrays, the model has {len(variables)}")
    for value, variable in zip(values, variables):
        if tuple(value.shape) != tuple(variable.shape) or value.dtype.kind not in "biuf":
            raise ValueError(f"{kind} {variable.path}: {value.dtype} {value.shape}, the model's {variable.shape}")


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """Keras's EarlyStopping, whose counters go on after a restart: `state()` is what an epoch's row keeps of it;
    given the row's state (and the best weights it names) it starts from there instead of afresh."""

    def __init__(self, resumed: dict | None = None, best_weights: list[np.ndarray] | None = None, **settings) -> None:
        super().__init__(**settings)
        self._resumed, self._resumed_best_weights = resumed, best_weights

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resumed:
            self.wait, self.best, self.best_epoch = (self._resumed[k] for k in ("wait", "best", "best_epoch"))
            if self._resumed_best_weights is not None:
                self.best_weights = self._resumed_best_weights

    def state(self) -> dict:
        return {"wait": self.wait, "best": float(self.best), "best_epoch": self.best_epoch}


class ResumableReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
    """Keras's ReduceLROnPlateau, whose counters go on after a restart (the learning rate itself is the
    optimizer's, in the epoch checkpoint)."""

    def __init__(self, resumed: dict | None = None, **settings) -> None:
        super().__init__(**settings)
        self._resumed = resumed

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resumed:
            self.wait, self.best, self.cooldown_counter = (self._resumed[k]
                                                           for k in ("wait", "best", "cooldown_counter"))

    def state(self) -> dict:
        return {"wait": self.wait, "best": float(self.best), "cooldown_counter": self.cooldown_counter}


def resumable_callbacks(train: TrainConfig, resumed: Resumed) -> tuple[ResumableEarlyStopping | None,
                                                                      ResumableReduceLROnPlateau | None]:
    """train's early stopping and LR reduction (None where off), going on from the last resumed epoch's row."""
    last = resumed.rows[-1] if resumed.rows else {}
    early_stopping = ResumableEarlyStopping(last.get("early_stopping"), resumed.best_weights,
                                            **train.early_stopping.model_dump()) if train.early_stopping else None
    reduce_lr = ResumableReduceLROnPlateau(last.get("reduce_lr"), **train.reduce_lr.model_dump()) \
        if train.reduce_lr else None
    return early_stopping, reduce_lr


class ResumableState(keras.callbacks.Callback):
    """Writes each epoch's row - its losses and learning rate, whether training stopped, and the resumable
    callbacks' state() - to state.json, and keeps early stopping's best weights per epoch, so that the ones the
    last backed-up row names are still there whatever epoch was under way. On a restart resume() reads the rows
    back (dropping those of epochs that will be re-run) and resumable_callbacks() goes on from the last one.
    Must come after the callbacks it records, and before EpochCheckpoint.
    """

    def __init__(self, backup_dir: Path, resumed: Resumed, early_stopping: ResumableEarlyStopping | None,
                 reduce_lr: ResumableReduceLROnPlateau | None) -> None:
        super().__init__()
        self.dir = backup_dir
        self.path = backup_dir / STATE
        self.early_stopping, self.reduce_lr = early_stopping, reduce_lr
        self.rows: list[dict] = list(resumed.rows)

    def stopped_at(self, patience: int | None) -> int | None:
        """The epoch early stopping ended training at, if the backed-up state says it did and early stopping with
        `patience` (None: off) would have too: a job extended with more patience goes on."""
        last = self.rows[-1] if self.rows else {}
        if not last.get("stopped") or patience is None or last.get("early_stopping", {}).get("wait", 0) < patience:
            return None
        return last["epoch"]

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()},
               "stopped": bool(self.model.stop_training)}
        row["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        es = self.early_stopping
        if es is not None:
            row["early_stopping"] = es.state()
            if es.best_epoch == epoch and es.best_weights is not None:
                save_weights(_best_path(self.dir, epoch), es.best_weights)
        if self.reduce_lr is not None:
            row["reduce_lr"] = self.reduce_lr.state()
        self.rows.append(row)
        atomic_write(self.path, lambda tmp: tmp.write_text(json.dumps(self.rows)))
        # Best weights no row that a restart could resume from still names (this one, or the last backed up).
        named = {_best_path(self.dir, r["early_stopping"]["best_epoch"]) for r in self.rows[-2:]
                 if "early_stopping" in r}
        for path in self.dir.glob("best_weights_epoch*.npz"):
            if path not in named:
                path.unlink()

    def history_frame(self) -> pd.DataFrame:
        """Per epoch: the losses, metrics and learning rate (not the callbacks' bookkeeping)."""
        flat = [{k: v for k, v in row.items() if not isinstance(v, (dict, bool))} for row in self.rows]
        return pd.DataFrame(flat)


def _best_path(backup_dir: Path, epoch: int) -> Path:
    """Where the best weights of a (0-based) epoch are kept."""
    return backup_dir / f"best_weights_epoch{epoch + 1}.npz"


def _best_weights(backup_dir: Path, row: dict, model: keras.Model) -> list[np.ndarray] | None:
    """The best weights a row names, checked against the model; None where it names none (no early stopping, or
    none kept: restore_best_weights off)."""
    if "early_stopping" not in row:
        return None
    path = _best_path(backup_dir, row["early_stopping"]["best_epoch"])
    try:
        return load_weights(path, model) if path.exists() else None
    except Exception as exc:
        raise ValueError(f"its best weights {path.name}: {type(exc).__name__}: {first_line(exc)}") from None


class _EarlyStoppingRow(BaseModel, extra="forbid"):
    wait: int
    best: float
    best_epoch: int


class _ReduceLrRow(BaseModel, extra="forbid"):
    wait: int
    best: float
    cooldown_counter: int


class _EpochRow(BaseModel, extra="allow"):
    """One epoch's row of state.json, as ResumableState writes it: the losses and metrics (the extra keys)."""
    __pydantic_extra__: dict[str, float]
    epoch: int
    stopped: bool
    learning_rate: float
    early_stopping: _EarlyStoppingRow | None = None
    reduce_lr: _ReduceLrRow | None = None


_ROWS = TypeAdapter(list[_EpochRow])


def _read_rows(path: Path) -> list[dict]:
    """state.json's rows, checked (ValueError otherwise): epochs 1, 2, ... each as ResumableState writes it.
    None written yet: none."""
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    _ROWS.validate_python(rows)
    if [row["epoch"] for row in rows] != list(range(1, len(rows) + 1)):
        raise ValueError("its rows are not those of epochs 1, 2, ...")
    return rows


def save_weights(path: Path, weights: list[np.ndarray]) -> None:
    """Weights as a plain .npz, atomically: ~2 ms against ~25 ms for Keras's .weights.h5 at these sizes, and the
    best weights are saved at every improving epoch."""
    atomic_write(path, lambda tmp: np.savez(tmp, *weights))


def load_weights(path: Path, model: keras.Model) -> list[np.ndarray]:
    """Weights save_weights wrote, checked against the model's (ValueError when they are not its)."""
    with np.load(path) as saved:
        weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    _check_arrays("weight", weights, model.weights)
    return weights


def assign(variables: list, values: list[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
