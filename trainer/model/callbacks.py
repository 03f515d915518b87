"""The callbacks both ways of training give a job (training.fit with TensorFlow, or packed on JAX: packed.Pack;
sequence.JobTraining): the non-finite rule (StopOnNaN), the step timer, progress, a packed job's TensorBoard
summaries. Imports no TensorFlow."""
from __future__ import annotations

import math
import time

import keras
import numpy as np

from .trained import Diverged


class StopOnNaN(keras.callbacks.Callback):
    """A NaN or infinite loss ends the job with a recorded error (Keras's TerminateOnNaN stops silently).
    Checked on each epoch's mean loss, which a non-finite batch makes non-finite too: a per-batch check
    would make every step wait for the device."""

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise Diverged(f"loss became {float(loss)} in epoch {epoch + 1}")


class StepTimer(keras.callbacks.Callback):
    """Seconds spent in train steps (each epoch up to its validation, where the loop says when that starts:
    on_test_begin, which Keras's fit fires and a pack too, once its training steps are done), to tell training
    time from per-job overhead, and each epoch's wall time, validation included (`epochs`). Timed per epoch, not
    per batch: a per-batch callback makes every step wait for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.epochs: list[float] = []
        self._epoch_start: float | None = None
        self._began = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._began = time.perf_counter()

    def on_test_begin(self, logs=None):  # validation: the epoch's train steps are over
        self._stop()

    def on_epoch_end(self, epoch, logs=None):  # after validation
        self._stop()
        self.epochs.append(time.perf_counter() - self._began)

    def _stop(self) -> None:
        if self._epoch_start is not None:
            self.seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None


class ReportProgress(keras.callbacks.Callback):
    """Tells where a job's progress goes (pipeline.Events: the console's report.console.JobProgress, or a Ray worker's
    outbox) the job's epoch count and the epoch it starts at (after the checkpointed ones of an interrupted run),
    then each epoch's losses as plain floats."""

    def __init__(self, events, job: str) -> None:
        super().__init__()
        self.events, self.job = events, job
        self._first_epoch: int | None = None

    def on_train_begin(self, logs=None):
        self._first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is None:
            self._first_epoch = epoch
            self.events.training_started(self.job, self.params["epochs"], epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.events.epoch_ended(self.job, epoch, {k: float(v) for k, v in (logs or {}).items()})


class EpochSummaries(keras.callbacks.Callback):
    """A packed job's epoch logs for TensorBoard under `log_dir`, as Keras's TensorBoard callback writes a job's
    at update_freq="epoch" (`train/` and `validation/`, tags epoch_NAME, scalar tensors, the epoch as the step,
    the learning rate with the train split's), through the tensorboard package alone: Keras's callback writes
    through TensorFlow, which a packed run (Keras on JAX) does not import."""

    def __init__(self, log_dir) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._writers: dict = {}

    def on_epoch_end(self, epoch, logs=None):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.scalar.metadata import create_summary_metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util.tensor_util import make_tensor_proto

        logs = dict(logs or {})
        logs.setdefault("learning_rate", float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
        splits = {"train": {k: v for k, v in logs.items() if not k.startswith("val_")},
                  "validation": {k[4:]: v for k, v in logs.items() if k.startswith("val_")}}
        for split, values in splits.items():
            if split not in self._writers:
                self._writers[split] = EventFileWriter(str(self.log_dir / split))
            summary = Summary(value=[Summary.Value(tag=f"epoch_{name}", tensor=make_tensor_proto(np.float32(value)),
                                                   metadata=create_summary_metadata(f"epoch_{name}", ""))
                                     for name, value in values.items()])
            self._writers[split].add_event(Event(wall_time=time.time(), step=epoch, summary=summary))
            self._writers[split].flush()  # each epoch on disk as it ends: a job killed later keeps it

    def on_train_end(self, logs=None):
        self.close()

    def close(self) -> None:
        """Close the event files: at the end of training, or where it ended without one (a job that failed)."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
