"""Run the real `cryptotrain` CLI, pausing at a named point so a test can SIGKILL it exactly there.

    python tests/kill_points.py POINT MARKER_FILE EPOCH_LOG cryptotrain-args...

POINT is one of: features (computing the first job's features), mid-epoch (inside the second epoch of the first job,
after one epoch was backed up), checkpoint (writing the first job's second epoch checkpoint: half of it is on disk),
pack-end (a packed run whose first pack has trained: its jobs' evaluations handed to the host, its last epoch's
checkpoints not yet written; run with KERAS_BACKEND=jax), artifacts (the first job's files are staged and sealed but
not yet committed), write:GLOB (the first atomic write whose temp file's path matches GLOB: the temp file is whole
on disk, not yet renamed into place; write:GLOB#N: the Nth such write), none (no pause). On reaching it the process
writes MARKER_FILE and waits until killed, or until the test removes MARKER_FILE (then it goes on).
Every epoch the process begins is appended to EPOCH_LOG as "JOB EPOCH" (1-based), so a test can tell
a resumed job from one trained again from scratch.
"""
from __future__ import annotations

import itertools
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

from trainer import files
from trainer.cli import main
from trainer.model import callbacks, resume
from trainer.run import artifacts, pipeline, trainers


def pause_once(original, marker: Path, when=lambda *a, **k: True, after: bool = False):
    """`original`, pausing once before it is called (or, `after`, once it returned) where `when` holds, unless the
    marker is there already (an earlier process of the test paused at it)."""
    paused = []

    def pause() -> None:
        paused.append(True)
        marker.write_text("paused")
        deadline = time.monotonic() + 600
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def wrapper(*args, **kwargs):
        due = not paused and not marker.exists() and when(*args, **kwargs)
        if due and not after:
            pause()
        result = original(*args, **kwargs)
        if due and after:
            pause()
        return result
    return wrapper


def log_epochs(epoch_log: Path, patch=setattr) -> None:
    """Append "JOB EPOCH" to epoch_log for every epoch begun; `patch` (monkeypatch.setattr in a test's own
    process) puts the hooks in place."""
    train_one, on_epoch_begin = trainers.train_one, callbacks.StepTimer.on_epoch_begin
    training_now = {}  # the job whose epochs begin

    def train_one_named(cfg, job, *args, **kwargs):
        training_now["job"] = job.name
        return train_one(cfg, job, *args, **kwargs)

    def on_epoch_begin_logged(self, epoch, logs=None):
        with open(epoch_log, "a") as log:  # a packed job's: the pack's (not named)
            log.write(f"{training_now.get('job', 'packed')} {epoch + 1}\n")
        on_epoch_begin(self, epoch, logs)

    patch(trainers, "train_one", train_one_named)
    patch(callbacks.StepTimer, "on_epoch_begin", on_epoch_begin_logged)


def install(point: str, marker: Path) -> None:
    if point == "features":
        pipeline.job_features = pause_once(pipeline.job_features, marker)
    elif point == "mid-epoch":
        def in_second_epoch(self, batch, logs=None):
            return self._epoch_start is not None and self.model._kill_points_epoch >= 1 and batch >= 1
        on_epoch_begin = callbacks.StepTimer.on_epoch_begin

        def on_epoch_begin_noted(self, epoch, logs=None):
            self.model._kill_points_epoch = epoch
            on_epoch_begin(self, epoch, logs)
        callbacks.StepTimer.on_epoch_begin = on_epoch_begin_noted
        callbacks.StepTimer.on_train_batch_begin = pause_once(lambda self, batch, logs=None: None, marker,
                                                             when=in_second_epoch)
    elif point == "checkpoint":
        write = resume.EpochCheckpoint._write

        def half_written_then_paused(tmp, arrays):
            write(tmp, arrays)
            if int(arrays["epoch"]) == 2 and not marker.exists():
                content = tmp.read_bytes()
                tmp.write_bytes(content[:len(content) // 2])
                marker.write_text("paused")
                # in short sleeps: a signal the kernel hands to another thread (one of TensorFlow's) does not wake
                # this one's sleep, and Python runs the handler only when this thread next runs Python (in one
                # sleep of 600 s, a SIGTERM waited that long: a flaky failure of the test that sends it, 2026-11-29)
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    time.sleep(0.05)
        resume.EpochCheckpoint._write = staticmethod(half_written_then_paused)
    elif point == "pack-end":
        from trainer.model import packed  # JAX's: imported by a packed run only

        packed.Pack.end = pause_once(packed.Pack.end, marker)
    elif point == "artifacts":
        artifacts.stage_job = pause_once(artifacts.stage_job, marker, after=True)
    elif point.startswith("write:"):  # files.atomic_write renames its temp file, whole, into place
        pattern, _, nth = point.removeprefix("write:").partition("#")
        matches = itertools.count(1)
        files.os.replace = pause_once(files.os.replace, marker, when=lambda source, target: fnmatch(
            str(source), pattern) and next(matches) == int(nth or 1))
    elif point != "none":
        raise SystemExit(f"unknown kill point {point}")


def run(argv: list[str]) -> None:
    """POINT MARKER_FILE EPOCH_LOG cryptotrain-args..., as the module's docstring says."""
    install(argv[0], Path(argv[1]))
    log_epochs(Path(argv[2]))
    main(argv[3:])


if __name__ == "__main__":
    run(sys.argv[1:])
