"""Fit one job: tf.data input, callbacks, per-epoch backups that survive kill -9, NaN detection, and
reuse of one compiled model across jobs of the same shape.
"""
from __future__ import annotations

import gc
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pandas as pd
import tensorflow as tf
from pydantic import BaseModel, TypeAdapter

from .config import RunConfig, TrainConfig
from .device import apply_precision
from .errors import JobError, first_line
from .evaluate import INFERENCE_BATCH_SIZE
from .files import atomic_write
from .models import build_model, compile_settings
from .windows import SplitWindows, Windows, float32

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- compiled-model reuse
class ModelCache:
    """Holds the one compiled model (a WindowTrainer) of the current shape.

    A fresh model costs seconds of graph tracing before its first step. For the next job of the same
    spec and input shape, the same model is reset instead: its weights, its dropout layers' random state
    and its optimizer state go back to the values a fresh build starts from (drawn from the config's seed;
    moments and step counters zero, a mixed-precision loss scale at its initial value), so its traced
    train step is reused and each job's result does not depend on which job ran before.

    Only a build seeds the random generators: reseeding TensorFlow clears its cache of instantiated
    functions, which costs every later job ~0.3 s of graph optimisation before its first step.
    """

    def __init__(self) -> None:
        self._key: str | None = None
        self._model: WindowTrainer | None = None
        self._initial_state: list[np.ndarray] = []  # weights and dropout seed states
        self._initial_optimizer_state: list[np.ndarray] = []
        self.builds = 0

    def model_for(self, cfg: RunConfig, n_features: int) -> WindowTrainer:
        key = model_signature(cfg, n_features)
        if key != self._key:
            # A new shape: drop the old graph and state, then restore what clear_session resets.
            gc.unfreeze()  # the old model was frozen with the rest between jobs (runner.release_free_memory)
            keras.backend.clear_session()
            apply_precision(cfg.train.precision)
            keras.utils.set_random_seed(cfg.train.seed)
            network = build_model(cfg, n_features)
            self._model = WindowTrainer(network)
            # The network's own optimizer, so that the model.keras it saves holds the trained state as before.
            self._model.compile(optimizer=network.optimizer, **compile_settings(cfg))
            self._initial_state = [v.numpy() for v in self._model.variables]
            # Built now rather than at the first step, so that its initial state can be kept too.
            self._model.optimizer.build(self._model.trainable_variables)
            self._initial_optimizer_state = [v.numpy() for v in self._model.optimizer.variables]
            self._key = key
            self.builds += 1
        else:
            _assign(self._model.variables, self._initial_state)
            _assign(self._model.optimizer.variables, self._initial_optimizer_state)  # the learning rate too
        return self._model


def _assign(variables: list, values: list[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def model_signature(cfg: RunConfig, n_features: int) -> str:
    """What determines the graph and the initial weights: same signature, same compiled model."""
    train = cfg.train.model_dump(include={"optimizer", "clipvalue", "clipnorm", "precision",
                                          "steps_per_execution", "seed", "learning_rate"})
    return json.dumps({
        "model": cfg.model.model_dump(mode="json"),
        "heads": [h.model_dump(mode="json") for h in cfg.heads],
        "window": [cfg.window.lookback, cfg.window.horizon, cfg.window.relative_to],
        "columns": cfg.features.columns,  # their framing is traced into the train step (DeviceFeed)
        "train": train,
        "n_features": n_features,
    }, sort_keys=True)


# ----------------------------------------------------------------------------- fitting
# In a job's backup directory: the weights training ended with, and the epochs' rows (history and the callbacks'
# counters). EpochCheckpoint and ResumableState name their other files.
FINISHED = "finished_weights.npz"
STATE = "state.json"


@dataclass
class FitResult:
    history: pd.DataFrame  # one row per epoch, including epochs run before a restart
    best_epoch: int  # 1-based
    best_val_loss: float
    step_seconds: float  # time inside train steps in this process (for overhead accounting)


def fit(model: WindowTrainer, windows: Windows, cfg: RunConfig, backup_dir: Path,
        callbacks: list[keras.callbacks.Callback] = ()) -> FitResult:
    """Train with early stopping (best weights restored), LR reduction and per-epoch backups.

    If `backup_dir` holds the state of an interrupted run of this job, training resumes after its last
    finished epoch (see resume). The backup is left in place: the caller deletes it once the job's artifacts
    are safe.
    """
    train = cfg.train
    restores_best = bool(train.early_stopping and train.early_stopping.restore_best_weights)
    resumed = resume(backup_dir, model)  # weights, optimizer state: the epoch to go on at
    state = ResumableState(backup_dir, resumed)
    if resumed.finished:  # killed after training, before the artifacts were safe: nothing to re-train
        return _result(state, restores_best, step_seconds=0.0)

    model.feed_for(windows)
    train_data = DeviceFeed.batches(windows.train, train.batch_size, shuffle_seed=train.seed)
    val_data = DeviceFeed.batches(windows.val, INFERENCE_BATCH_SIZE)

    early_stopping = reduce_lr = None
    standard: list[keras.callbacks.Callback] = [StopOnNaN()]
    if train.early_stopping:
        early_stopping = keras.callbacks.EarlyStopping(**train.early_stopping.model_dump())
        standard.append(early_stopping)
    if train.reduce_lr:
        reduce_lr = keras.callbacks.ReduceLROnPlateau(**train.reduce_lr.model_dump())
        standard.append(reduce_lr)
    state.early_stopping, state.reduce_lr = early_stopping, reduce_lr
    # The checkpoint of an epoch is written last, once everything the epoch changed is saved: a job killed at
    # any moment resumes from a checkpointed epoch whose history row and best weights are on disk too.
    standard += [state, EpochCheckpoint(backup_dir)]
    timer = StepTimer()
    # A job that early stopping had ended when it was killed trains no further epoch on resume.
    epochs = state.stopped_at(train.early_stopping.patience if train.early_stopping else None) or train.epochs
    model.fit(train_data, validation_data=val_data, initial_epoch=resumed.epochs, epochs=epochs, verbose=0,
              shuffle=False, callbacks=[*standard, timer, *callbacks])  # shuffled above
    save_weights(backup_dir / FINISHED, model.get_weights())
    return _result(state, restores_best, step_seconds=timer.seconds)


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
            _assign(model.variables, weights)
            _assign(model.optimizer.variables, optimizer_state)
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


def _result(state: ResumableState, restores_best: bool, step_seconds: float) -> FitResult:
    """The history, and the epoch whose weights the model ends with: early stopping's best when it restores
    them, else the last."""
    history = state.history_frame()
    if history.empty:
        raise JobError("training produced no epoch (no training windows?)")
    last = state.rows[-1]
    epoch = last["early_stopping"]["best_epoch"] + 1 if restores_best else last["epoch"]
    val_loss = history.loc[history["epoch"] == epoch, "val_loss"].item()
    return FitResult(history=history, best_epoch=epoch, best_val_loss=float(val_loss), step_seconds=step_seconds)


class WindowTrainer(keras.Model):
    """A network (models.build_model's functional model) trained on windows gathered on the device.

    Its train and test steps take batches of sample numbers (DeviceFeed.batches), gather their input windows
    and targets from its DeviceFeed, then do what keras.Model's own steps do. Everything else is the network's:
    calling the model (predict, predict_on_batch) calls the network, its variables and weights are the
    network's, in the network's order (what EpochCheckpoint saves), its input and output are the network's,
    and save() writes the network, a plain functional model that keras.saving.load_model reads without custom
    objects. The feed's variables are not among the model's: their shapes change from job to job.
    """

    def __init__(self, network: keras.Model) -> None:
        # float32, a policy with nothing to cast: the network gets its inputs, and applies its precision policy,
        # as when it is called on its own.
        super().__init__(name=network.name, dtype="float32")
        self.network = network
        self.output_names = network.output_names  # compile() pairs the losses with the outputs in this order
        self.feed: DeviceFeed | None = None  # a plain object: Keras does not track the variables it holds
        self.built = True  # the network is

    @property
    def input(self):
        return self.network.input

    @property
    def output(self):
        return self.network.output

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def feed_for(self, windows: Windows) -> DeviceFeed:
        """The model's feed, loaded with this job's rows and scalers. Made at the model's first job: its gather
        is traced into the train and test steps once, and a reused model's feed only gets the next job's rows
        and scalers."""
        if self.feed is None:
            self.feed = DeviceFeed(windows)
        self.feed.load(windows)
        return self.feed

    def train_step(self, first_target_rows):
        return super().train_step(self._batch(first_target_rows))

    def test_step(self, first_target_rows):
        return super().test_step(self._batch(first_target_rows))

    def _batch(self, first_target_rows: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        if self.feed is None:
            raise RuntimeError("WindowTrainer: no job's windows to train on; call feed_for(windows) first")
        return self.feed.gather(first_target_rows)

    def save(self, filepath, *args, **kwargs):
        """Saves the network (with its compile settings and its optimizer's state, shared with this model)."""
        return self.network.save(filepath, *args, **kwargs)


class DeviceFeed:
    """Training input without materialised windows, placed on the training device once per job.

    A job's encoded rows (Windows.rows, a few hundred KB) and its scalers are written into variables on the
    device that trains (the GPU when there is one). tf.data carries only batches of sample numbers (each
    sample's first target row); WindowTrainer's train and test steps gather each batch's input windows and
    targets from those variables, then frame and scale them, on the device, as make_windows does on the host.
    So per batch only a few bytes of indices cross to the device, and no (N, lookback, F) copy of the data
    is made for training.

    One per model (WindowTrainer.feed_for), made at its first fit: its gather is traced into the model's train
    step once and a reused model only gets the next job's rows and scalers.
    """

    def __init__(self, windows: Windows) -> None:
        prep = windows.preprocessing
        n_features = windows.rows.shape[1]
        self.rows = tf.Variable(tf.zeros((0, n_features)), shape=tf.TensorShape([None, n_features]),
                                trainable=False, name="device_feed_rows")
        self.scalers = [(tf.Variable(tf.zeros(len(scaler.columns)), trainable=False),
                         tf.Variable(tf.ones(len(scaler.columns)), trainable=False))
                        for scaler in [prep.scaler, *(h.scaler for h in prep.heads)]]
        # The window, the feature columns, their framing and the heads are part of the model's signature
        # (model_signature), so they stay as traced.
        self.lookback, self.horizon, self.framing = prep.lookback, prep.horizon, prep.framing
        self.heads = [(h.name, prep.head_positions(h), h.shape) for h in prep.heads]

    def load(self, windows: Windows) -> None:
        """Replace the rows and scalers with this job's."""
        prep = windows.preprocessing
        self.rows.assign(windows.rows)
        for (offset, scale), scaler in zip(self.scalers, [prep.scaler, *(h.scaler for h in prep.heads)],
                                           strict=True):
            offset.assign(float32(scaler.offset))
            scale.assign(float32(scaler.scale))

    def gather(self, first_target_rows: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """(inputs, targets per head) of the samples whose first target rows are given, as make_windows
        frames, scales and shapes them (in float32 here, float64 there)."""
        first = first_target_rows[:, tf.newaxis]
        window = tf.gather(self.rows, first + tf.range(-self.lookback, 0))  # (batch, lookback, F)
        anchor = window[:, -1:, self.framing.anchor_column][:, :, tf.newaxis]  # (batch, 1, 1)
        (in_offset, in_scale), *head_scalers = self.scalers
        x = (self.framing.apply(window, anchor, tf.exp) - in_offset) / in_scale
        ahead = tf.gather(self.rows, first + tf.range(self.horizon))  # (batch, horizon, F)
        y = {}
        for (name, positions, shape), (offset, scale) in zip(self.heads, head_scalers):
            framed = self.framing.apply(tf.gather(ahead, positions, axis=2), anchor, tf.exp, columns=positions)
            y[name] = tf.reshape((framed - offset) / scale, (-1, *shape))
        return x, y

    @staticmethod
    def batches(split: SplitWindows, batch_size: int, shuffle_seed: int | None = None) -> tf.data.Dataset:
        """The split's sample numbers in batches, the next one ready while the previous one trains.

        tf.data's autotuning is off: it has nothing to tune in batches of integers, and tearing down the
        last epoch's autotuned iterator stalled every few epochs' start by 0.2-0.3 s."""
        data = tf.data.Dataset.from_tensor_slices(split.first_target_rows)
        if shuffle_seed is not None:
            data = data.shuffle(len(split.first_target_rows), seed=shuffle_seed, reshuffle_each_iteration=True)
        options = tf.data.Options()
        options.autotune.enabled = False
        return data.batch(batch_size).prefetch(1).with_options(options)


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


class Diverged(JobError):
    """Training diverged: its loss is no longer a finite number. Whether the data or the settings are to blame
    is for the caller to tell (pipeline.train_one)."""


class StopOnNaN(keras.callbacks.Callback):
    """A NaN or infinite loss ends the job with a recorded error (Keras's TerminateOnNaN stops silently).
    Checked on each epoch's mean loss, which a non-finite batch makes non-finite too: a per-batch check
    would make every step wait for the device."""

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise Diverged(f"loss became {float(loss)} in epoch {epoch + 1}")


class StepTimer(keras.callbacks.Callback):
    """Seconds spent in train steps (each epoch up to its validation), to tell training time from per-job
    overhead. Timed per epoch, not per batch: a per-batch callback makes every step wait for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self._epoch_start: float | None = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()

    def on_test_begin(self, logs=None):  # validation: the epoch's train steps are over
        self._stop()

    def on_epoch_end(self, epoch, logs=None):  # an epoch without validation
        self._stop()

    def _stop(self) -> None:
        if self._epoch_start is not None:
            self.seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None


class ReportProgress(keras.callbacks.Callback):
    """Tells a progress display (reporting.JobProgress) the job's epoch count and the epoch it starts at (after
    the checkpointed ones of an interrupted run), then each epoch's losses."""

    def __init__(self, display) -> None:
        super().__init__()
        self.display = display
        self._first_epoch: int | None = None

    def on_train_begin(self, logs=None):
        self._first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is None:
            self._first_epoch = epoch
            self.display.training_started(self.params["epochs"], done=epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.display.epoch_ended(epoch, logs or {})


class ResumableState(keras.callbacks.Callback):
    """Makes EarlyStopping, ReduceLROnPlateau and the epoch history survive a restart.

    EpochCheckpoint restores weights, optimizer state and the epoch counter, but not the other
    callbacks' counters nor the best weights seen so far: without them a resumed job would wait longer
    to stop and could restore a worse model than an uninterrupted one. Each epoch's row holds those
    counters, and whether early stopping ended training; on restart the row of the last backed-up epoch
    is applied (resume() drops the rows of epochs that will be re-run). The best weights are kept per epoch,
    so that the ones the last backed-up row names are still there whatever epoch was under way.
    Must come after EarlyStopping and ReduceLROnPlateau, and before EpochCheckpoint.
    """

    def __init__(self, backup_dir: Path, resumed: Resumed) -> None:
        super().__init__()
        self.dir = backup_dir
        self.path = backup_dir / STATE
        self.early_stopping = self.reduce_lr = None  # set by fit, once it has made them
        self.rows: list[dict] = list(resumed.rows)
        self._best_weights = resumed.best_weights

    def stopped_at(self, patience: int | None) -> int | None:
        """The epoch early stopping ended training at, if the backed-up state says it did and early stopping with
        `patience` (None: off) would have too: a job extended with more patience goes on."""
        last = self.rows[-1] if self.rows else {}
        if not last.get("stopped") or patience is None or last.get("early_stopping", {}).get("wait", 0) < patience:
            return None
        return last["epoch"]

    def on_train_begin(self, logs=None):
        if not self.rows:
            return
        last = self.rows[-1]
        if self.early_stopping and last.get("early_stopping"):
            vars(self.early_stopping).update(last["early_stopping"])
            if self._best_weights is not None:
                self.early_stopping.best_weights = self._best_weights
        if self.reduce_lr and last.get("reduce_lr"):
            vars(self.reduce_lr).update(last["reduce_lr"])

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()},
               "stopped": bool(self.model.stop_training)}
        row["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        es = self.early_stopping
        if es is not None:
            row["early_stopping"] = {"wait": es.wait, "best": float(es.best), "best_epoch": es.best_epoch}
            if es.best_epoch == epoch and es.best_weights is not None:
                save_weights(_best_path(self.dir, epoch), es.best_weights)
        if self.reduce_lr is not None:
            rl = self.reduce_lr
            row["reduce_lr"] = {"wait": rl.wait, "best": float(rl.best), "cooldown_counter": rl.cooldown_counter}
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
