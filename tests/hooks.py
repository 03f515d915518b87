"""The hooks a job's training fires, whichever loop trains it (trainer.model.sequence.JobTraining): recorded by a
callback given to a job trained alone (tests/model/test_training.py, Keras's fit on TensorFlow) and to a packed one
(tests/jax/test_pack_executor.py), and checked against the one order both must fire them in; and what its times
(the step timer's, each epoch's) hold, checked alike on both."""
from __future__ import annotations

import time

import keras
import numpy as np


class Hooks(keras.callbacks.Callback):
    """Each hook fired, (name, epoch), and the weights the job's model has at it."""

    def __init__(self) -> None:
        super().__init__()
        self.fired: list[tuple[str, int | None]] = []
        self.weights: list[list[np.ndarray]] = []

    def _saw(self, hook: str, epoch: int | None = None) -> None:
        self.fired.append((hook, epoch))
        self.weights.append([np.array(w) for w in self.model.get_weights()])

    def on_train_begin(self, logs=None):
        self._saw("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self._saw("epoch_begin", epoch)

    def on_test_begin(self, logs=None):
        self._saw("test_begin")

    def on_test_end(self, logs=None):
        self._saw("test_end")

    def on_epoch_end(self, epoch, logs=None):
        self._saw("epoch_end", epoch)

    def on_train_end(self, logs=None):
        self._saw("train_end")


def assert_fired_as_fit_fires_them(hooks: Hooks, epochs: int) -> None:
    """on_train_begin; each epoch's on_epoch_begin before it trains (the weights the previous epoch, or the start,
    left), on_test_begin and on_test_end around its validation and on_epoch_end after (the weights it trained);
    on_train_end."""
    assert hooks.fired == [("train_begin", None),
                           *((hook, epoch if hook.startswith("epoch") else None) for epoch in range(epochs)
                             for hook in ("epoch_begin", "test_begin", "test_end", "epoch_end")),
                           ("train_end", None)], hooks.fired
    for i, (hook, epoch) in enumerate(hooks.fired[1:-1], start=1):
        same = all(np.array_equal(a, b) for a, b in zip(hooks.weights[i], hooks.weights[i - 1], strict=True))
        assert same == (hooks.fired[i - 1][0] != "epoch_begin"), (hook, epoch)  # the epoch trains after it begins


class Slow(keras.callbacks.Callback):
    """An observer (a callback the caller gives a job) that takes `seconds` at each epoch's end, as a checkpoint
    written to a slow disk does. A pack runs it while the device trains the next epoch."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(self.seconds)


def assert_timed_without_observers(step_seconds: float, epoch_seconds: tuple[float, ...] | list[float],
                                   slow: Slow) -> None:
    """A job's times mean one thing on either loop: its training steps' time (compilation included) within its
    epochs', each epoch's from its begin to its validation's end; the observers' time (`slow`'s) in neither, though
    they ran in between (on a pack, meanwhile). The epochs after the first compile nothing: the tiny job's take a
    fraction of `slow`'s time."""
    assert len(epoch_seconds) >= 2 and 0 < step_seconds < sum(epoch_seconds), (step_seconds, epoch_seconds)
    assert max(epoch_seconds[1:]) < slow.seconds / 2, epoch_seconds
    assert step_seconds - epoch_seconds[0] < slow.seconds / 2, (step_seconds, epoch_seconds)


class Quiet:
    """Training events (model.trained.Events) that go nowhere: for a job a test trains without a display."""

    def training_started(self, job: str, epochs: int, done: int) -> None:
        pass

    def epoch_ended(self, job: str, epoch: int, logs: dict) -> None:
        pass
