"""A packed run's executor (trainer.run.packing.PackExecutor) on Keras's JAX backend, on the CPU: a pack the device
cannot hold trains in halves, a job's epoch is reported after its own callbacks, jobs pack a timeframe at a time, a
pack gives its device memory back, and a later pack of the same shapes traces and compiles nothing. On Keras's JAX
backend, with the rest of tests/jax (tests/test_jax.py starts the process)."""
from __future__ import annotations

import keras
import pytest

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="on Keras's JAX backend: tests/test_jax.py")


@pytest.mark.parametrize("fits", [1, 0], ids=["a job alone fits", "nothing fits"])
def test_a_pack_the_device_cannot_hold_trains_in_halves_each_job_as_in_a_pack_that_fit(fits, tmp_path, monkeypatch):
    """XLA's RESOURCE_EXHAUSTED while a pack trains (more jobs than the device holds: auto's estimate fell short, or
    --pack K asked for them): its jobs train in halves, one after the other, each ending as in the same pack on a
    device with room for it; a job that does not fit alone fails, in one line saying to lower the batch."""
    import json

    import yaml
    from click.testing import CliRunner
    from conftest import tiny_config_dict

    from trainer.cli import main
    from trainer.model.packed import Pack

    jax = pytest.importorskip("jax")
    exhausted = "RESOURCE_EXHAUSTED: Out of memory allocating 68719476736 bytes."
    train = Pack.train

    def on_a_small_device(self, epochs):  # XLA's error, as it raises it when an allocation fails
        if len(self.jobs) > fits:
            raise jax.errors.JaxRuntimeError(exhausted)
        return train(self, epochs)

    def run(name: str, pack: int) -> tuple[object, dict]:
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump(tiny_config_dict(tmp_path, output_dir=str(tmp_path / name)),
                                         sort_keys=False))
        result = CliRunner().invoke(main, ["run", "--config", str(config), "--pack", str(pack), "--retries", "0"])
        jobs = tmp_path / name / "jobs"
        return result, {job.name: json.loads((job / "metrics.json").read_text())
                        for job in jobs.iterdir()} if jobs.is_dir() else {}

    with monkeypatch.context() as small:
        small.setattr(Pack, "train", on_a_small_device)
        halved, metrics = run("halved", 2)
    lines = halved.output.splitlines()
    assert lines.count(f"a pack of 2 jobs ran out of memory on cpu ({exhausted}): training them 1 and 1 at a "
                       "time") == 1, halved.output
    assert "Traceback" not in halved.output
    if fits:
        assert halved.exit_code == 0, halved.output
        roomy, packed = run("roomy", 2)  # the same pack on a device with room for it
        assert roomy.exit_code == 0 and "ran out of memory" not in roomy.output, roomy.output
        assert metrics.keys() == packed.keys() == {"BTCUSDT_1h", "ETHUSDT_1h"}
        for job, scores in metrics.items():
            assert scores["best_val_loss"] == pytest.approx(packed[job]["best_val_loss"], rel=1e-5), job
        for job in metrics:  # each job of the pack of two is saved with its own model
            _forecasts_as_evaluated(tmp_path / "roomy.yaml", job)
    else:
        assert halved.exit_code == 1 and not metrics, halved.output
        for job in ("BTCUSDT_1h", "ETHUSDT_1h"):
            said = [line for line in lines if line.startswith(f"{job} failed: JaxRuntimeError: {exhausted}; out of "
                                                              "memory: lower train.batch_size")]
            assert len(said) == 1, halved.output


def test_a_packed_jobs_hooks_its_checkpoint_writes_its_progress_and_its_times_are_a_jobs_alone(tmp_path, monkeypatch):
    """A packed job's callbacks see the hooks a job trained alone fires, in the same order (tests/hooks.py: the
    epoch begins before it trains, its validation ends before it does). Its checkpoint is written once the next epoch
    is on its way to the device (the device does not wait for the disk). A Ray worker's callback sends each epoch's
    checkpoint to the driver: the epoch is shown only after it (as for a job trained alone), so an epoch the driver
    shows is one it holds, and a worker killed between the two never shows it twice (tests/ray/test_ray_runs.py's
    SIGKILL of a pack's worker). Its times hold what the same job's alone do (tests/model/test_training.py): a slow
    observer, run while the device trains the next epoch, is in neither its steps' nor its epochs'."""
    from tests.conftest import tiny_config_dict
    from tests.hooks import Hooks, Slow, assert_fired_as_fit_fires_them, assert_timed_without_observers
    from trainer.config import RunConfig
    from trainer.data import Job
    from trainer.model import packed, resume
    from trainer.run.host import Inline
    from trainer.run.packing import PackExecutor
    from trainer.run.pipeline import prepare

    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path))  # 2 epochs: the halving test's, compiled once
    seen: list[tuple[str, str, int]] = []

    class Shipped(keras.callbacks.Callback):
        def __init__(self, job: str):
            super().__init__()
            self.job = job

        def on_epoch_end(self, epoch, logs=None):
            seen.append(("checkpoint sent", self.job, epoch + 1))

    class Shown:
        def training_started(self, job, epochs, done):
            pass

        def epoch_ended(self, job, epoch, logs):
            seen.append(("shown", job, epoch + 1))

    order, write, batch_order = [], resume.EpochCheckpoint._write, packed.batch_order
    monkeypatch.setattr(packed, "batch_order", lambda n, seed, epoch: (order.append(("dispatched", epoch + 1)),
                                                                       batch_order(n, seed, epoch))[1])
    monkeypatch.setattr(resume.EpochCheckpoint, "_write", staticmethod(
        lambda tmp, arrays: (order.append(("written", int(arrays["epoch"]))), write(tmp, arrays))[1]))
    packer = PackExecutor(cfg, 2, Inline())
    jobs = [Job(symbol, "1h") for symbol in ("BTCUSDT", "ETHUSDT")]
    hooks, slow = {job.name: Hooks() for job in jobs}, Slow(3.0)
    for job in jobs:
        (tmp_path / job.name).mkdir()
        packer.submit(job, prepare(cfg, job, packer.target_shapes), tmp_path / job.name,
                      callbacks=(Shipped(job.name), hooks[job.name], *((slow,) if job == jobs[0] else ())))
    outcomes = packer.wait(Shown())
    assert not [outcome for _, outcome in outcomes if isinstance(outcome, BaseException)], outcomes
    # each epoch's batches drawn once a job (both of the pack's), each checkpoint written once a job
    assert list(dict.fromkeys(order)) == [("dispatched", 1), ("dispatched", 2), ("written", 1), ("written", 2)], order
    for job, output in outcomes:
        assert_fired_as_fit_fires_them(hooks[job.name], cfg.train.epochs)
        assert_timed_without_observers(output.metrics.train_step_seconds, output.metrics.timing.epochs, slow)
        assert [(what, epoch) for what, name, epoch in seen if name == job.name] == \
            [("checkpoint sent", 1), ("shown", 1), ("checkpoint sent", 2), ("shown", 2)], seen


def test_a_packed_run_packs_jobs_of_like_lengths_and_says_how_many_lanes_idle(tmp_path, caplog):
    """Two symbols' 15m and 1h candles of unlike lengths (BTCUSDT's 15m and ETHUSDT's 1h 1,200 candles, the others
    400), --pack 2 with the host preparing every job claimed before the first pack: the two long jobs pack together
    and the two short ones (a long job has three times a short one's steps an epoch: packed with one, the short one's
    lane would idle two thirds of each epoch), whatever their timeframes and the order they were claimed in; each
    pack says how many of its lanes idle."""
    import logging
    import re

    import pandas as pd

    from tests.conftest import CANDLES_DIR, tiny_config_dict
    from trainer.config import RunConfig
    from trainer.run.jobs import make_jobs
    from trainer.run.runner import run_config

    data = tmp_path / "candles"
    data.mkdir()
    for symbol, long in (("BTCUSDT", "15m"), ("ETHUSDT", "1h")):
        for timeframe in ("15m", "1h"):
            candles = pd.read_csv(CANDLES_DIR / f"{symbol}_{timeframe}.csv.gz")
            candles.tail(1200 if timeframe == long else 400).to_csv(data / f"{symbol}_{timeframe}.csv.gz", index=False)
    raw = tiny_config_dict(tmp_path)
    raw["data"] |= {"local": {"path": str(data), "pattern": "{symbol}_{timeframe}.csv.gz"},
                    "timeframes": ["15m", "1h"], "max_rows": None}
    raw["train"] |= {"epochs": 1, "pack": 2, "batch_size": 8}
    cfg = RunConfig.model_validate(raw)
    with caplog.at_level(logging.INFO, logger="trainer.run.packing"):
        outcome = run_config(cfg, make_jobs(cfg), host_workers=2, engine="jax")
    assert [record.status for record in outcome.records] == ["done"] * 4
    packs = [re.fullmatch(r"training packed, 2 jobs in one step: (\w+), (\w+); (\d+) % of its lanes idle \((\d+) "
                          r"steps an epoch\)", record.getMessage())
             for record in caplog.records if record.getMessage().startswith("training packed")]
    assert [pack.group(1, 2, 3) if pack else None for pack in packs] == [
        ("BTCUSDT_15m", "ETHUSDT_1h", "0"), ("BTCUSDT_1h", "ETHUSDT_15m", "0")]
    assert int(packs[0].group(4)) > 2 * int(packs[1].group(4))
    assert outcome.device.host_workers == 2 and outcome.device.training > 0


def test_a_pack_gives_its_device_memory_back_once_done_and_before_its_halves_train(tmp_path, monkeypatch, caplog):
    """After a pack's jobs are evaluated, the device holds what it held before the pack, but for what JAX keeps of
    its compiled step; a pack that ran out of memory has freed its buffers before its halves train (each half then
    holds less than the failed pack did), and after them the same holds. A pack the host cannot build (numpy's
    MemoryError, padding its jobs' windows) is halved alike, saying so."""
    import logging

    from tests.conftest import tiny_config_dict
    from trainer.config import RunConfig
    from trainer.data import Job
    from trainer.model.packed import Pack
    from trainer.run.host import Inline
    from trainer.run.packing import PackExecutor
    from trainer.run.pipeline import prepare

    jax = pytest.importorskip("jax")
    raw = tiny_config_dict(tmp_path)
    raw["train"]["epochs"] = 1
    cfg = RunConfig.model_validate(raw)
    jobs = [Job(symbol, "1h") for symbol in ("BTCUSDT", "ETHUSDT")]

    class Quiet:
        def training_started(self, job, epochs, done):
            pass

        def epoch_ended(self, job, epoch, logs):
            pass

    def on_device() -> int:
        return sum(array.nbytes for array in jax.live_arrays())

    def trained(packer: PackExecutor, run: str) -> None:
        for job in jobs:
            (tmp_path / run / job.name).mkdir(parents=True)
            packer.submit(job, prepared[job.name], tmp_path / run / job.name)
        outcomes = packer.wait(Quiet())
        assert not [outcome for _, outcome in outcomes if isinstance(outcome, BaseException)], outcomes

    packer = PackExecutor(cfg, 2, Inline())
    prepared = {job.name: prepare(cfg, job, packer.target_shapes) for job in jobs}
    # JAX keeps a little of each pack's compiled step (measured: about the size of one job's optimizer state)
    kept = sum(variable.value.nbytes for variable in [*packer.model.variables, *packer.model.optimizer.variables])
    before = on_device()
    trained(packer, "roomy")
    assert on_device() - before <= kept

    at_train, train = [], Pack.train

    def on_a_small_device(self, epochs):
        at_train.append((len(self.jobs), on_device()))
        if len(self.jobs) > 1:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 68719476736 bytes.")
        return train(self, epochs)

    monkeypatch.setattr(Pack, "train", on_a_small_device)
    trained(packer, "halved")
    assert [size for size, _ in at_train] == [2, 1, 1]
    (_, failed), (_, first_half), (_, second_half) = at_train
    assert first_half < failed and second_half < failed, at_train
    assert failed - before > 10 * kept  # what a pack holds (its jobs' windows and state), freed
    assert on_device() - before <= 3 * kept  # three packs' steps compiled

    monkeypatch.undo()
    built, build = [], Pack.__init__

    def on_a_small_host(self, model, jobs, *args):
        built.append(len(jobs))
        if len(jobs) > 1:
            raise MemoryError("Unable to allocate 1.60 GiB for an array with shape (40, 6950, 60, 24)")
        build(self, model, jobs, *args)

    monkeypatch.setattr(Pack, "__init__", on_a_small_host)
    with caplog.at_level(logging.WARNING, logger="trainer.run.packing"):
        trained(packer, "host")
    assert built == [2, 1, 1]
    assert "a pack of 2 jobs ran out of host memory building it (Unable to allocate 1.60 GiB for an array with shape " \
           "(40, 6950, 60, 24)): training them 1 and 1 at a time" in caplog.text


def _forecasts_as_evaluated(config, job: str) -> None:
    """The job's saved model (model.keras), forecasting from the candles before its last test window (`predict`),
    gives what its evaluation forecast there (predictions.npz)."""
    import numpy as np

    from trainer.config import load_config
    from trainer.data import load_candles
    from trainer.publish.predict import predict_next
    from trainer.run.jobdir import JobDir

    run = load_config(config)
    job_dir = run.run_dir / "jobs" / job
    saved = np.load(job_dir / "predictions.npz")
    candles = load_candles(run, *job.split("_"))
    before = candles[candles.index.to_numpy("datetime64[ns]") < saved["target_times"][-1]]
    forecast = predict_next(job_dir, before, JobDir(job_dir).config())
    # in log units from the last close: another job's model is ~1e-4 off there, float32's rounding ~1e-7
    np.testing.assert_allclose(np.log(forecast[["open", "high", "low", "close"]] / before["close"].iloc[-1]),
                               np.log(saved["ohlc"][-1] / before["close"].iloc[-1]), rtol=0, atol=2e-6, err_msg=job)


def test_a_later_pack_traces_and_compiles_nothing_and_no_forward_pass_runs_eagerly(tmp_path):
    """A later pack whose jobs have the shapes of an earlier one's (the next pack of a family's timeframe, a half of a
    pack that ran out of memory) reuses the model's compiled epoch (packed.PackSteps) and evaluation's compiled
    forward pass: training and evaluating its jobs traces nothing and compiles nothing, as JAX's own monitoring
    events count them. A forward pass run eagerly would trace its recurrent layers' scans at every call (here 10 a
    pack, and V7's six LSTMs at each batch of each job on a GPU)."""
    from tests.conftest import tiny_config_dict
    from trainer.config import RunConfig
    from trainer.data import Job
    from trainer.run.host import Inline
    from trainer.run.packing import PackExecutor
    from trainer.run.pipeline import prepare

    jax = pytest.importorskip("jax")
    raw = tiny_config_dict(tmp_path)
    raw["train"]["epochs"] = 2
    cfg = RunConfig.model_validate(raw)
    jobs = [Job(symbol, "1h") for symbol in ("BTCUSDT", "ETHUSDT")]

    class Quiet:
        def training_started(self, job, epochs, done):
            pass

        def epoch_ended(self, job, epoch, logs):
            pass

    traced, compiled = [], []

    def on_event(event: str, duration: float, **metadata) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(metadata.get("fun_name"))
        elif event == "/jax/core/compile/backend_compile_duration":
            compiled.append(metadata.get("fun_name"))

    def trained(packer: PackExecutor, run: str) -> None:
        for job in jobs:
            (tmp_path / run / job.name).mkdir(parents=True)
            packer.submit(job, prepared[job.name], tmp_path / run / job.name)
        outcomes = packer.wait(Quiet())
        assert not [outcome for _, outcome in outcomes if isinstance(outcome, BaseException)], outcomes

    packer = PackExecutor(cfg, 2, Inline())
    prepared = {job.name: prepare(cfg, job, packer.target_shapes) for job in jobs}
    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        trained(packer, "first")
        first = list(traced)
        traced.clear()
        compiled.clear()
        trained(packer, "later")
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert (traced, compiled) == ([], []), (traced, compiled)
    # the listener hears what the first pack traces: its steps, and evaluation's forward pass, mapped over both jobs
    assert {"_train_scan", "_val_scan", "_predict_scan"} <= set(first) and "predict_step" not in first, first
    assert "scan" not in first, first  # no recurrent layer ran eagerly


def test_packing_is_refused_without_partitionable_random_bits(tmp_path):
    """JAX before 0.5, or JAX_THREEFRY_PARTITIONABLE=0: a packed job's dropout bits would differ from its own alone
    (measured with JAX 0.4.36: losses 0.9 % apart), so packing is refused in one line, before any work."""
    from tests.conftest import tiny_config_dict
    from trainer.config import RunConfig
    from trainer.errors import UserError
    from trainer.run.host import Inline
    from trainer.run.packing import PackExecutor

    jax = pytest.importorskip("jax")
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path))
    jax.config.update("jax_threefry_partitionable", False)
    try:
        with pytest.raises(UserError, match=r"^packed training needs JAX's partitionable random bits .* unset "
                                            r"JAX_THREEFRY_PARTITIONABLE"):
            PackExecutor(cfg, 2, Inline())
    finally:
        jax.config.update("jax_threefry_partitionable", True)
