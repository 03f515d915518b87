"""Run the real `cryptotrain` CLI, pausing at a named point so a test can SIGKILL it exactly there.

    python tests/kill_points.py POINT MARKER_FILE cryptotrain-args...

POINT is one of: features (computing the first job's features), mid-epoch (inside the second epoch
of the first job, after one epoch was backed up), artifacts (the first job's files are staged but not
yet committed). On reaching it the process writes MARKER_FILE and sleeps until killed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from trainer import artifacts, runner, training
from trainer.cli import main


def pause_once(original, marker: Path, when=lambda *a, **k: True):
    def wrapper(*args, **kwargs):
        if when(*args, **kwargs) and not marker.exists():
            marker.write_text("paused")
            time.sleep(600)
        return original(*args, **kwargs)
    return wrapper


def install(point: str, marker: Path) -> None:
    if point == "features":
        runner.load_features = pause_once(runner.load_features, marker)
    elif point == "mid-epoch":
        def in_second_epoch(self, batch, logs=None):
            return getattr(self.model, "_paused_epoch", 0) >= 1 and batch >= 1
        training.StepTimer.on_epoch_begin = lambda self, epoch, logs=None: setattr(self.model, "_paused_epoch", epoch)
        training.StepTimer.on_train_batch_end = pause_once(training.StepTimer.on_train_batch_end, marker,
                                                           when=in_second_epoch)
    elif point == "artifacts":
        artifacts.commit = pause_once(artifacts.commit, marker)
    else:
        raise SystemExit(f"unknown kill point {point}")


if __name__ == "__main__":
    install(sys.argv[1], Path(sys.argv[2]))
    main(sys.argv[3:])
