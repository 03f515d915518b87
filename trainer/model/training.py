"""Fit one job: tf.data input, callbacks, per-epoch backups that survive kill -9, NaN detection, and
reuse of one compiled model across jobs of the same shape.
"""
from __future__ import annotations

import gc
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from ..data.windows import SplitWindows, Windows, float32
from ..errors import JobError
from ..heads import WarmStart
from .device import apply_precision, gpu_name
from .models import build_network, compile_settings
from .resume import assign
from .sequence import JobTraining
from .settings import INFERENCE_BATCH_SIZE, Engine, NetworkSpec, TrainConfig
from .trained import Events, FitResult

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- compiled-model reuse
class ModelCache:
    """Holds the compiled models (WindowTrainer) of the last few shapes, `size` of them, the least recently used
    dropped first.

    A fresh model costs seconds of graph tracing before its first step. For the next job of a spec and input shape
    held here, its model is reset instead: its weights, its dropout layers' random state and its optimizer state go
    back to the values a fresh build starts from (drawn from the config's seed; moments and step counters zero, a
    mixed-precision loss scale at its initial value), so its traced train step is reused and each job's result does
    not depend on which job ran before, of its shape or of another.

    Only a build seeds the random generators: reseeding TensorFlow clears its cache of instantiated functions, which
    costs every later job ~0.3 s of graph optimisation before its first step.

    A process has one (of_process), which every run in it shares: a notebook that runs twice, or runs one family
    after another and back, reuses the traced model of each of its last shapes too. What a model holds is small next
    to TensorFlow itself: its weights, its optimizer's moments and the copies it is reset from are ~9 MB for V7
    (368,064 parameters), ~34 MB for V8-stable (1,419,029).
    """
    _process: ClassVar[ModelCache | None] = None

    @classmethod
    def of_process(cls) -> ModelCache:
        """This process's one cache."""
        if cls._process is None:
            cls._process = cls()
        return cls._process

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._held: OrderedDict[str, _Held] = OrderedDict()  # signature -> model, the most recently used last
        self.builds = 0

    def model_for(self, spec: NetworkSpec, train: TrainConfig) -> WindowTrainer:
        key = model_signature(spec, train)
        held = self._held.get(key)
        if held is None:
            while len(self._held) >= self.size:
                self._drop(next(iter(self._held)))
            held = self._held[key] = _build(spec, train)
            self.builds += 1
        else:
            self._held.move_to_end(key)
            apply_precision(train.precision)  # the global policy is the model's again (another shape may have set it)
            assign(held.model.variables, held.initial_state)
            assign(held.model.optimizer.variables, held.initial_optimizer_state)  # the learning rate too
        return held.model

    def _drop(self, *keys: str) -> None:
        """Free models, in one collection. One alive when the run froze the heap (a previous run's in this process:
        pipeline.long_lived_frozen) is freed with the frozen objects let go for that one collection."""
        refreeze = gc.get_freeze_count() > 0
        for key in keys:
            del self._held[key]
        if refreeze:
            gc.unfreeze()
        gc.collect()
        if refreeze:
            gc.freeze()

    def forget(self) -> None:
        """Drop every model, the last one used may be in a broken state (after out-of-memory, say): the next
        model_for builds afresh."""
        self._drop(*self._held)


@dataclass(frozen=True, eq=False)
class _Held:
    model: WindowTrainer
    initial_state: list[np.ndarray]  # weights and dropout seed states
    initial_optimizer_state: list[np.ndarray]


def _build(spec: NetworkSpec, train: TrainConfig) -> _Held:
    """A new model and the state it starts from. Keras's global state is cleared first (its layer names start
    afresh, as in a fresh process) and what that resets is set again: the precision policy, the seeds. (Without a
    collection: a dropped model was collected as it went, _drop.)"""
    keras.backend.clear_session(free_memory=False)
    apply_precision(train.precision)
    keras.utils.set_random_seed(train.seed)
    network, warm_starts = build_network(spec, train)
    model = WindowTrainer(network, warm_starts)
    # The network's own optimizer, so that the model.keras it saves holds the trained state as before.
    model.compile(optimizer=network.optimizer, **compile_settings(spec.heads, train))
    initial_state = [v.numpy() for v in model.variables]
    # Built now rather than at the first step, so that its initial state can be kept too.
    model.optimizer.build(model.trainable_variables)
    return _Held(model, initial_state, [v.numpy() for v in model.optimizer.variables])


def model_signature(spec: NetworkSpec, train: TrainConfig) -> str:
    """What determines the graph and the initial weights: same signature, same compiled model."""
    return json.dumps({
        "model": spec.model.model_dump(mode="json"),
        "heads": [h.model_dump(mode="json") for h in spec.heads],
        "window": [spec.lookback, spec.horizon, spec.relative],
        "columns": spec.columns,  # their framing is traced into the train step (DeviceFeed)
        "train": train.model_dump(include={"optimizer", "clipvalue", "clipnorm", "precision",
                                           "steps_per_execution", "seed", "learning_rate"}),
    }, sort_keys=True)


# ----------------------------------------------------------------------------- fitting
def fit(model: WindowTrainer, windows: Windows, train: TrainConfig, backup_dir: Path, name: str, events: Events,
        tensorboard: Path | None = None, callbacks: Sequence[keras.callbacks.Callback] = ()) -> FitResult:
    """Train job `name` with early stopping (best weights restored), LR reduction and per-epoch backups: the job's
    sequence (sequence.JobTraining: its progress to `events`, its epoch logs under `tensorboard`), its epochs run by
    Keras's fit.

    If `backup_dir` holds the checkpoint of an interrupted run of this job, training resumes after its last
    finished epoch (see resume); if that run had ended training, none is trained. The backup is left in place:
    the caller deletes it once the job's artifacts are safe (trainer.model.resume has how).
    """
    job = JobTraining(model, train, backup_dir, name, events, tensorboard, callbacks)
    try:
        if job.trains:
            model.feed_for(windows)
        job.start(lambda: model.warm_start(windows.train))
        if job.trains:
            model.fit(DeviceFeed.batches(windows.train, train.batch_size, shuffle_seed=train.seed),
                      validation_data=DeviceFeed.batches(windows.val, INFERENCE_BATCH_SIZE),
                      initial_epoch=job.first_epoch, epochs=job.end, verbose=0, shuffle=False,  # shuffled by the feed
                      callbacks=job.callbacks)
    finally:
        job.close()
    return job.result(tensorflow_engine())


def tensorflow_engine() -> Engine:
    """Keras on TensorFlow, one job at a time, on its first GPU where it sees one."""
    gpus = tf.config.list_physical_devices("GPU")
    return Engine(name="tensorflow", jobs=1, precision=keras.mixed_precision.global_policy().name,
                  device=f"gpu: {gpu_name(gpus[0])}" if gpus else "cpu")


class WindowTrainer(keras.Model):
    """A network (models.build_model's functional model) trained on windows gathered on the device.

    Its train and test steps take batches of sample numbers (DeviceFeed.batches), gather their input windows
    and targets from its DeviceFeed, then do what keras.Model's own steps do. Everything else is the network's:
    calling the model (predict, predict_on_batch) calls the network, its variables and weights are the
    network's, in the network's order (what EpochCheckpoint saves), its input and output are the network's,
    and save() writes the network, a plain functional model that keras.saving.load_model reads without custom
    objects. The feed's variables are not among the model's: their shapes change from job to job.
    """

    def __init__(self, network: keras.Model, warm_starts: tuple[WarmStart, ...] = ()) -> None:
        # float32, a policy with nothing to cast: the network gets its inputs, and applies its precision policy,
        # as when it is called on its own.
        super().__init__(name=network.name, dtype="float32")
        self.network = network
        self.warm_starts = warm_starts  # its heads' (trainer.heads), each holding the layer it sets
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
        first = self.feed is None
        if first:
            self.feed = DeviceFeed(windows)
        self.feed.load(windows)
        if first:
            self._build_loss(windows.train)
        return self.feed

    def _build_loss(self, split: SplitWindows) -> None:
        """The compiled loss's state (the trackers of a model with several outputs), built on the split's first
        targets before the first step. Keras would build it inside the train step's first trace, and TensorFlow,
        seeing variables made there, traces the step a second time: 5.7 s of CPU at V7's first job, 2.3 s at the
        tiny test config's (2026-11-28). The outputs are zeros rather than the network's: calling it would advance
        its dropout's random state. The trackers are reset at each epoch's start, so these figures count nowhere."""
        rows = split.first_target_rows[:1]
        _, y = self.feed.gather(tf.constant(rows))
        zeros = keras.tree.map_structure(lambda out: tf.zeros((len(rows), *out.shape[1:]), out.dtype),
                                         self.network.output)
        self.compute_loss(y=y, y_pred=zeros)
        self.reset_metrics()

    def warm_start(self, split: SplitWindows) -> None:
        """Its heads' warm starts, from the split's samples as the model trains on them (the train split's, before
        the first epoch): in batches gathered from its feed, as numpy arrays (the inputs always by name)."""
        rows = split.first_target_rows
        batches = np.array_split(rows, math.ceil(len(rows) / INFERENCE_BATCH_SIZE)) if len(rows) else []
        for warm_start in self.warm_starts:
            warm_start(self._numpy(self.feed.gather(tf.constant(batch))) for batch in batches)

    @staticmethod
    def _numpy(batch: tuple) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        x, y = batch
        inputs = x if isinstance(x, dict) else {"inputs": x}
        return {k: v.numpy() for k, v in inputs.items()}, {k: v.numpy() for k, v in y.items()}

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
        self.heads = [(h.spec, prep.head_positions(h), h.shape) for h in prep.heads]
        # The inputs the heads read beside the windows, at every row (Windows.inputs)
        self.inputs = {name: tf.Variable(tf.zeros((0, *shape)), shape=tf.TensorShape([None, *shape]),
                                         trainable=False, name=f"device_feed_{name}")
                       for name, shape in prep.input_shapes.items()}

    def load(self, windows: Windows) -> None:
        """Replace the rows and scalers with this job's."""
        prep = windows.preprocessing
        self.rows.assign(windows.rows)
        for name, variable in self.inputs.items():
            if name not in windows.inputs:
                raise JobError(f"the model reads {name} beside the windows, which came without it "
                               "(Windows.with_forecasts)")
            variable.assign(windows.inputs[name])
        for (offset, scale), scaler in zip(self.scalers, [prep.scaler, *(h.scaler for h in prep.heads)],
                                           strict=True):
            offset.assign(float32(scaler.offset))
            scale.assign(float32(scaler.scale))

    def gather(self, first_target_rows: tf.Tensor) -> tuple[tf.Tensor | dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        """(inputs, targets per output) of the samples whose first target rows are given, as make_windows
        frames, scales and shapes them (in float32 here, float64 there); the inputs with those the heads read beside
        the windows, a dict of them ("inputs") and those."""
        first = first_target_rows[:, tf.newaxis]
        window = tf.gather(self.rows, first + tf.range(-self.lookback, 0))  # (batch, lookback, F)
        anchor = window[:, -1:, self.framing.anchor_column][:, :, tf.newaxis]  # (batch, 1, 1)
        (in_offset, in_scale), *head_scalers = self.scalers
        x = (self.framing.apply(window, anchor, tf.exp) - in_offset) / in_scale
        ahead = tf.gather(self.rows, first + tf.range(self.horizon))  # (batch, horizon, F)
        y = {}
        for (head, positions, shape), (offset, scale) in zip(self.heads, head_scalers):
            framed = self.framing.apply(tf.gather(ahead, positions, axis=2), anchor, tf.exp, columns=positions)
            y[head.name] = tf.reshape((framed - offset) / scale, (-1, *shape))
            y |= head.derived_targets(y[head.name])
        if not self.inputs:
            return x, y
        return {"inputs": x, **{k: tf.gather(v, first_target_rows - 1) for k, v in self.inputs.items()}}, y

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
