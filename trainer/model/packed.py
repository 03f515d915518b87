"""Packed training (JAX): K jobs that share a model signature train together, one compiled step for all of them,
each exactly as if alone.

A small recurrent model's training step is latency-bound on an accelerator: one job at a time leaves a GPU mostly
idle (../shared/docs/gpu.md measured 14.5x the one-job rate at K = 40 on an H100). So the family's own Keras model is
built once, and K copies of its state — weights, dropout seed states, optimizer state (moments, step count, learning
rate) — are stacked on a leading axis; one step maps Keras 3's stateless training computation
(`model.compute_loss_and_updates`, `optimizer.stateless_apply`, what `fit` runs on the JAX backend) over them with
`jax.vmap`, each job on its own batch, and an epoch's steps run in one compiled loop (`jax.lax.scan`: no
dispatch from the host between steps). There is no second implementation of the model's layers.

Each job trains as it would alone:
- its own batches: its train windows in an order drawn from (seed, epoch) (`batch_order`), the last batch of an
  epoch as short as it is (padded to the step's shape with zero-weighted samples, the others weighted so that the
  loss is the mean over the real ones); a job with fewer batches is idle for the rest of the epoch;
- its own loss (the packed loss is never summed across jobs: each job's gradient is of its own mean), Adam moments,
  step count, clipping and learning rate, and its own dropout draws (its seed states, advanced by its own steps and
  validation passes, as Keras's fit advances them);
- its own epoch: its training loss (the batches' mean weighted by their sizes, as Keras logs it), its validation
  loss, and its own callbacks, fired as Keras's fit fires them (on_epoch_begin before the epoch trains,
  on_epoch_end after its validation): anything that drives a model through `JobView`, the job's slice of the pack
  seen as a model. A job's sequence (sequence.JobTraining: resume from its own checkpoint, early stopping, LR
  reduction, the non-finite rule, its epoch checkpoint, its timer) gives them, as it gives a job trained alone
  its own. The pack's state crosses to the host in one transfer an epoch; the callbacks that decide the next
  epoch (early stopping, LR reduction, the checkpoint taking the state; the timer) run then, and its observers (the
  checkpoint's writer, progress) once the next epoch is on its way: the device does not wait for the
  disk (the last epoch's run when the caller says: Pack.end, beside the jobs' evaluation), and its times (the step
  timer's, the epoch's) end when the device's work does, not when the observers do, as a job's alone leave them out;
- a job that has stopped, or that a callback failed (StopOnNaN: its loss is no longer finite), is frozen: its
  weights, moments and step count stay as they are (not just given zero gradients) while the others go on.

Imports no TensorFlow: it runs where only JAX is installed (KERAS_BACKEND=jax).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import keras
import numpy as np

from ..data.windows import Windows, float32
from ..heads import WarmStart
from .settings import INFERENCE_BATCH_SIZE
from .trained import Forecasts

if TYPE_CHECKING:
    from .sequence import JobTraining

Arrays = np.ndarray | dict[str, np.ndarray]


@dataclass
class PackedJob:
    """One job of a pack: its train and validation inputs and targets (numpy, as the model takes them), its seed
    (its batch order), and the callbacks that see it as a model (JobView) each epoch."""
    name: str
    x_train: Arrays
    y_train: dict[str, np.ndarray]
    x_val: Arrays
    y_val: dict[str, np.ndarray]
    seed: int
    x_test: Arrays | None = None  # its test inputs, which Pack.forecasts runs the trained model on
    callbacks: Sequence[keras.callbacks.Callback] = ()
    # fired after `callbacks`, each its hooks in order, while the next epoch trains: callbacks that change nothing of
    # the job's state (its checkpoint's writer, progress: sequence.JobTraining's observers)
    observers: Sequence[keras.callbacks.Callback] = ()
    epoch: int = 0  # the epochs it has done (an interrupted run's: JobTraining.first_epoch)
    end: int | None = None  # the epoch it trains to (None: Pack.train's `epochs`)
    # filled in by training
    history: list[dict[str, float]] = field(default_factory=list)
    # each epoch's wall time, its pack's (the same for every job that trained in it): from its begin until its
    # validation was done, as a job's alone (the observers of the epoch before, which ran meanwhile, not in it)
    epoch_seconds: list[float] = field(default_factory=list)
    error: Exception | None = None  # what failed the job (a callback's: StopOnNaN's Diverged), else None
    view: JobView | None = None  # the job as a model (its weights), once packed

    def follow(self, training: JobTraining) -> None:
        """Train as the job's sequence says (sequence.JobTraining, made on its view): its deciding callbacks, its
        observers, the epochs it has done and the one it ends at."""
        self.callbacks, self.observers = training.deciding, training.observers
        self.epoch, self.end = training.first_epoch, training.end


@dataclass(frozen=True)
class JobState:
    """A job's state as its pack left it, on the host: what its model is evaluated and saved with."""
    variables: list[np.ndarray]  # in the model's variables' order (its weights, its dropout seed states)
    optimizer_variables: list[np.ndarray]  # in its optimizer's variables' order
    pack: int  # the jobs it trained with, itself included


def windows_job(name: str, windows: Windows, seed: int) -> PackedJob:
    """A job's windows as a pack trains on them: its train and validation inputs (with those its heads read beside
    the windows) and its targets, each head's derived ones too (as training.DeviceFeed gathers them)."""
    def targets(split) -> dict[str, np.ndarray]:
        y = dict(split.y)
        for head in windows.preprocessing.heads:
            y |= head.spec.derived_targets(y[head.name])
        return {output: float32(values) for output, values in y.items()}
    return PackedJob(name, windows.train.x, targets(windows.train), windows.val.x, targets(windows.val), seed=seed,
                     x_test=windows.test.x)


def batch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order a job's n train windows are taken in, in an epoch: the same for a job packed and alone."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _length(x: Arrays) -> int:
    return len(next(iter(x.values())) if isinstance(x, dict) else x)


def _pad(values: list[np.ndarray], length: int) -> np.ndarray:
    """The jobs' arrays stacked (K, length, ...), each padded with zeros after its own rows."""
    out = np.zeros((len(values), length, *values[0].shape[1:]), np.float32)
    for k, value in enumerate(values):
        out[k, :len(value)] = value
    return out


def _stack(items: list, length: int):
    """Per-job nested arrays (dicts of arrays, or arrays) -> one of (K, length, ...) arrays."""
    return jax.tree.map(lambda *values: jnp.asarray(_pad(list(values), length)), *items)


class Pack:
    """K jobs of one model signature, trained together (train). `model` is the family's compiled Keras model (on the
    JAX backend); every job starts from its weights as they are, and from a fresh optimizer state (then its
    JobView's assignments: a checkpoint's, Pack.warm_start)."""

    def __init__(self, model: keras.Model, jobs: Sequence[PackedJob], batch_size: int,
                 validation_batch_size: int, steps: PackSteps | None = None) -> None:
        """`steps`: an earlier pack's of the same model (its `steps`), whose compiled epochs this one reuses."""
        if keras.backend.backend() != "jax":
            raise RuntimeError(f"packed training runs on Keras's JAX backend, not {keras.backend.backend()}")
        self.model, self.jobs = model, list(jobs)
        self.batch_size, self.validation_batch_size = batch_size, validation_batch_size
        model.optimizer.build(model.trainable_variables)
        self._trainable = [v for v in model.trainable_variables]
        self._non_trainable = [v for v in model.non_trainable_variables]
        self._optimizer = [v for v in model.optimizer.variables]
        # Where each of model.variables (its weights and its dropout layers' seed states) and model.weights lives
        # in the stacked state
        where = {id(v): ("trainable", i) for i, v in enumerate(self._trainable)}
        where |= {id(v): ("non_trainable", i) for i, v in enumerate(self._non_trainable)}
        self._variables = [where[id(v)] for v in model.variables]
        self._weights = [where[id(v)] for v in model.weights]
        self.state = {group: [jnp.stack([v.value] * len(self.jobs)) for v in variables]
                      for group, variables in (("trainable", self._trainable), ("non_trainable", self._non_trainable))}
        self.state["optimizer"] = [jnp.asarray(np.stack([v.numpy()] * len(self.jobs))) for v in self._optimizer]
        # The state as the host last fetched it, in one transfer (Pack.train, at an epoch's end), which the jobs'
        # callbacks read instead of each variable of each job crossing on its own (and their assignments keep in
        # step); while an epoch trains, the state it started from (what the observers read meanwhile); None before
        # training
        self._host: dict | None = None
        self._ended: list[tuple[int, int, dict]] = []  # the last epoch's, for end()
        for k, job in enumerate(self.jobs):
            job.view = JobView(self, k)
        # Every job's windows, each padded to the longest job's, on the device once
        self._n_train = [_length(job.x_train) for job in self.jobs]
        self._n_val = [_length(job.x_val) for job in self.jobs]
        self._train_data = (_stack([j.x_train for j in self.jobs], max(self._n_train)),
                            _stack([j.y_train for j in self.jobs], max(self._n_train)))
        self._val_data = (_stack([j.x_val for j in self.jobs], max(self._n_val)),
                          _stack([j.y_val for j in self.jobs], max(self._n_val)))
        self.steps = steps or PackSteps(model, (self.jobs[0].x_train, self.jobs[0].y_train))

    def states(self) -> list[JobState]:
        """Each job's state on the host: the copy its last epoch brought over (kept in step with the callbacks'
        assignments, a restore of the best weights too), else one transfer of the pack's state off the device."""
        state = self._host if self._host is not None else jax.device_get(self.state)
        return [JobState([state[group][i][k] for group, i in self._variables],
                         [values[k] for values in state["optimizer"]], len(self.jobs)) for k in range(len(self.jobs))]

    def forecasts(self) -> list[Forecasts]:
        """Each job's model outputs on its validation and test windows (every job needs its x_test), from the pack's
        state as training left it (its best weights, where early stopping restored them): one compiled pass a split,
        mapped over the jobs (PackSteps.predict), as the validation pass is; no job's forward pass runs on its own,
        nor eagerly. The train windows are given back first: the test windows take their room on the device."""
        started = time.perf_counter()
        for array in jax.tree.leaves(self._train_data):
            array.delete()
        self._train_data = None
        weights = {"trainable": self.state["trainable"], "non_trainable": self.state["non_trainable"]}
        n_test = [_length(job.x_test) for job in self.jobs]
        splits = []
        for x, lengths in ((self._val_data[0], self._n_val),
                           (_stack([job.x_test for job in self.jobs], max(n_test)), n_test)):
            rows, *_ = _batches([np.arange(n) for n in lengths], self.validation_batch_size,
                                np.ones(len(self.jobs), bool))
            outputs = jax.device_get(self.steps.predict(weights, x, rows))  # (steps, jobs, batch, ...) an output
            splits.append([{name: values[:, k].reshape(-1, *values.shape[3:])[:n] for name, values in outputs.items()}
                           for k, n in enumerate(lengths)])
        share = (time.perf_counter() - started) / len(self.jobs)
        return [Forecasts(val, test, share) for val, test in zip(*splits, strict=True)]

    def release(self) -> None:
        """Frees the pack's device buffers (its jobs' state and windows) now, rather than whenever the collector
        reaches the pack (its jobs' views and compiled steps refer back to it): the next pack trains in their room.
        The jobs' views cannot be read after."""
        for array in jax.tree.leaves((self.state, self._train_data, self._val_data)):
            array.delete()
        self.state, self._train_data, self._val_data = {}, None, None

    # ------------------------------------------------------------------ epochs
    def warm_start(self, job: PackedJob, warm_starts: Sequence[WarmStart]) -> None:
        """The heads' warm starts (models.build_network's, each holding the layer of the pack's model it sets) on
        the job's train split, from the job's weights: its weights after them. What training.WindowTrainer's
        warm_start does for a job trained alone, one job at a time through the pack's model."""
        for variable, value in zip(self.model.variables, job.view.variables, strict=True):
            variable.assign(value.numpy())
        n, x = _length(job.x_train), job.x_train if isinstance(job.x_train, dict) else {"inputs": job.x_train}

        def batches():
            for start in range(0, n, INFERENCE_BATCH_SIZE):
                rows = slice(start, start + INFERENCE_BATCH_SIZE)
                yield {k: v[rows] for k, v in x.items()}, {k: v[rows] for k, v in job.y_train.items()}
        for warm_start in warm_starts:
            warm_start(batches())
        job.view.set_weights([variable.numpy() for variable in self.model.weights])

    def train(self, epochs: int) -> None:
        """Train every job from the epochs it has done to `epochs` (or the earlier end resume set), or until
        its early stopping stops it, or it fails. Each epoch of the pack is the next epoch of every job that
        trains: jobs resumed after different epochs go on from their own. The last epoch's observers are left to
        end(), which the caller runs beside what follows (its checkpoints need not delay the jobs' evaluation)."""
        jobs, n_train, n_val = self.jobs, self._n_train, self._n_val
        (x, y), (x_val, y_val) = self._train_data, self._val_data
        ends = [epochs if job.end is None else min(epochs, job.end) for job in jobs]
        self._host = jax.device_get(self.state)  # what the callbacks read before the first epoch
        for job, end in zip(jobs, ends, strict=True):
            for callback in (*job.callbacks, *job.observers):
                callback.set_model(job.view)
                callback.set_params({"epochs": end, "verbose": 0})  # as fit gives them theirs
                callback.on_train_begin()
        ended: list[tuple[int, int, dict]] = []  # (job, epoch, logs) whose observers have not seen that epoch end
        while True:
            began = time.perf_counter()
            # each job's epoch begins before it trains, as fit fires it (its callbacks read the weights it starts at)
            running = [k for k, job in enumerate(jobs) if job.view.running and job.epoch < ends[k]
                       and _fire(job, job.callbacks, "on_epoch_begin", job.epoch)]
            if not running:  # the last epoch's observers are end()'s
                self._ended = ended
                break
            # the epoch, dispatched: the device trains it while the host goes on below
            active = np.isin(np.arange(len(jobs)), running)
            orders = [batch_order(n, job.seed, job.epoch) for n, job in zip(n_train, jobs)]
            self.state, train_sum = self.steps.train_epoch(self.state, x, y,
                                                          *_batches(orders, self.batch_size, active))
            weights = {"trainable": self.state["trainable"], "non_trainable": self.state["non_trainable"]}
            val_batches = _batches([np.arange(n) for n in n_val], self.validation_batch_size, active)
            val_sum, self.state["non_trainable"] = self.steps.val_epoch(weights, x_val, y_val, *val_batches)
            # its training steps done (validation, dispatched, runs on): the step timer stops at that moment,
            # whatever the host is doing then
            validated = _when_done(train_sum, val_sum, [jobs[k] for k in running])
            # Meanwhile the observers see the last epoch end (its checkpoint written, then progress)
            # and this one begin: they read the host's copy of the state that epoch ended with (self._host)
            for k, epoch, logs in ended:
                _observed_end(jobs[k], epoch, logs)
            for k in running:
                _fire(jobs[k], jobs[k].observers, "on_epoch_begin", jobs[k].epoch)
            seconds = validated() - began  # the epoch's, as a job's alone: its steps and validation, not observers
            train_sum, val_sum, self._host = jax.device_get((train_sum, val_sum, self.state))  # one transfer
            ended = []
            for k in running:  # not one that an observer failed while the epoch trained: the epoch is not its
                job, epoch = jobs[k], jobs[k].epoch
                # as Keras's fit logs them: each the mean over the epoch's samples, then validation's
                logs = {name: float(total[k]) / n_train[k] for name, total in train_sum.items()}
                logs |= {f"val_{name}": float(total[k]) / max(n_val[k], 1) for name, total in val_sum.items()}
                if _epoch_ended(job, job.callbacks, epoch, logs):
                    job.history.append(logs)
                    job.epoch += 1
                    ended.append((k, epoch, logs))
            for k, _, _ in ended:
                jobs[k].epoch_seconds.append(seconds)
        for job in jobs:
            if not job.view.failed:
                for callback in job.callbacks:
                    callback.on_train_end()

    def end(self) -> None:
        """What `train` leaves to its caller, to run beside what comes next (the jobs' evaluation), the pack's buffers
        released or not: the last epoch's observers (its checkpoint written, then progress), then their
        on_train_end. An observer that fails fails its job (its `error`)."""
        for k, epoch, logs in self._ended:
            _observed_end(self.jobs[k], epoch, logs)
        self._ended = []
        for job in self.jobs:
            if not job.view.failed:
                for callback in job.observers:
                    callback.on_train_end()


class PackSteps:
    """A model's packed epoch, compiled: its training steps over the jobs' batches in one loop, its validation
    pass, and its forward pass (predict: evaluation's), each mapped over the jobs (jax.vmap) and jitted once per
    shape. Holds no job, so that a later pack of the same model (the next pack of a family, each half after an
    out-of-memory) reuses them as they are: it traces and compiles nothing anew (Pack's `steps`)."""

    def __init__(self, model: keras.Model, first: tuple) -> None:
        """`first`: a job's train inputs and targets, whose first sample builds the model's compiled metrics."""
        self.model = model
        # What an epoch logs besides the loss, as Keras's fit logs it: each output's loss (a model of several
        # outputs), kept by its compiled metrics, which one evaluated batch builds
        model.test_on_batch(*jax.tree.map(lambda a: a[:1], first))
        position = {id(variable): i for i, variable in enumerate(model.metrics_variables)}
        self._logged = [(metric.name, position[id(metric.variables[0])], position[id(metric.variables[1])])
                        for metric in model.metrics if metric.name != "loss"]
        # The state is donated: an epoch writes the jobs' new state over the old in place, never holding both
        self.train_epoch = jax.jit(self._train_scan, donate_argnums=0)
        self.val_epoch = jax.jit(self._val_scan)
        self.predict = jax.jit(self._predict_scan)

    def _loss(self, trainable, non_trainable, x, y, weight, training: bool, optimizer=None):
        """compute_loss_and_updates of one job's batch, the padding weighted 0 (Keras's fit computes the same), and
        what its epoch logs of it: the loss, and each output's (as Keras's fit logs them: unweighted)."""
        # The metrics' variables, which compute_loss_and_updates also updates, are the model's own: what a job's
        # epoch logs comes from its batches' losses (Pack._epoch), not from them.
        metrics = [jnp.zeros(v.shape, v.dtype) for v in self.model.metrics_variables]
        # Each sample's weight over the values its loss averages (a loss reduces its target's last axis first)
        weights = jax.tree.map(
            lambda target: jnp.broadcast_to(weight.reshape(-1, *[1] * (target.ndim - 2)), target.shape[:-1]), y)
        loss, (unscaled, _, non_trainable, metrics) = self.model.compute_loss_and_updates(
            trainable, non_trainable, metrics, x, y, weights, training=training, optimizer_variables=optimizer)
        # each output's loss, as its compiled metric (a mean: total / count) holds it after this one batch
        logs = {"loss": unscaled} | {name: metrics[total] / metrics[count] for name, total, count in self._logged}
        return loss, (logs, non_trainable)

    def _job_step(self, state, x, y, rows, weight, n, active):
        """One job's training step on its batch `rows` of its arrays (x, y): its state after the step (as before
        when it is not active) and its batch's logs times its n samples."""
        batch_x, batch_y = jax.tree.map(lambda a: a[rows], (x, y))

        def loss(trainable):
            return self._loss(trainable, state["non_trainable"], batch_x, batch_y, weight, True, state["optimizer"])

        (_, (logs, non_trainable)), grads = jax.value_and_grad(loss, has_aux=True)(state["trainable"])
        trainable, optimizer = self.model.optimizer.stateless_apply(state["optimizer"], grads, state["trainable"])
        new = {"trainable": trainable, "non_trainable": non_trainable, "optimizer": optimizer}
        new = jax.tree.map(lambda after, before: jnp.where(active, after, before), new, state)
        return new, jax.tree.map(lambda value: jnp.where(active, value * n, 0.0), logs)

    def _job_loss(self, state, x, y, rows, weight, n):
        """One job's validation logs on its batch `rows`, times its n samples (0 for an empty batch), and its
        non-trainable state after the batch."""
        batch_x, batch_y = jax.tree.map(lambda a: a[rows], (x, y))
        _, (logs, non_trainable) = self._loss(state["trainable"], state["non_trainable"], batch_x, batch_y, weight,
                                              False)
        return jax.tree.map(lambda value: jnp.where(n > 0, value * n, 0.0), logs), non_trainable

    def _train_scan(self, state, x, y, rows, weight, n, active):
        """An epoch's training steps (rows, weight, n, active: one per step, _batches) in one compiled loop: the
        state after it, and each job's sum of its batches' losses times their sizes."""
        step = jax.vmap(self._job_step)

        def body(carry, batch):
            state, total = carry
            state, logs = step(state, x, y, *batch)
            return (state, jax.tree.map(jnp.add, total, logs)), None
        (state, total), _ = jax.lax.scan(body, (state, self._zero_logs(n.shape[1])), (rows, weight, n, active))
        return state, total

    def _val_scan(self, weights, x, y, rows, weight, n, active):
        """A validation pass (_batches) in one compiled loop: each job's sum of its batches' logs times their
        sizes, and its non-trainable state after them (a recurrent layer's dropout draws its seeds in inference too,
        and Keras's evaluate keeps what they advanced to)."""
        step = jax.vmap(self._job_loss)

        def body(carry, batch):
            non_trainable, total = carry
            rows, weight, n, active = batch
            state = {"trainable": weights["trainable"], "non_trainable": non_trainable}
            logs, after = step(state, x, y, rows, weight, n * active)
            non_trainable = jax.tree.map(lambda new, old: jnp.where(_per_job(active, old), new, old), after,
                                         non_trainable)
            return (non_trainable, jax.tree.map(jnp.add, total, logs)), None
        (non_trainable, total), _ = jax.lax.scan(body, (weights["non_trainable"], self._zero_logs(n.shape[1])),
                                                 (rows, weight, n, active))
        return total, non_trainable

    def _predict_scan(self, weights, x, rows):
        """The model's outputs in inference (as Keras's predict_step computes them) for each job's batches `rows`
        (S, K, B) of its inputs x, in one compiled loop: each output (S, K, B, ...)."""
        def job_outputs(trainable, non_trainable, x, rows):
            outputs, _ = self.model.stateless_call(trainable, non_trainable, jax.tree.map(lambda a: a[rows], x),
                                                   training=False)
            return outputs
        step = jax.vmap(job_outputs)

        def body(carry, rows):
            return carry, step(weights["trainable"], weights["non_trainable"], x, rows)
        _, outputs = jax.lax.scan(body, None, rows)
        return outputs

    def _zero_logs(self, jobs: int) -> dict:
        return {name: jnp.zeros(jobs) for name in ("loss", *(name for name, _, _ in self._logged))}


def _when_done(train_sum, val_sum, running: list[PackedJob]) -> Callable[[], float]:
    """Waits for the device on a thread of its own while the host goes on: for an epoch's training steps
    (`train_sum` ready), then fires the `running` jobs' on_test_begin there, at that moment (their validation
    begins, as fit fires it: the step timer stops); then for its validation (`val_sum`). Returns the wait's end: it
    joins the thread, raises what the device raised (out of memory, say) and returns when the validation was done
    (time.perf_counter)."""
    outcome: list[float | BaseException] = []

    def wait() -> None:
        try:
            jax.block_until_ready(train_sum)
            for job in running:
                _fire(job, job.callbacks, "on_test_begin")
            jax.block_until_ready(val_sum)
            outcome.append(time.perf_counter())
        except BaseException as exc:  # the host's to raise
            outcome.append(exc)

    thread = threading.Thread(target=wait, name="pack-epoch-done", daemon=True)
    thread.start()

    def validated() -> float:
        thread.join()
        if isinstance(done := outcome[0], BaseException):
            raise done
        return done
    return validated


def _fire(job: PackedJob, callbacks: Sequence[keras.callbacks.Callback], hook: str, *args) -> bool:
    """Each of the job's `callbacks`' `hook`, in turn, unless the job has failed. False where it has, or one raised:
    as that ends fit, it fails this job alone (StopOnNaN's Diverged, say), which is frozen from then on."""
    if job.view.failed:
        return False
    try:
        for callback in callbacks:
            getattr(callback, hook)(*args)
    except Exception as exc:
        job.error, job.view.failed = exc, True
        return False
    return True


def _epoch_ended(job: PackedJob, callbacks: Sequence[keras.callbacks.Callback], epoch: int, logs: dict) -> bool:
    """An epoch's end as Keras's fit fires it: on_test_end with its validation's logs, then on_epoch_end (_fire)."""
    validation = {name.removeprefix("val_"): value for name, value in logs.items() if name.startswith("val_")}
    return _fire(job, callbacks, "on_test_end", validation) and _fire(job, callbacks, "on_epoch_end", epoch, logs)


def _observed_end(job: PackedJob, epoch: int, logs: dict) -> bool:
    """An epoch's end as the job's observers see it, after the fact: its validation's begin and end, then its own."""
    return _fire(job, job.observers, "on_test_begin") and _epoch_ended(job, job.observers, epoch, logs)


def _per_job(flags, like):
    """(K,) flags shaped to broadcast over a (K, ...) array."""
    return flags.reshape(-1, *[1] * (like.ndim - 1))


def _batches(orders: list[np.ndarray], batch_size: int, active: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each job's samples in its order, in batches, as arrays with a step axis then a job axis: the rows of each
    step's batch (S, K, B), their weights (S, K, B: 0 for padding, the others so that a loss is the mean over the
    batch's real samples, as Keras's losses divide by the whole batch), the batch's size (S, K), and whether the
    job trains in that step (S, K: it is running and has a batch left)."""
    steps = max(math.ceil(len(order) / batch_size) for order in orders)
    rows = np.zeros((steps, len(orders), batch_size), np.int32)
    weight = np.zeros((steps, len(orders), batch_size), np.float32)
    n = np.zeros((steps, len(orders)), np.float32)
    for k, order in enumerate(orders):
        for s in range(math.ceil(len(order) / batch_size)):
            batch = order[s * batch_size:(s + 1) * batch_size]
            rows[s, k, :len(batch)] = batch
            weight[s, k, :len(batch)] = batch_size / len(batch)
            n[s, k] = len(batch)
    return rows, weight, n, active[np.newaxis, :] & (n > 0)


class JobView:
    """Job k of a pack as a model to the callbacks and checkpoints that drive one (early stopping, LR reduction,
    resume.EpochCheckpoint): its weights, its optimizer's variables and learning rate, stop_training."""

    def __init__(self, pack: Pack, k: int) -> None:
        self.pack, self.k = pack, k
        self.stop_training = False
        self.failed = False
        self.optimizer = _OptimizerView(pack, k)

    @property
    def running(self) -> bool:
        return not (self.stop_training or self.failed)

    @property
    def weights(self) -> list[JobVariable]:
        return [JobVariable(self.pack, group, i, self.k) for group, i in self.pack._weights]

    @property
    def variables(self) -> list[JobVariable]:
        return [JobVariable(self.pack, group, i, self.k) for group, i in self.pack._variables]

    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        for variable, value in zip(self.weights, weights, strict=True):
            variable.assign(value)


class _OptimizerView:
    def __init__(self, pack: Pack, k: int) -> None:
        self.pack, self.k = pack, k
        self._learning_rate = next(i for i, v in enumerate(pack._optimizer) if v.path.endswith("learning_rate"))

    @property
    def variables(self) -> list[JobVariable]:
        return [JobVariable(self.pack, "optimizer", i, self.k) for i in range(len(self.pack._optimizer))]

    @property
    def learning_rate(self) -> float:
        return float(JobVariable(self.pack, "optimizer", self._learning_rate, self.k).numpy())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        JobVariable(self.pack, "optimizer", self._learning_rate, self.k).assign(value)


class JobVariable:
    """One variable of job k of a pack: read as an array, assigned in place in the stacked state."""

    def __init__(self, pack: Pack, group: str, i: int, k: int) -> None:
        self.pack, self.group, self.i, self.k = pack, group, i, k

    @property
    def path(self) -> str:  # the model's variable's (what a checkpoint that does not fit names)
        variables = {"trainable": self.pack._trainable, "non_trainable": self.pack._non_trainable,
                     "optimizer": self.pack._optimizer}[self.group]
        return variables[self.i].path

    @property
    def shape(self) -> tuple[int, ...]:  # the model's variable's (a released pack's too: its last epoch's checkpoint)
        variables = {"trainable": self.pack._trainable, "non_trainable": self.pack._non_trainable,
                     "optimizer": self.pack._optimizer}[self.group]
        return tuple(variables[self.i].shape)

    def numpy(self) -> np.ndarray:
        if self.pack._host is not None:
            return np.asarray(self.pack._host[self.group][self.i][self.k])  # an array, a scalar's too
        return np.asarray(self.pack.state[self.group][self.i][self.k])

    def __array__(self, dtype=None, copy=None):
        return self.numpy() if dtype is None else self.numpy().astype(dtype)

    def assign(self, value) -> None:
        stacked = self.pack.state[self.group][self.i]
        self.pack.state[self.group][self.i] = stacked.at[self.k].set(jnp.asarray(value, stacked.dtype))
        if (host := self.pack._host) is not None:  # the host's copy kept in step, with no transfer back
            changed = np.array(host[self.group][self.i])
            changed[self.k] = value
            host[self.group][self.i] = changed
