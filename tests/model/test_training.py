"""Compiled-model reuse across jobs: no new trace, and exactly the result of a fresh model. Training on windows
gathered on the device, by a model whose saved file is its plain functional network."""
from __future__ import annotations

import gc
import weakref

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from tensorflow.python import pywrap_tfe

from tests.conftest import tiny_config_dict
from tests.hooks import Hooks, Quiet, Slow, assert_fired_as_fit_fires_them, assert_timed_without_observers
from tests.model.test_models import HAR_HEAD, har_windows
from trainer.config import RunConfig, TrainConfig
from trainer.data import load_candles
from trainer.data.features import load_features
from trainer.data.windows import make_windows
from trainer.model.models import output_shapes, predict_fixed_batches
from trainer.model.resume import EpochCheckpoint, ResumableEarlyStopping, replay_budget, resume
from trainer.model.training import DeviceFeed, ModelCache, WindowTrainer, fit
from trainer.run.pipeline import long_lived_frozen

pytestmark = pytest.mark.train  # each test fits a tiny model


@pytest.fixture(params=["float32", "mixed_float16"])
def cfg(request, tmp_path):
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=2, precision=request.param)  # mixed: the loss scale must be reset too
    data["model"]["layers"][0]["dropout"] = 0.2  # its random state must be reset too
    return RunConfig.model_validate(data)


def _windows(cfg, symbol, model):
    candles = load_candles(cfg, symbol, "1h")
    frame, _ = load_features(candles, cfg.features, cfg.cache_path)
    return make_windows(frame, cfg.window, cfg.features.columns, cfg.heads, output_shapes(model, cfg.heads))


def test_second_job_of_a_shape_reuses_the_traced_train_step_and_matches_a_fresh_model(cfg, tmp_path, monkeypatch):
    traces = []  # in graph mode train_step's Python body runs only while TensorFlow traces it
    train_step = WindowTrainer.train_step
    monkeypatch.setattr(WindowTrainer, "train_step", lambda self, data: (traces.append(1), train_step(self, data))[1])
    cache = ModelCache()
    model = cache.model_for(cfg.network, cfg.train)
    fit(model, _windows(cfg, "BTCUSDT", model), cfg.train, tmp_path / "btc", "job", Quiet())
    model.optimizer.learning_rate = 1e-6  # as ReduceLROnPlateau leaves it: the reuse must reset it
    train_function = model.train_function
    traces_after_first_job = len(traces)
    assert traces_after_first_job == 1  # once: no variable made while tracing (its loss's state), no second trace

    # Reseeding TensorFlow would clear its cache of instantiated functions: ~0.3 s per job to optimise them again
    cache_clears = []
    clear_caches = pywrap_tfe.TFE_ContextClearCaches
    monkeypatch.setattr(pywrap_tfe, "TFE_ContextClearCaches", lambda *a: (cache_clears.append(1), clear_caches(*a)))
    reused = cache.model_for(cfg.network, cfg.train)
    eth = _windows(cfg, "ETHUSDT", reused)
    reused_result = fit(reused, eth, cfg.train, tmp_path / "eth-reused", "job", Quiet())
    assert cache_clears == []
    assert reused is model and cache.builds == 1
    assert reused.train_function is train_function
    assert len(traces) == traces_after_first_job  # nothing traced again

    fresh = ModelCache().model_for(cfg.network, cfg.train)
    fresh_result = fit(fresh, eth, cfg.train, tmp_path / "eth-fresh", "job", Quiet())
    assert fresh is not model
    pd.testing.assert_frame_equal(reused_result.history, fresh_result.history, rtol=1e-6)


def test_a_jobs_hooks_fire_and_its_times_hold_what_a_packed_jobs_do(tmp_path):
    """The order tests/jax/test_pack_executor.py checks a packed job's hooks in, and what it checks its times hold,
    for the same job (tests/hooks.py)."""
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path))
    hooks, slow = Hooks(), Slow(3.0)
    _, result = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), tmp_path / "backup",
                           callbacks=[hooks, slow])
    assert_fired_as_fit_fires_them(hooks, cfg.train.epochs)
    assert_timed_without_observers(result.step_seconds, result.epoch_seconds, slow)


def test_a_new_shape_builds_a_new_model(cfg):
    cache = ModelCache()
    first = cache.model_for(cfg.network, cfg.train)
    wider = cfg.model_copy(update={"window": cfg.window.model_copy(update={"lookback": 24})})
    second = cache.model_for(wider.network, wider.train)
    assert second is not first and cache.builds == 2
    assert tuple(second.input.shape) == (None, 24, len(cfg.features.columns))
    assert keras.mixed_precision.dtype_policy().name == cfg.train.precision  # re-applied after clear_session


def test_a_shape_used_again_after_another_reuses_its_model_and_matches_its_first_result(tmp_path):
    """A notebook's runs of two configs in turn, or a Ray worker's jobs of two shapes: the first shape's model is
    taken back, traced, with the precision it was built with, and its job's result does not depend on the other
    shape's build (which reseeds) and training in between."""
    raw = tiny_config_dict(tmp_path)
    raw["model"]["layers"][0]["dropout"] = 0.2  # its random state must not follow the other shape's draws
    first = RunConfig.model_validate(raw)
    raw["train"]["precision"] = "mixed_float16"
    raw["window"]["lookback"] = 24
    other = RunConfig.model_validate(raw)
    cache = ModelCache()
    model = cache.model_for(first.network, first.train)
    before = fit(model, _windows(first, "BTCUSDT", model), first.train, tmp_path / "before", "job", Quiet())
    between = cache.model_for(other.network, other.train)
    fit(between, _windows(other, "ETHUSDT", between), other.train, tmp_path / "between", "job", Quiet())
    again = cache.model_for(first.network, first.train)
    assert again is model and cache.builds == 2
    assert keras.mixed_precision.dtype_policy().name == "float32"
    after = fit(again, _windows(first, "BTCUSDT", again), first.train, tmp_path / "after", "job", Quiet())
    pd.testing.assert_frame_equal(after.history, before.history, rtol=1e-6)


def test_a_model_dropped_for_a_new_shape_is_freed_though_a_run_froze_it(cfg):
    """The next run in a process (a notebook's) freezes the heap with the previous run's models in it: a new shape
    that takes the place of the least recently used frees that model all the same, and the heap stays frozen for
    the run."""
    cache = ModelCache(size=1)
    replaced = weakref.ref(cache.model_for(cfg.network, cfg.train))
    wider = cfg.model_copy(update={"window": cfg.window.model_copy(update={"lookback": 24})})
    suite_froze = gc.get_freeze_count() > 0  # conftest's, after the imports
    gc.unfreeze()  # a notebook's process: nothing frozen
    try:
        with long_lived_frozen():
            cache.model_for(wider.network, wider.train)
            assert replaced() is None and gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0  # the notebook's usual collection back
    finally:
        if suite_froze:
            gc.freeze()


def test_training_batches_are_gathered_on_the_device_from_one_copy_of_the_rows(cfg):
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    btc = _windows(cfg, "BTCUSDT", model)
    feed = model.feed_for(btc)
    np.testing.assert_array_equal(feed.rows.numpy(), btc.rows)
    assert feed.rows.device == model.trainable_variables[0].value.device  # where the model trains
    # Not the model's state: the rows change shape from job to job, and checkpoints hold the model's variables.
    feed_variables = [feed.rows, *(v for scaler in feed.scalers for v in scaler)]
    assert not {id(v) for v in feed_variables} & {id(getattr(v, "value", v)) for v in model.variables}
    assert [v.path for v in model.variables] == [v.path for v in model.network.variables]
    for split in (btc.train, btc.val):  # the windows and targets make_windows describes, framed in float32 here
        x, y = feed.gather(tf.constant(split.first_target_rows))
        np.testing.assert_allclose(x.numpy(), split.x, atol=2e-4)
        assert y.keys() == split.y.keys()
        for head, targets in y.items():
            np.testing.assert_allclose(targets.numpy(), split.y[head], atol=2e-4)

    batch = next(iter(DeviceFeed.batches(btc.train, 64, shuffle_seed=1)))
    assert (batch.dtype, batch.shape) == (tf.int32, (64,))  # only sample numbers go through tf.data
    assert not np.array_equal(batch.numpy(), btc.train.first_target_rows[:64])  # shuffled

    eth = _windows(cfg, "ETHUSDT", model)
    assert model.feed_for(eth) is feed  # the next job: same feed, its rows and scalers replaced
    np.testing.assert_array_equal(feed.rows.numpy(), eth.rows)
    x, _ = feed.gather(tf.constant(eth.val.first_target_rows))
    np.testing.assert_allclose(x.numpy(), eth.val.x, atol=2e-4)


def test_the_saved_model_is_the_trained_network_loadable_without_custom_objects(cfg, tmp_path):
    """model.keras (what predict and the Hub read) is a plain functional model: keras.saving.load_model reads it
    with nothing registered and it predicts what the trained model predicts."""
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    btc = _windows(cfg, "BTCUSDT", model)
    fit(model, btc, cfg.train, tmp_path / "backup", "job", Quiet())
    model.save(tmp_path / "model.keras")

    loaded = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    assert not isinstance(loaded, WindowTrainer) and loaded.name == cfg.name
    assert output_shapes(loaded, cfg.heads) == output_shapes(model, cfg.heads)
    for saved, trained in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, trained)
    expected = predict_fixed_batches(model, btc.test.x)
    predicted = predict_fixed_batches(loaded, btc.test.x)
    assert predicted.keys() == expected.keys()
    for head in expected:
        np.testing.assert_array_equal(predicted[head], expected[head])


def _fit_fresh(cfg, windows_of, backup_dir, **callbacks):
    """fit as a process started afresh runs it: on the process's model of that shape, reset to a fresh build's state
    (what test_second_job_of_a_shape_reuses_the_traced_train_step_and_matches_a_fresh_model checks), so that a
    test's second fit needs no second trace."""
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    return model, fit(model, windows_of(model), cfg.train, backup_dir, "job", Quiet(), **callbacks)


class EpochsBegun(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch + 1)


def _interrupted(cfg, backup, monkeypatch, after_epoch: int) -> None:
    """A fit stopped right after the checkpoint of `after_epoch` (1-based) was written, before the next epoch."""
    write = EpochCheckpoint.write

    def stopped_after_its_checkpoint(self):
        epoch = len(self.rows)
        write(self)
        if epoch == after_epoch:
            raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(EpochCheckpoint, "write", stopped_after_its_checkpoint)
        with pytest.raises(KeyboardInterrupt):
            _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), backup)


def test_a_job_killed_right_after_an_epoch_was_backed_up_resumes_with_that_epoch_on_record(tmp_path, monkeypatch):
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=3)
    cfg = RunConfig.model_validate(data)
    backup = tmp_path / "backup"
    _interrupted(cfg, backup, monkeypatch, after_epoch=2)

    begun = EpochsBegun()
    _, result = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), backup, callbacks=[begun])
    assert begun.epochs == [3]
    assert result.history["epoch"].tolist() == [1, 2, 3]  # the backed-up epochs' rows are all there
    assert result.best_val_loss == result.history.loc[result.best_epoch - 1, "val_loss"]


def test_a_job_early_stopping_had_ended_trains_no_further_epoch_when_resumed(tmp_path):
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=20, early_stopping={"patience": 1, "min_delta": 1e9})  # stops after epoch 2
    cfg = RunConfig.model_validate(data)
    backup = tmp_path / "backup"
    _, first = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), backup)
    assert first.history["epoch"].tolist() == [1, 2]
    assert replay_budget(first.history, cfg.train) == 2  # the replay stops where training did
    # killed after training ended, before the job's files were safe: the same command fits it again

    begun = EpochsBegun()
    model, resumed = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), backup, callbacks=[begun])
    assert begun.epochs == []
    pd.testing.assert_frame_equal(resumed.history, first.history)
    assert resumed.best_epoch == first.best_epoch == 1  # early stopping's best (nothing beats it by 1e9)
    with np.load(backup / "checkpoint.npz") as saved:  # epoch 2's, with early stopping's best weights (epoch 1's)
        assert int(saved["epoch"]) == 2
        np.testing.assert_array_equal(model.get_weights()[0], saved["b0"])  # the model ends with them


def test_the_reported_epoch_is_the_one_whose_weights_the_model_ends_with(tmp_path):
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=3, early_stopping={"patience": 5, "min_delta": 1e9})  # no epoch improves on 1
    cfg = RunConfig.model_validate(data)
    _, result = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), tmp_path / "es")
    assert result.history["epoch"].tolist() == [1, 2, 3]
    assert (result.best_epoch, result.best_val_loss) == (1, result.history.loc[0, "val_loss"])

    data["train"]["early_stopping"] = None
    cfg = RunConfig.model_validate(data)
    _, result = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), tmp_path / "no-es")
    assert (result.best_epoch, result.best_val_loss) == (3, result.history.loc[2, "val_loss"])  # the last


@pytest.mark.parametrize("damaged, resumes_at", [
    (["checkpoint.npz"], [3]),  # the latest is unusable: go on from the one before it
    (["checkpoint.npz", "checkpoint.previous.npz"], [1, 2, 3]),  # neither: from the first epoch, never a failure
])
def test_a_damaged_checkpoint_falls_back_and_never_fails_the_job(tmp_path, monkeypatch, caplog, damaged, resumes_at):
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=3)
    cfg = RunConfig.model_validate(data)
    backup = tmp_path / "backup"
    _interrupted(cfg, backup, monkeypatch, after_epoch=3)
    for name in damaged:  # truncated, as a write cut short by a crash without an atomic rename would leave it
        content = (backup / name).read_bytes()
        (backup / name).write_bytes(content[:len(content) // 2])

    begun = EpochsBegun()
    with caplog.at_level("WARNING", logger="trainer"):
        _, result = _fit_fresh(cfg, lambda model: _windows(cfg, "BTCUSDT", model), backup, callbacks=[begun])
    assert begun.epochs == resumes_at
    assert result.history["epoch"].tolist() == [1, 2, 3]
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]  # one, naming each file
    assert all(f"{name} unusable (" in warning for name in damaged), warning
    assert warning.endswith("training this job from its first epoch" if len(damaged) == 2
                            else "going on after epoch 2 (checkpoint.previous.npz)"), warning


def test_a_checkpoint_holds_the_optimizer_state(tmp_path, monkeypatch):
    """Resumed after its first epoch, a job's optimizer goes on from that epoch's state: its step count ends
    at three epochs' worth of steps, and its moments are the checkpoint's, not zeros."""
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=3, early_stopping=None)
    cfg = RunConfig.model_validate(data)
    _interrupted(cfg, tmp_path / "backup", monkeypatch, after_epoch=1)
    with np.load(tmp_path / "backup" / "checkpoint.npz") as saved:
        saved_state = [saved[name] for name in sorted((n for n in saved.files if n.startswith("o")),
                                                      key=lambda n: int(n[1:]))]

    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    assert resume(tmp_path / "backup", model).epochs == 1
    for variable, value in zip(model.optimizer.variables, saved_state):
        np.testing.assert_array_equal(variable.numpy(), value)
    steps_per_epoch = int(model.optimizer.iterations.numpy())
    assert steps_per_epoch > 0 and any(np.abs(v).sum() > 0 for v in saved_state[2:])
    windows = _windows(cfg, "BTCUSDT", model)
    fit(model, windows, cfg.train, tmp_path / "backup", "job", Quiet())
    assert int(model.optimizer.iterations.numpy()) == 3 * steps_per_epoch


@pytest.mark.parametrize("epochs, early_stopping, stops_at", [
    (6, {"patience": 2}, 4),     # two epochs without a better val_loss after epoch 2
    (6, {"patience": 5}, 6),     # the epoch limit comes first, at the last recorded epoch
    (10, {"patience": 5}, None),  # would go on after the six recorded epochs
    (3, {"patience": 2}, 3),     # the epoch limit, before patience runs out
    (4, None, 4),
    (6, {"patience": 1, "min_delta": 0.8}, 3),  # 4.5 does not beat 4.0 by 0.8: min_delta counts
])
def test_a_training_budget_is_replayed_over_the_recorded_epochs_by_early_stoppings_own_rule(epochs, early_stopping,
                                                                                          stops_at):
    history = pd.DataFrame({"epoch": range(1, 7), "loss": [9, 8, 7, 6, 5, 4],
                            "val_loss": [5.0, 4.0, 4.5, 4.6, 4.7, 3.0]})
    train = TrainConfig(epochs=epochs, early_stopping=early_stopping)
    assert replay_budget(history, train) == stops_at


@pytest.mark.parametrize("monitored, settings", [
    ([5.0, 4.0, 4.5, 4.6, 3.0, 3.5, 3.6, 3.7], {"patience": 2}),
    # as a float32 loss logs them: 0.9 + 0.1 rounds to 1.0 in float32, as Keras compares, so it is no improvement
    ([float(np.float32(value)) for value in (1.0, 0.9, 0.7, 0.65)], {"patience": 2, "min_delta": 0.1}),
    ([2.0, 2.0, 2.0, 1.0], {"patience": 3}),  # the same value is no improvement
    ([0.5, 0.6, 0.61, 0.65, 0.64], {"patience": 1, "mode": "max", "min_delta": 0.02}),
])
def test_early_stoppings_rule_is_keras_own(monitored, settings):
    """ResumableEarlyStopping decides as Keras's EarlyStopping, built from its public settings alone: the same
    best and the same epoch to stop at over a run of monitored values (fails should Keras change its rule)."""
    keras_rule, ours = keras.callbacks.EarlyStopping(**settings), ResumableEarlyStopping(**settings)
    keras_rule.set_model(keras.Sequential())
    keras_rule.model.stop_training = False  # as fit() starts it
    for rule in (keras_rule, ours):
        rule.on_train_begin()
    for epoch, value in enumerate(monitored):
        keras_rule.on_epoch_end(epoch, {"val_loss": value})
        observed = ours.observe(epoch, value)
        assert (observed.stops, ours.best, ours.wait) == (keras_rule.model.stop_training, keras_rule.best,
                                                          keras_rule.wait), epoch
        if observed.stops:
            break


def test_early_stopping_on_a_metric_whose_direction_keras_cannot_tell_fails_as_keras_does():
    keras_rule, ours = (rule(monitor="val_mae") for rule in (keras.callbacks.EarlyStopping, ResumableEarlyStopping))
    keras_rule.set_model(keras.Sequential())
    for rule in (keras_rule, ours):
        rule.on_train_begin()
    with pytest.raises(ValueError, match="val_mae"):
        keras_rule.on_epoch_end(0, {"val_mae": 1.0})
    with pytest.raises(ValueError, match="early_stopping.monitor val_mae: whether it should go up or down is unknown"):
        ours.observe(0, 1.0)


def test_a_har_heads_windows_train_on_the_device_and_its_saved_model_reads_them(tmp_path):
    """A HAR head's model reads HAR's forecasts beside the windows: the device gathers them as SplitWindows.x
    holds them, its range output's target is the scaled ln(high / low), and model.keras (two kinds of input)
    loads and predicts what was trained."""
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[HAR_HEAD]))
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    windows, _ = har_windows(cfg, model)
    feed = model.feed_for(windows)
    x, y = feed.gather(tf.constant(windows.val.first_target_rows))
    assert x.keys() == windows.val.x.keys() == {"inputs", "har_high", "har_low", "har_range"}
    for name, values in x.items():
        np.testing.assert_allclose(values.numpy(), windows.val.x[name], atol=2e-4, rtol=1e-5)
    high, low = (windows.preprocessing.heads[0].columns.index(c) for c in ("high", "low"))
    np.testing.assert_allclose(y["ohlc_range"].numpy()[..., 0],
                               windows.val.y["ohlc"][..., high] - windows.val.y["ohlc"][..., low], atol=2e-4)
    fit(model, windows, cfg.train, tmp_path / "backup", "job", Quiet())
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    expected, predicted = (predict_fixed_batches(m, windows.test.x) for m in (model, loaded))
    for name in ("ohlc", "ohlc_range"):
        np.testing.assert_array_equal(predicted[name], expected[name])


def test_training_starts_a_har_heads_linear_term_at_its_least_squares_fit_on_the_train_split(tmp_path):
    """Before its first epoch a HAR head's linear correction term is set to the least-squares fit, over the train
    split, of each step's ln(range / HAR's) on the window's last row less its mean: on that split the forecast range
    keeps HAR's level on average and tracks the actual ranges more closely than HAR's. Until then the model is HAR."""
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, heads=[HAR_HEAD]))
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    windows, _ = har_windows(cfg, model)
    train, prep = windows.train, windows.preprocessing
    high, low = (prep.heads[0].columns.index(c) for c in ("high", "low"))

    def range_of(outputs: dict) -> np.ndarray:  # the head's range output, in log units (N, steps)
        return np.asarray(outputs["ohlc_range"]).reshape(len(train), -1) * prep.heads[0].scaler.scale[high]

    har = range_of({"ohlc_range": train.x["har_range"]})
    np.testing.assert_allclose(range_of(predict_fixed_batches(model, train.x)), har, rtol=1e-6)

    model.feed_for(windows)
    model.warm_start(train)
    forecast = range_of(predict_fixed_batches(model, train.x))
    shift = np.log(forecast / har)
    assert np.abs(shift).max() > 0.01 and abs(shift.mean()) < 0.01  # moved, on HAR's level
    actual = (train.y["ohlc"][..., high] - train.y["ohlc"][..., low]) * prep.heads[0].scaler.scale[high]
    kept = actual > 0
    assert np.var(np.log(actual[kept] / forecast[kept])) < np.var(np.log(actual[kept] / har[kept]))


def test_a_job_resumed_on_the_other_engine_says_so(tmp_path, monkeypatch, caplog):
    """A checkpoint records the Keras backend that trained it; resumed on the other (a run begun packed on JAX, gone
    on with TensorFlow: the same Keras state), the job goes on and the run says so, once."""
    data = tiny_config_dict(tmp_path)
    data["train"].update(epochs=3, early_stopping=None)
    cfg = RunConfig.model_validate(data)
    backup = tmp_path / "backup"
    _interrupted(cfg, backup, monkeypatch, after_epoch=1)
    with np.load(backup / "checkpoint.npz") as saved:
        arrays = dict(saved)
    assert str(arrays["engine"]) == "tensorflow"
    np.savez(backup / "checkpoint.npz", **(arrays | {"engine": np.asarray("jax")}))  # as a pack on JAX writes it

    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    with caplog.at_level("WARNING", logger="trainer"):
        assert resume(backup, model).epochs == 1
    assert [r.getMessage() for r in caplog.records] == [
        "backup: going on after epoch 1 on Keras's tensorflow backend, from a checkpoint trained on jax"]


def test_a_jobs_observers_are_the_same_in_the_same_order_on_either_loop(tmp_path):
    """JobTraining gives both loops (Keras's fit, a pack) a job's observers, fired after its deciding callbacks: its
    checkpoint's writer, the caller's own (a Ray worker's), its progress, its TensorBoard writer (train.tensorboard:
    the one layout on both engines); close() closes that writer."""
    from trainer.model.callbacks import EpochSummaries, ReportProgress
    from trainer.model.resume import CheckpointWriter
    from trainer.model.sequence import JobTraining

    raw = tiny_config_dict(tmp_path)
    raw["train"]["tensorboard"] = True
    cfg = RunConfig.model_validate(raw)
    model = ModelCache.of_process().model_for(cfg.network, cfg.train)
    own = Hooks()
    training = JobTraining(model, cfg.train, tmp_path / "backup", "BTCUSDT_1h", Quiet(), tmp_path / "logs", [own])
    assert [type(c) for c in training.observers] == [CheckpointWriter, Hooks, ReportProgress, EpochSummaries]
    assert training.observers[1] is own and training.observers[3].log_dir == tmp_path / "logs"
    training.close()
    quiet = JobTraining(model, cfg.train.model_copy(update={"tensorboard": False}), tmp_path / "other", "job",
                        Quiet(), tmp_path / "logs")
    assert [type(c) for c in quiet.observers] == [CheckpointWriter, ReportProgress]
