"""Packed training (trainer.model.packed) on Keras's JAX backend, on the CPU: each job of a pack ends exactly as
Keras's own `fit` on JAX leaves it trained alone on the same batches, with the same callbacks — dropout on.

These run in a process of their own with KERAS_BACKEND=jax (tests/test_jax.py starts it; `make test` runs them
so): a process's Keras backend is chosen once, and the rest of the suite's is TensorFlow.

Tolerance: float32 weights within 1e-5 and epoch losses within a relative 1e-5 of the solo run's. Packed and solo
run the same operations on the same values; only batched products may sum in another order (a float32 rounding,
~1e-7 relative, per operation), and Adam's steps carry such differences on without amplifying them over a few
dozen steps: measured 2.4e-7 at most over 12 epochs of 4 jobs (2026-11-27)."""
from __future__ import annotations

import importlib.machinery
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="on Keras's JAX backend: tests/test_jax.py")

BATCH, VALIDATION_BATCH, EPOCHS = 16, 32, 10


def build() -> keras.Model:
    """A small model with two outputs (their losses weighted), dropout (the recurrent layer's and a layer's: each
    job draws from its own seed state, as it would alone), clipping and the Adam the families use."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((12, 3), name="inputs")
    hidden = keras.layers.Dropout(0.2, seed=3)(keras.layers.LSTM(8, dropout=0.1)(inputs))
    model = keras.Model(inputs, {"a": keras.layers.Dense(2, name="a")(hidden),
                                 "b": keras.layers.Dense(1, name="b")(hidden)})
    model.compile(keras.optimizers.Adam(3e-3, clipnorm=1.0), loss={"a": "mae", "b": "mse"},
                  loss_weights={"a": 1.0, "b": 0.5}, jit_compile=True)
    return model


def series(seed: int, n: int, n_val: int, noise: bool = False):
    """(x, y) train and validation sets: y follows x, or (noise) not at all, so that validation soon worsens."""
    rng = np.random.default_rng(seed)

    def split(size):
        x = rng.normal(size=(size, 12, 3)).astype("float32")
        if noise:
            return x, {"a": rng.normal(size=(size, 2)).astype("float32"),
                       "b": rng.normal(size=(size, 1)).astype("float32")}
        return x, {"a": (x[:, -1, :2] * 0.5 + rng.normal(size=(size, 2)) * 0.1).astype("float32"),
                   "b": (x[:, -2:-1, 2] + 0.1).astype("float32")}
    return split(n), split(n_val)


def callbacks():
    """Early stopping, LR reduction, and the non-finite rule both loops give a job (sequence.JobTraining)."""
    from trainer.model.callbacks import StopOnNaN

    return [StopOnNaN(),
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, mode="min", restore_best_weights=True),
            keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5, mode="min")]


class Batches(keras.utils.PyDataset):
    """A job's train set in packed.batch_order's order, each epoch's (set by OrderOf)."""

    def __init__(self, x, y, seed, batch=BATCH):
        super().__init__()
        from trainer.model.packed import batch_order
        self.x, self.y, self.seed, self.batch = x, y, seed, batch
        self.n = len(next(iter(x.values())) if isinstance(x, dict) else x)
        self.order = batch_order(self.n, seed, 0)  # Keras reads a batch before the first epoch begins

    def __len__(self):
        return math.ceil(self.n / self.batch)

    def __getitem__(self, i):
        rows = self.order[i * self.batch:(i + 1) * self.batch]
        x = {k: v[rows] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[rows]
        return x, {k: v[rows] for k, v in self.y.items()}


class OrderOf(keras.callbacks.Callback):
    def __init__(self, data: Batches):
        super().__init__()
        self.data = data

    def on_epoch_begin(self, epoch, logs=None):
        from trainer.model.packed import batch_order
        self.data.order = batch_order(self.data.n, self.data.seed, epoch)


def alone(seed, train, val, epochs=EPOCHS):
    """The job trained alone by Keras's fit on JAX: its history and weights."""
    model = build()
    data = Batches(*train, seed=seed)
    history = model.fit(data, validation_data=val, validation_batch_size=VALIDATION_BATCH, epochs=epochs, verbose=0,
                        shuffle=False, callbacks=[OrderOf(data), *callbacks()])
    return history.history, model.get_weights()


def test_each_job_of_a_pack_ends_as_it_would_alone_and_a_diverging_job_fails_alone():
    """Each job as Keras's fit leaves it alone, one whose validation loss is NaN too (a job alone trains on: the
    non-finite rule is the loss's, and early stopping judges validation); one whose loss is NaN fails alone."""
    from trainer.model.packed import Pack, PackedJob
    from trainer.model.trained import Diverged

    sets = {"follows": series(0, 200, 50), "noise": series(1, 150, 40, noise=True),
            "short": series(2, 90, 33), "diverges": series(3, 120, 30)}
    sets["short"][1][1]["b"][7, 0] = np.nan  # one validation target: its validation loss is NaN, its loss not
    sets["diverges"][0][0][5, 3, 1] = np.nan  # one window's input: its first epoch's loss is NaN
    jobs = [PackedJob(name, *train, *val, seed=k, callbacks=callbacks())
            for k, (name, (train, val)) in enumerate(sets.items())]

    Pack(build(), jobs, BATCH, VALIDATION_BATCH).train(EPOCHS)

    ran = {}
    for k, job in enumerate(jobs[:3]):
        history, weights = alone(k, *sets[job.name])
        ran[job.name] = len(history["loss"])
        assert job.error is None
        assert len(job.history) == len(history["loss"]), job.name
        assert set(job.history[0]) == set(history)  # each output's loss too, as Keras logs them
        for key in history:
            np.testing.assert_allclose([row[key] for row in job.history], history[key], rtol=1e-5,
                                       err_msg=f"{job.name} {key}")  # NaN where NaN
        for packed, solo in zip(job.view.get_weights(), weights, strict=True):
            np.testing.assert_allclose(packed, solo, atol=1e-5, err_msg=job.name)
    # What the cases are: one stopped early, its learning rate reduced; one ran every epoch; one whose validation
    # loss is NaN trained on until early stopping, which no NaN improves, stopped it
    assert ran == {"follows": EPOCHS, "noise": ran["noise"], "short": 3} and ran["noise"] < EPOCHS
    assert all(math.isnan(row["val_loss"]) for row in jobs[2].history)
    assert min(row["learning_rate"] for row in jobs[1].history) < 3e-3
    diverged = jobs[3]
    assert isinstance(diverged.error, Diverged) and diverged.history == []
    assert str(diverged.error) == "loss became nan in epoch 1"


def test_in_mixed_bfloat16_each_job_of_a_pack_ends_as_it_would_alone():
    """Under mixed_bfloat16 (what `--pack` trains in on an accelerator: packing.pack_precision) the layers compute in
    bfloat16 and keep float32 variables; packed and alone run the same bfloat16 operations on the same values, so
    the tolerance stays float32's. Measured on this CPU (2026-11-29, JAX 0.10.2): the weights bit-equal, the losses
    within 1.5e-7 relative (their float32 sums). A batched product that rounds one bfloat16 ulp (2**-8 relative)
    otherwise, as another device's kernels might, would break it: then the bound is that ulp, not float32's."""
    sets = {"follows": series(0, 200, 50), "short": series(2, 90, 33)}
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        trained = packed_and_alone(sets, epochs=3)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    for job, (history, weights) in trained:
        assert job.error is None and len(job.history) == len(history["loss"]), job.name
        for key in history:
            np.testing.assert_allclose([row[key] for row in job.history], history[key], rtol=1e-5,
                                       err_msg=f"{job.name} {key}")
        for packed, solo in zip(job.view.get_weights(), weights, strict=True):
            assert packed.dtype == np.float32
            np.testing.assert_allclose(packed, solo, atol=1e-5, err_msg=job.name)


def packed_and_alone(sets: dict, epochs: int) -> list:
    """Each set's job trained in one pack, and alone by Keras's fit: [(packed job, (its history, weights) alone)]."""
    from trainer.model.packed import Pack, PackedJob

    jobs = [PackedJob(name, *train, *val, seed=k, callbacks=callbacks())
            for k, (name, (train, val)) in enumerate(sets.items())]
    Pack(build(), jobs, BATCH, VALIDATION_BATCH).train(epochs)
    return [(job, alone(k, *sets[job.name], epochs=epochs)) for k, job in enumerate(jobs)]


def test_a_process_on_jax_never_imports_tensorflow_though_it_is_installed(tmp_path):
    """As a `run --pack` process sets itself up (run.engine.keras_on_jax): seeding, building, training and saving a
    model import no TensorFlow, which Keras would otherwise import to seed tf.random and when it saves a model (3-5 s
    of CPU, and TensorFlow's CUDA set-up, in each process)."""
    if importlib.machinery.PathFinder.find_spec("tensorflow") is None:  # this process has it marked absent
        pytest.skip("what is checked is that an installed TensorFlow stays unimported")
    code = """if True:
        import sys
        from trainer.run.engine import keras_on_jax
        keras_on_jax()
        import keras, numpy as np, trainer.model.packed
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4, 2)), keras.layers.LSTM(3), keras.layers.Dense(1)])
        model.compile("adam", "mse")
        model.fit(np.ones((8, 4, 2)), np.ones((8, 1)), epochs=1, verbose=0)
        model.save(sys.argv[1])
        print(keras.backend.backend(), sys.modules.get("tensorflow"))
    """
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model.keras")], capture_output=True,
                          text=True, env={key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"})
    assert done.returncode == 0 and done.stdout == "jax None\n", done.stderr[-2000:]


def test_a_pack_interrupted_goes_on_from_each_jobs_own_checkpoint_and_ends_as_one_that_was_not(tmp_path):
    """Each job of a pack checkpoints every epoch in its own backup directory (resume.EpochCheckpoint, as a job
    trained alone does); a new pack — a new process after a kill — resumes each from its own, one of them an epoch
    further back (its latest checkpoint lost), and every job ends as in a pack that ran through."""
    from tests.hooks import Quiet
    from trainer.model.packed import Pack, PackedJob
    from trainer.model.resume import CHECKPOINTS
    from trainer.model.sequence import JobTraining
    from trainer.model.settings import TrainConfig

    train = TrainConfig(epochs=6, early_stopping={"patience": 2}, reduce_lr={"patience": 1})
    sets = {"follows": series(0, 120, 40), "noise": series(1, 100, 30, noise=True), "short": series(2, 70, 25)}

    def pack(backups, epochs):
        jobs = [PackedJob(name, *train_set, *val_set, seed=k)
                for k, (name, (train_set, val_set)) in enumerate(sets.items())]
        packed = Pack(build(), jobs, BATCH, VALIDATION_BATCH)
        for job in jobs:  # each with its own sequence, as trainer.run.packing gives it
            training = JobTraining(job.view, train, backups / job.name, job.name, Quiet())
            job.follow(training)
            training.start(lambda: None)
        packed.train(epochs)
        packed.end()  # the last epoch's checkpoints
        return jobs

    through = pack(tmp_path / "through", train.epochs)
    pack(tmp_path / "cut", 3)  # killed after its third epoch
    (tmp_path / "cut" / "short" / CHECKPOINTS[0]).unlink()  # and the short job's latest lost: it goes on after 2
    resumed = pack(tmp_path / "cut", train.epochs)

    assert [job.epoch for job in resumed] == [job.epoch for job in through]
    assert len(resumed[2].history) == through[2].epoch - 2  # it trained its third epoch again
    for again, whole in zip(resumed, through, strict=True):
        assert again.error is None and whole.error is None
        tail = whole.history[-len(again.history):]
        np.testing.assert_allclose([r["val_loss"] for r in again.history], [r["val_loss"] for r in tail], rtol=1e-5,
                                   err_msg=again.name)
        for a, b in zip(again.view.get_weights(), whole.view.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, err_msg=again.name)


def test_jobs_of_the_families_head_pack_as_they_train_alone_from_their_own_warm_start(tmp_path):
    """The families' head (HAR-started candle: HAR's forecasts as inputs beside the windows, a range output on QLIKE
    derived from the candle's targets, a warm start fitted on each job's own train split) on two jobs of the
    bundled real candles: each job of the pack, warm-started through the pack's model, ends as Keras's fit on JAX
    leaves the same job trained alone from the same warm start."""
    from tests.conftest import tiny_config_dict
    from trainer.config import RunConfig
    from trainer.data import load_candles
    from trainer.data.features import load_features
    from trainer.data.windows import make_windows
    from trainer.evaluation.baselines import fit_baselines
    from trainer.model.models import build_network, output_shapes
    from trainer.model.packed import Pack, windows_job

    heads = [{"name": "ohlc", "kind": "har_candle", "columns": ["open", "high", "low", "close"], "loss": "mae"}]
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, heads=heads))
    epochs, batch = 3, cfg.train.batch_size

    def built():
        keras.utils.set_random_seed(cfg.train.seed)
        model, warm_starts = build_network(cfg.network, cfg.train)
        model.jit_compile = True
        return model, warm_starts

    model, warm_starts = built()
    jobs = []
    for k, symbol in enumerate(("BTCUSDT", "ETHUSDT")):
        frame, _ = load_features(load_candles(cfg, symbol, "1h"), cfg.features, cfg.cache_path)
        windows = make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, output_shapes(model, cfg.heads))
        fitted = fit_baselines(frame, "1h", cfg.window.horizon, windows.train.first_target_rows,
                               windows.val.first_target_rows)
        jobs.append(windows_job(symbol, windows.with_forecasts(fitted.har_inputs()), seed=k))
    pack = Pack(model, jobs, batch, VALIDATION_BATCH)
    for job in jobs:
        pack.warm_start(job, warm_starts)
    pack.train(epochs)

    for k, job in enumerate(jobs):
        solo, solo_warm_starts = built()
        x = dict(job.x_train)
        for warm_start in solo_warm_starts:
            warm_start(iter([(x, job.y_train)]))
        data = Batches(x, job.y_train, seed=k, batch=batch)
        history = solo.fit(data, validation_data=(job.x_val, job.y_val), validation_batch_size=VALIDATION_BATCH,
                           epochs=epochs, verbose=0, shuffle=False, callbacks=[OrderOf(data)]).history
        assert set(job.history[0]) == set(history) >= {"val_ohlc_range_loss"}  # what the families monitor
        for key in history:
            np.testing.assert_allclose([row[key] for row in job.history], history[key], rtol=1e-5,
                                       err_msg=f"{job.name} {key}")
        for packed, alone in zip(job.view.get_weights(), solo.get_weights(), strict=True):
            np.testing.assert_allclose(packed, alone, atol=1e-5, err_msg=job.name)
