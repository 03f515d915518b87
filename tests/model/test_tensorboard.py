"""`train.tensorboard` / `run --tensorboard`: Keras's own TensorBoard callback writes each job's epoch logs under
RUN/tensorboard/JOB; read back with tensorboard's event reader, they hold the losses history.csv records."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import tiny_config_dict
from trainer.cli import main
from trainer.model.callbacks import EpochSummaries

pytestmark = pytest.mark.train  # a run that writes TensorBoard logs

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
from tensorboard.util import tensor_util  # noqa: E402  (tensorboard's own, without TensorFlow)


def epoch_values(log_dir, tag: str) -> dict[int, float]:
    """The scalars written under `tag`, by step (the epoch, from 0)."""
    events = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    return {event.step: float(tensor_util.make_ndarray(event.tensor_proto)) for event in events.Tensors(tag)}


def test_each_job_gets_event_files_holding_its_epoch_losses(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(tmp_path)))
    result = CliRunner().invoke(main, ["run", "--config", str(config), "--tensorboard"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for job in ("BTCUSDT_1h", "ETHUSDT_1h"):
        logs = tmp_path / "run" / "tensorboard" / job
        history = pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")
        for split, column in (("train", "loss"), ("validation", "val_loss")):
            logged = epoch_values(logs / split, "epoch_loss")
            assert sorted(logged) == list(range(len(history))), logged
            np.testing.assert_allclose([logged[step] for step in sorted(logged)], history[column], rtol=1e-6)

    # Not part of the run's identity: turned off (or on) on an existing run, nothing is refused or retrained.
    again = CliRunner().invoke(main, ["run", "--config", str(config)], catch_exceptions=False)
    assert again.exit_code == 0 and "0/2" not in again.output, again.output


def _open_files_under(directory) -> list[str]:
    """The files under `directory` this process holds open."""
    fds = Path("/proc/self/fd")
    return [target for fd in fds.iterdir() if (target := os.path.realpath(fd)).startswith(str(directory))]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads the process's open files from /proc")
def test_a_packed_jobs_epoch_summaries_close_their_files_also_where_training_never_ends(tmp_path):
    # EpochSummaries: a packed job's logs (trainer.model.callbacks); a job that fails gets no on_train_end, so the
    # pack's executor closes them (run.packing)
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    summaries = EpochSummaries(tmp_path / "job")
    summaries.set_model(model)
    summaries.on_epoch_end(0, {"loss": 1.5, "val_loss": 2.5})
    assert len(_open_files_under(tmp_path)) == 2  # train/ and validation/, each its event file
    summaries.close()
    assert _open_files_under(tmp_path) == []
    assert epoch_values(tmp_path / "job" / "train", "epoch_loss") == {0: 1.5}
    assert epoch_values(tmp_path / "job" / "validation", "epoch_loss") == {0: 2.5}
    assert epoch_values(tmp_path / "job" / "train", "epoch_learning_rate") == {0: pytest.approx(0.01)}
