"""The Ray executor: jobs train on long-lived Ray workers; the `cryptotrain run` process drives them.

The driver keeps everything that is the run's: the run directory, its ledger, the feature cache. It prepares a
job where the data is (pipeline.prepare) and hands the prepared rows to a worker through Ray's object store,
with the job's epoch checkpoints as the driver holds them; the worker trains it (pipeline.train_one, the same
code as a local run) in its one TensorFlow context, with its own compiled-model cache, so each model shape is
traced once per worker, not once per job.

While a job trains, its progress, its log lines and each finished epoch's checkpoint files come back through a
Ray queue: the driver shows the first two and writes the checkpoints into RUN/.backup/JOB, as a local run
would have. A worker that dies (SIGKILL, out of memory, its node lost) loses at most the epoch under way: Ray
starts a new worker process in its place and the driver hands it the job again, with the checkpoints it has,
so training goes on after the last one — not a failed attempt. A job that fails for its own reasons (bad data,
a non-finite loss) fails as it does locally.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .config import ExecutorConfig, RunConfig
from .errors import JobError, UserError, first_line
from .files import atomic_write
from .jobs import Job
from .pipeline import Events, JobResult, Prepared
from .training import ModelCache

try:
    import ray
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util.queue import Queue
except ImportError:  # a local run never gets here; `--executor ray` says how to install it
    ray = None

log = logging.getLogger("cryptotrain")

MAX_WORKER_DEATHS = 3  # per job: a job that kills its worker every time (out of memory, say) fails after these
# Written last, so that a worker dying while the driver writes a checkpoint leaves the files it names in place.
CHECKPOINT_FILES = ("checkpoint.previous.npz", "checkpoint.npz")


@dataclass
class _Task:
    job: Job
    actor: object  # the _Worker handle training it
    prepared: object  # the ObjectRef of its pipeline.Prepared, in the object store
    backup: Path  # the driver's backup directory for the job
    deaths: int = 0  # workers that died while training it


class RayExecutor:
    """`executor.workers` Ray actors, one job each at a time (see the module's docstring)."""

    def __init__(self, cfg: RunConfig, executor: ExecutorConfig) -> None:
        if ray is None:
            raise UserError("--executor ray needs Ray: pip install 'cryptotrain[ray]' (or pip install 'ray>=2.9'), "
                            "or run without --executor ray")
        self.cfg, self.options = cfg, executor
        self.capacity = executor.workers
        ModelCache().model_for(cfg, len(cfg.features.columns))  # a model the config cannot build is bad input
        self._started_here = False
        self._free: list = []
        self._running: dict = {}  # ObjectRef of a job's training -> _Task
        self._restarting: dict = {}  # ObjectRef of a call that answers once a dead worker's replacement runs -> _Task
        self._backups: dict[str, Path] = {}  # job -> the driver's backup directory for it

    def __enter__(self) -> RayExecutor:
        self._connect()
        self.queue = Queue()
        resources = {"num_cpus": self.options.cpus_per_worker, "num_gpus": self.options.gpus_per_worker}
        self._free = [_Worker.options(**resources, max_restarts=-1, max_task_retries=0)
                      .remote(self.cfg, self.options.cpus_per_worker) for _ in range(self.options.workers)]
        return self

    def __exit__(self, *exc) -> None:
        for actor in self._free + [task.actor for task in [*self._running.values(), *self._restarting.values()]]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self._started_here:
            ray.shutdown()

    def _connect(self) -> None:
        address = self.options.address
        if ray.is_initialized():  # a notebook that called ray.init itself
            return
        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}  # no Ray chatter through the display
        try:
            if address is None:  # a Ray of its own on this machine, reachable from it alone
                ray.init(num_cpus=max(1, round(self.options.workers * self.options.cpus_per_worker)),
                         num_gpus=round(self.options.workers * self.options.gpus_per_worker) or None,
                         include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
                self._started_here = True
            else:
                _reachable(address)  # Ray itself would keep trying for minutes
                ray.init(address=address, **quiet)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError: Ray's ways of saying "not there"
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UserError(f"--ray-address {address}: cannot reach {where} ({_first_line(exc)}); start one with "
                            "`ray start --head`, or leave --ray-address out for a Ray on this machine") from None

    def submit(self, job: Job, prepared: Prepared, backup: Path) -> None:
        self._dispatch(_Task(job, self._free.pop(), ray.put(prepared), backup))

    def _dispatch(self, task: _Task) -> None:
        self._backups[task.job.name] = task.backup
        self._running[task.actor.train.remote(task.job, task.prepared, _read_dir(task.backup), self.queue)] = task

    def wait(self, events: Events) -> list[tuple[Job, JobResult | BaseException]]:
        while True:
            self._drain(events)
            waiting = [*self._running, *self._restarting]
            ready, _ = ray.wait(waiting, num_returns=1, timeout=0.2)
            if not ready:
                continue
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            self._drain(events)  # every epoch of the jobs that ended is shown, and its checkpoint written
            outcomes = []
            for ref in ready:
                if ref in self._restarting:
                    self._back_yet(ref)
                    continue
                task = self._running.pop(ref)
                try:
                    outcomes.append((task.job, ray.get(ref)))
                except RayTaskError as exc:  # the job's own failure, raised in the worker
                    outcomes.append((task.job, exc.cause if isinstance(exc.cause, Exception) else exc))
                except RayActorError as exc:  # the worker died: the job goes on in its replacement
                    task.deaths += 1
                    if task.deaths >= MAX_WORKER_DEATHS:
                        outcomes.append((task.job, JobError(f"its Ray worker died {task.deaths} times while "
                                                            f"training it (out of memory?): {_first_line(exc)}")))
                    else:
                        log.warning("%s: its Ray worker died (%s); training goes on in a new worker from its last "
                                    "checkpointed epoch", task.job.name, _first_line(exc))
                        self._restarting[task.actor.pid.remote()] = task
                        continue
                self._free.append(task.actor)
            if outcomes:
                return outcomes

    def _back_yet(self, probe) -> None:
        """A dead worker's replacement answered, or not yet: its job is handed to it once it does."""
        task = self._restarting.pop(probe)
        try:
            ray.get(probe)
        except RayActorError:  # Ray is still starting the new worker process
            time.sleep(0.2)
            self._restarting[task.actor.pid.remote()] = task
            return
        self._dispatch(task)

    def _drain(self, events: Events) -> None:
        """Show what the workers reported, and write the checkpoints they sent, in the order they came."""
        while not self.queue.empty():
            for kind, name, payload in self.queue.get_nowait_batch(self.queue.qsize()):
                if kind == "checkpoint":
                    _write_checkpoint(self._backups[name], *payload)
                elif kind == "log":
                    log.log(payload[0], "%s", payload[1])
                else:
                    getattr(events, kind)(name, *payload)


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Raises ConnectionError when nothing answers at a HOST:PORT address ("auto" and ray:// are Ray's to find)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    with socket.create_connection((host, int(port)), timeout=timeout):
        pass


def _read_dir(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.glob("*") if path.is_file()} \
        if directory.is_dir() else {}


def _write_checkpoint(directory: Path, files: dict[str, bytes], gone: list[str]) -> None:
    """A worker's checkpoint files, each written atomically, the checkpoints themselves last; files it deleted
    (best weights no row names any more) deleted here too."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda name: name in CHECKPOINT_FILES):
        atomic_write(directory / name, lambda tmp, content=files[name]: tmp.write_bytes(content))
    for name in gone:
        (directory / name).unlink(missing_ok=True)


def _first_line(exc: BaseException) -> str:
    return first_line(exc) or type(exc).__name__


# ----------------------------------------------------------------------------- the worker side
if ray is not None:
    import keras

    @ray.remote
    class _Worker:
        """One TensorFlow context and its compiled-model cache, for as many jobs as it is given."""

        def __init__(self, cfg: RunConfig, cpus: float) -> None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            from .device import setup

            setup(cfg.train, cpus=max(1, round(cpus)))
            self.cfg = cfg
            self.cache = ModelCache()
            self.dir = Path(tempfile.mkdtemp(prefix="cryptotrain-worker-"))

        def pid(self) -> int:
            return os.getpid()

        def train(self, job: Job, prepared: Prepared, checkpoint: dict[str, bytes], queue: Queue) -> JobResult:
            from .pipeline import train_one

            backup = self.dir / job.name
            shutil.rmtree(backup, ignore_errors=True)
            backup.mkdir(parents=True)
            for name, content in checkpoint.items():
                (backup / name).write_bytes(content)
            handler = _QueueLog(queue, job.name)
            logging.getLogger("cryptotrain").addHandler(handler)
            logs = backup / "tensorboard"  # sent back with the result, for the driver to write where a local run does
            try:
                result = train_one(self.cfg, job, prepared, backup, self.cache, _QueueEvents(queue),
                                   callbacks=(_ShipCheckpoints(backup, job.name, queue),), tensorboard=logs)
                return replace(result, tensorboard={str(path.relative_to(logs)): path.read_bytes()
                                                    for path in logs.rglob("*") if path.is_file()})
            except Exception as exc:
                if not isinstance(exc, JobError):
                    self.cache = ModelCache()  # the model may be in a broken state (e.g. after out-of-memory)
                raise
            finally:
                logging.getLogger("cryptotrain").removeHandler(handler)
                shutil.rmtree(backup, ignore_errors=True)

    class _QueueEvents:
        """pipeline.Events, sent to the driver."""

        def __init__(self, queue: Queue) -> None:
            self.queue = queue

        def training_started(self, job: str, epochs: int, done: int) -> None:
            self.queue.put(("training_started", job, (epochs, done)))

        def epoch_ended(self, job: str, epoch: int, logs: dict) -> None:
            self.queue.put(("epoch_ended", job, (epoch, logs)))

    class _QueueLog(logging.Handler):
        """The job's warnings, shown by the driver (Ray's own forwarding of worker output is off)."""

        def __init__(self, queue: Queue, job: str) -> None:
            super().__init__(logging.INFO)
            self.queue, self.job = queue, job

        def emit(self, record: logging.LogRecord) -> None:
            self.queue.put(("log", self.job, (record.levelno, record.getMessage())))

    class _ShipCheckpoints(keras.callbacks.Callback):
        """After each epoch's checkpoint is written (training.EpochCheckpoint comes before it), sends the files
        of the job's backup directory that changed, and the names of those deleted, to the driver."""

        def __init__(self, backup: Path, job: str, queue: Queue) -> None:
            super().__init__()
            self.backup, self.job, self.queue = backup, job, queue
            self._sent = {name: _digest(content) for name, content in _read_dir(backup).items()}

        def on_epoch_end(self, epoch, logs=None):
            now = _read_dir(self.backup)
            changed = {name: content for name, content in now.items() if self._sent.get(name) != _digest(content)}
            gone = [name for name in self._sent if name not in now]
            self._sent = {name: _digest(content) for name, content in now.items()}
            self.queue.put(("checkpoint", self.job, (changed, gone)))

    def _digest(content: bytes) -> str:
        return hashlib.sha256(content).hexdigest()
