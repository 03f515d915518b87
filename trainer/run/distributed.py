"""The Ray executor: jobs train on long-lived Ray workers; the `cryptotrain run` process drives them.

The driver keeps everything that is the run's: the run directory, its ledger, the feature cache. It prepares a
job where the data is (pipeline.prepare) and hands the prepared rows to a worker through Ray's object store,
with the job's epoch checkpoints as the driver holds them; the worker trains it (pipeline.train_one, the same
code as a local run) in its one TensorFlow context, with its own compiled-model cache, so each model shape is
traced once per worker, not once per job. With train.pack (`run --pack K --executor ray`), a worker takes up to K
jobs at a time and trains them packed on Keras's JAX backend (packing.PackExecutor, the same code as a local packed
run): each job of the hand-over has its own messages, checkpoints and outcome, as if it had a worker of its own.

While a job trains, its progress, its log lines and each finished epoch's checkpoint files come back through a
mailbox (a small Ray actor of ours): the driver shows the first two and writes the checkpoints into
RUN/.backup/JOB, as a local run would have. A finished job's files and TensorBoard logs come back as bytes (the
one place they travel as such): the driver writes the logs where a local run does, and the files into the
staging directory it commits. Faults:
- a worker that dies (SIGKILL, out of memory, its node lost) loses at most the epoch under way: Ray starts a new
  worker process in its place and the driver hands it the job (every job of its pack) again, with the checkpoints
  it has, so training goes on after the last one — not a failed attempt;
- the mailbox lost likewise: the driver makes a new one, and a job that may have lost messages in the old one
  (a checkpoint, an epoch's progress) goes on in its worker from the last checkpoint the driver holds;
- this node's Ray (its raylet) or the cluster's GCS gone, or anything else Ray cannot do: the run stops with
  errors.RunStopped (one line, exit 1), its jobs left to resume with the same command. Ray itself ends a driver
  whose raylet is gone at its next use of it (exit 1, no line: "Exiting because the Raylet IPC connection failed"
  in Ray's log), so the driver waits for a reply without reading it, checks the raylet, then reads; where Ray
  ends the driver anyway, `cryptotrain run` (the driver's parent process: supervisor.ray_driver_in_a_child) says so
  in one line. Either way the same command resumes.
A job that fails for its own reasons (bad data, a non-finite loss) fails as it does locally.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import logging
import os
import pickle
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import ExecutorConfig, RunConfig
from ..errors import RAY_MISSING, JobError, RunStopped, UserError, cause
from ..evaluation.results import JobMetrics
from ..files import atomic_write
from ..model.models import build_network, output_shapes
from .host import Inline
from .jobs import Job
from .pipeline import Events, Host, JobOutput, Prepared, tensorboard_dir
from .reachable import check_cluster, reachable, unreachable_cluster

try:
    import ray
    import ray.util.client
    from ray.exceptions import RayActorError, RayError, RayTaskError
except ImportError:  # a local run never gets here; `--executor ray` says how to install it
    ray = None

log = logging.getLogger(__name__)

MAX_WORKER_DEATHS = 3  # per job: a job that kills its worker every time (out of memory, say) fails after these
MAILBOX_WAIT_S = 10.0  # for the mailbox's answer; a call not answered by then is asked again at the next round
RESUME = "run the same command again to resume (finished epochs are kept)"


@dataclass
class _Task:
    job: Job
    prepared: Prepared
    backup: Path  # the driver's backup directory for the job
    actor: object = None  # the _Worker handle training it, once handed over
    deaths: int = 0  # workers that died while training it
    # Of its current hand-over to a worker: the number its messages carry, the mailbox they go to, how many of
    # them the driver has taken.
    token: int = -1
    mailbox: object = None
    received: int = 0


@dataclass(frozen=True)
class _Shipped:
    """A job a worker trained, as it travels to the driver: its metrics, and its files as bytes."""
    metrics: JobMetrics
    files: dict[str, bytes]  # the job directory's, by name
    tensorboard: dict[str, bytes]  # its TensorBoard event files, by path relative to the job's log directory

    def write(self, directory: Path) -> None:
        for name, content in self.files.items():
            (directory / name).write_bytes(content)


class _MailboxLost(Exception):
    """Raised in a worker whose mailbox is gone: the driver hands its job out again."""


class RayExecutor:
    """`executor.workers` Ray actors, one job each at a time, or `pack` jobs each packed on Keras's JAX backend (see
    the module's docstring)."""

    def __init__(self, cfg: RunConfig, executor: ExecutorConfig, host: Host, pack: int | None = None) -> None:
        if ray is None:
            raise UserError(RAY_MISSING)
        self.cfg, self.options, self.pack = cfg, executor, pack
        self.per_worker = pack or 1  # jobs a worker takes at a time
        self.capacity = executor.workers * self.per_worker
        self.host = host  # where the driver prepares jobs (the workers evaluate theirs)
        self.training_seconds = None  # the devices are the workers', not this process's
        # a model the config cannot build is bad input, said before any work
        self.target_shapes = output_shapes(build_network(cfg.network, cfg.train)[0], cfg.heads)
        self._connected_here = False  # ray.init called here (not in a notebook before)
        self._workers: list = []
        self._free: list = []
        self._submitted: list[_Task] = []  # handed to a worker in wait(), where a Ray that is gone stops the run
        self._running: dict = {}  # ObjectRef of a job's training -> _Task
        self._restarting: dict = {}  # ObjectRef of a call that answers once a dead worker's replacement runs -> _Task
        self._tasks: dict[int, _Task] = {}  # token -> the task whose messages carry it
        self._tokens = itertools.count()
        self._take = None  # the mailbox's answer, while it has not come
        self._gcs_silent_since: float | None = None
        self._starting: tuple | None = None  # the workers' first replies, when asked, what connecting took

    def __enter__(self) -> RayExecutor:
        began = time.perf_counter()
        self._connect()
        connected = time.perf_counter() - began
        self._raylet, self._gcs = _watched_addresses()
        self.mailbox = _Mailbox.remote()
        resources = {"num_cpus": self.options.cpus_per_worker, "num_gpus": self.options.gpus_per_worker}
        if self.pack is not None:  # each worker process's Keras on JAX, chosen before it imports Keras
            resources["runtime_env"] = {"env_vars": {"KERAS_BACKEND": "jax"}}
        self._workers = [_Worker.options(**resources, max_restarts=-1, max_task_retries=0)
                         .remote(self.cfg, self.options.cpus_per_worker, self.pack)
                         for _ in range(self.options.workers)]
        self._free = list(self._workers)
        # Said once every worker answers (its TensorFlow or JAX imported and set up): what Ray costs before a job
        how = "a Ray of its own on this machine" if self.options.address is None else "connected to Ray"
        self._starting = ([worker.pid.remote() for worker in self._workers], began, f"{how} in {connected:.1f} s")
        return self

    def __exit__(self, *exc) -> None:
        for actor in [*self._workers, self.mailbox]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self._connected_here:  # a Ray of its own stops; a cluster is left, this process no longer its driver
            ray.shutdown()
            _show_ray_notices(True)

    def _connect(self) -> None:
        address = self.options.address
        if ray.is_initialized():  # a notebook that called ray.init itself: its output is left as it is
            return
        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}  # no Ray chatter through the display
        check_cluster(address)
        try:
            if address is None:  # a Ray of its own on this machine, reachable from it alone
                ray.init(num_cpus=max(1, round(self.options.workers * self.options.cpus_per_worker)),
                         num_gpus=round(self.options.workers * self.options.gpus_per_worker) or None,
                         include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
            else:
                ray.init(address=address, **quiet)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError: Ray's ways of saying "not there"
            raise unreachable_cluster(address, exc) from None
        self._connected_here = True
        _show_ray_notices(False)

    def _say_when_started(self) -> None:
        """Once every worker has answered: "Ray: N workers ready S s after the run asked for Ray (...)". A worker
        that failed to start says nothing here: its job's outcome says why."""
        if self._starting is None:
            return
        replies, began, connected = self._starting
        if len(ray.wait(replies, num_returns=len(replies), timeout=0, fetch_local=False)[0]) == len(replies):
            self._starting = None
            log.info("Ray: %d workers ready %.1f s after the run asked for Ray (%s)", len(replies),
                     time.perf_counter() - began, connected)

    def submit(self, job: Job, prepared: Prepared, backup: Path) -> None:
        self._submitted.append(_Task(job, prepared, backup))

    def wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        """The module's docstring says what each fault does; RunStopped when the run cannot go on."""
        try:
            return self._wait(events)
        except RayError as exc:  # anything else Ray could not do: the run stops, its jobs left to resume
            self._check_ray()  # the likeliest cause, named
            raise RunStopped(f"stopped: Ray failed ({cause(exc)}); {RESUME}") from exc

    def _wait(self, events: Events) -> list[tuple[Job, JobOutput | BaseException]]:
        while True:
            self._check_ray()  # before anything that needs this node's object store
            while self._submitted and self._free:  # a free worker takes as many as it packs
                tasks, self._submitted = self._submitted[:self.per_worker], self._submitted[self.per_worker:]
                self._dispatch(self._free.pop(), tasks)
            self._drain(events)
            self._say_when_started()
            waiting = [*self._running, *self._restarting]
            ready, _ = ray.wait(waiting, num_returns=1, timeout=0.2, fetch_local=False)
            if not ready:
                continue
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0, fetch_local=False)
            self._drain(events)  # every epoch of the jobs that ended is shown, and its checkpoint written
            outcomes = []
            for ref in ready:
                if ref in self._restarting:
                    self._back_yet(ref)
                else:
                    outcomes += self._outcomes(ref, self._running.pop(ref))
            if outcomes:
                return outcomes

    def _dispatch(self, actor, tasks: list[_Task]) -> None:
        """A hand-over of jobs (one, or a pack) to a worker, each job's messages with a token of its own."""
        for task in tasks:
            task.actor, task.token, task.mailbox, task.received = actor, next(self._tokens), self.mailbox, 0
            self._tasks[task.token] = task
        self._running[actor.train.remote([task.job for task in tasks], [task.prepared for task in tasks],
                                         [_read_dir(task.backup) for task in tasks], self.mailbox,
                                         [task.token for task in tasks])] = tasks

    def _outcomes(self, ref, tasks: list[_Task]) -> list[tuple[Job, JobOutput | BaseException]]:
        """How a hand-over to a worker ended: the outcome of each job that ended, none for the jobs that go on in
        a worker (a new one in a dead one's place, or the same one after a lost mailbox)."""
        actor = tasks[0].actor
        for task in tasks:
            del self._tasks[task.token]
        try:
            replies = self._read(ref)
        except RayTaskError as exc:  # raised in the worker, not by a job (those are replies)
            if not isinstance(exc.cause, _MailboxLost):
                self._free.append(actor)
                return [(task.job, exc.cause if isinstance(exc.cause, Exception) else exc) for task in tasks]
            if tasks[0].mailbox is self.mailbox:
                self._new_mailbox(exc.cause)
            self._dispatch(actor, tasks)
            return []
        except RayActorError as exc:  # the worker died: its jobs go on in its replacement
            return self._worker_died(actor, tasks, exc)
        outcomes, again = [], []
        for task, (sent, result) in zip(tasks, replies, strict=True):
            if task.received < sent:  # some of its messages were lost with a mailbox: go on from what the driver has
                again.append(task)
                continue
            if not isinstance(result, BaseException):
                try:
                    _write_tensorboard(tensorboard_dir(self.cfg.run_dir, task.job.name), result.tensorboard)
                except OSError as exc:  # a full disk, say: the driver tells, as it does of the job's files
                    result = exc
            outcomes.append((task.job, result))
        if again:
            self._dispatch(actor, again)
        else:
            self._free.append(actor)
        return outcomes

    def _worker_died(self, actor, tasks: list[_Task], exc: RayActorError) -> list[tuple[Job, JobError]]:
        """Each job goes on in the dead worker's replacement, once it answers, unless its workers died too often."""
        failed = []
        for task in tasks:
            task.deaths += 1
            if task.deaths >= MAX_WORKER_DEATHS:
                failed.append((task.job, JobError(f"its Ray worker died {task.deaths} times while training it (out "
                                                  f"of memory?): {cause(exc)}")))
            else:
                log.warning("%s: its Ray worker died (%s); training goes on in a new worker from its last "
                            "checkpointed epoch", task.job.name, cause(exc))
        going_on = [task for task in tasks if task.deaths < MAX_WORKER_DEATHS]
        if going_on:
            self._restarting[actor.pid.remote()] = going_on
        else:
            self._free.append(actor)
        return failed

    def _back_yet(self, probe) -> None:
        """A dead worker's replacement answered, or not yet: its jobs are handed to it once it does."""
        tasks = self._restarting.pop(probe)
        try:
            self._read(probe)
        except RayActorError:  # Ray is still starting the new worker process
            time.sleep(0.2)
            self._restarting[tasks[0].actor.pid.remote()] = tasks
            return
        self._dispatch(tasks[0].actor, tasks)

    def _drain(self, events: Events) -> None:
        """Show what the workers reported, and write the checkpoints they sent, in the order they came: all that
        was in the mailbox when called, unless it does not answer in time (then asked again at the next call)."""
        while True:
            fresh = self._take is None
            if fresh:
                self._take = self.mailbox.take.remote()
            if not ray.wait([self._take], timeout=MAILBOX_WAIT_S, fetch_local=False)[0]:
                return  # a Ray that is slow, or going away: _check_ray tells
            try:
                messages = self._read(self._take)
            except RayActorError as exc:  # the mailbox is gone (unless Ray is: _check_ray tells)
                self._check_ray()
                self._new_mailbox(exc)
                return
            self._take = None
            for kind, token, payload in messages:
                task = self._tasks.get(token)
                if task is None:  # from a hand-over that has ended: the job went on from the driver's checkpoints
                    continue
                task.received += 1
                if kind == "checkpoint":
                    _write_checkpoint(task.backup, *payload)
                elif kind == "log":
                    log.log(payload[0], "%s", payload[1])
                else:
                    getattr(events, kind)(task.job.name, *payload)
            if fresh:
                return

    def _new_mailbox(self, why: BaseException) -> None:
        """The jobs under way lose their messages in the old one: each goes on from its last checkpoint the
        driver holds (the worker finds its mailbox gone at its next message, see _Outbox)."""
        log.warning("Ray lost the mailbox the workers report to (%s); the jobs under way go on from their last "
                    "checkpointed epoch", cause(why))
        with contextlib.suppress(Exception):
            ray.kill(self.mailbox)  # should it still live: no worker's message goes where nobody reads
        self.mailbox, self._take = _Mailbox.remote(), None

    def _read(self, ready):
        """ray.get of a reply that is ready: one in the object store is read through this node's raylet, and Ray
        ends the process there should the raylet be gone (the module's docstring), so the raylet is checked first."""
        self._check_ray()
        return ray.get(ready)

    def _check_ray(self) -> None:
        """RunStopped when the Ray this run uses is gone: this node's raylet not answering (its object store went
        with it, and Ray would end this process at its next use), or the cluster's GCS silent
        executor.gcs_patience_s."""
        if self._gcs is None:
            return
        try:
            reachable(self._raylet, timeout=2.0)
        except OSError as exc:
            raise RunStopped(f"stopped: the Ray node of this run is gone (its raylet at {self._raylet}: "
                             f"{cause(exc)}); {RESUME}") from None
        try:
            reachable(self._gcs, timeout=2.0)
        except OSError as exc:
            self._gcs_silent_since = self._gcs_silent_since or time.monotonic()
            if time.monotonic() - self._gcs_silent_since > self.options.gcs_patience_s:
                raise RunStopped(f"stopped: the Ray cluster at {self._gcs} has not answered for "
                                 f"{self.options.gcs_patience_s:g} s ({cause(exc)}); {RESUME}") from None
        else:
            self._gcs_silent_since = None


def _show_ray_notices(show: bool) -> None:
    """Ray prints its cluster's error notices ("(raylet) A worker died ...", a dead raylet's last 20 log lines)
    on the driver's stdout whatever log_to_driver says; while a run drives Ray, the faults they tell of are the
    executor's to say, each in one line. Ray's own switch for them is private (ray.util.rpdb uses it the same
    way), set here alone; tests/test_public_api.py fails should Ray change it."""
    ray._private.worker._worker_logs_enabled = show


def _watched_addresses() -> tuple[str | None, str | None]:
    """(this node's raylet, the cluster's GCS) as HOST:PORT, for RayExecutor._check_ray; neither through Ray
    Client (ray://), where this process is on no node of the cluster."""
    context = ray.get_runtime_context()
    node = None if ray.util.client.ray.is_connected() else \
        next((node for node in ray.nodes() if node["NodeID"] == context.get_node_id()), None)
    return (f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}", context.gcs_address) if node else (None, None)


def _read_dir(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.glob("*") if path.is_file()} \
        if directory.is_dir() else {}


def _write_tensorboard(directory: Path, files: dict[str, bytes]) -> None:
    """A worker's TensorBoard event files, where a local run writes them."""
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp, content=content: tmp.write_bytes(content))


def _write_checkpoint(directory: Path, files: dict[str, bytes], gone: list[str]) -> None:
    """A worker's backup files (its checkpoint and the previous one, each whole in itself), each written
    atomically; files it deleted, deleted here too."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        atomic_write(directory / name, lambda tmp, content=content: tmp.write_bytes(content))
    for name in gone:
        (directory / name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the actors
if ray is not None:
    import keras

    @ray.remote(num_cpus=0)  # no CPU to wait for when the workers hold them all and a lost one is replaced
    class _Mailbox:
        """Messages from the workers to the driver ((kind, token, payload)), kept in the order they came until
        the driver takes them. Never restarted: a message lost with it is followed by no other of its job."""

        def __init__(self) -> None:
            self.messages: list = []

        def put(self, message: tuple) -> None:
            self.messages.append(message)

        def take(self) -> list:
            messages, self.messages = self.messages, []
            return messages

    @ray.remote
    class _Worker:
        """The trainer a local run has (trainers.in_process_trainer), in a Ray actor of its own: one TensorFlow
        context and its compiled-model cache, for as many jobs as it is given one at a time; or, packing, one model on
        Keras's JAX backend that trains `pack` jobs at a time."""

        def __init__(self, cfg: RunConfig, cpus: float, pack: int | None) -> None:
            self.cfg = cfg
            engine = "tensorflow" if pack is None else "jax"  # the driver's choice (its runtime_env's KERAS_BACKEND)
            if engine == "jax":
                from .engine import tensorflow_unimported

                tensorflow_unimported()
            else:
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                from .engine import import_tensorflow

                import_tensorflow()  # as the command imports it
                from ..model.device import setup

                setup(cfg.train, cpus=max(1, round(cpus)))
            from .trainers import in_process_trainer

            gc.freeze()  # the imports live as long as the worker: collections skip them (long_lived_frozen)
            # a local run's trainer, its host work inline (the worker's CPUs are its jobs': cpus_per_worker)
            self.trainer = in_process_trainer(cfg, engine, pack or 1, Inline())

        def pid(self) -> int:
            return os.getpid()

        def train(self, jobs: list[Job], prepared: list[Prepared], checkpoints: list[dict[str, bytes]], mailbox,
                  tokens: list[int]) -> list[tuple[int, _Shipped | Exception]]:
            """Each job's (number of messages sent, result or the exception it failed with), in order; raises
            _MailboxLost when a message could not be sent. The jobs' checkpoints, TensorBoard logs and files live in
            a temporary directory meanwhile, removed when they end."""
            outboxes = {job.name: _Outbox(mailbox, token) for job, token in zip(jobs, tokens, strict=True)}
            handler = _OutboxLog(outboxes[jobs[0].name])  # the lines of a pack's jobs name their job
            package_log = logging.getLogger(__package__)  # "trainer": each module logs to a child of it
            package_log.addHandler(handler)
            try:
                with tempfile.TemporaryDirectory(prefix="cryptotrain-") as tmp:
                    for job, checkpoint in zip(jobs, checkpoints, strict=True):
                        for directory in ("backup", "tensorboard", "files"):
                            (Path(tmp) / job.name / directory).mkdir(parents=True)
                        for name, content in checkpoint.items():
                            (Path(tmp) / job.name / "backup" / name).write_bytes(content)
                    ended = self._train(jobs, prepared, Path(tmp), outboxes)
                    if any(isinstance(outcome, _MailboxLost) for outcome in ended):
                        raise _MailboxLost("a message of the jobs could not be sent")
                    return [(outboxes[job.name].sent, _shipped(outcome, Path(tmp) / job.name))
                            for job, outcome in zip(jobs, ended, strict=True)]
            finally:
                package_log.removeHandler(handler)

        def _train(self, jobs: list[Job], prepared: list[Prepared], tmp: Path,
                   outboxes: dict[str, _Outbox]) -> list[JobOutput | Exception]:
            """Each job's outcome, from the worker's trainer."""
            events = _OutboxEvents(outboxes)
            ship = {job.name: _ShipCheckpoints(tmp / job.name / "backup", outboxes[job.name]) for job in jobs}
            for job, rows in zip(jobs, prepared, strict=True):
                self.trainer.submit(job, rows, tmp / job.name / "backup", callbacks=(ship[job.name],),
                                    tensorboard=tmp / job.name / "tensorboard")
            return [outcome for _, outcome in self.trainer.wait(events)]

    def _shipped(outcome: JobOutput | Exception, directory: Path) -> _Shipped | Exception:
        """A job's outcome as it travels to the driver: its files as bytes, or the exception it failed with (as
        a JobError with its message when it would not travel as it is)."""
        if isinstance(outcome, Exception):
            try:
                pickle.loads(pickle.dumps(outcome))
            except Exception:
                return JobError(f"{type(outcome).__name__}: {cause(outcome)}")
            return outcome
        outcome.write(directory / "files")
        logs = directory / "tensorboard"
        return _Shipped(outcome.metrics, _read_dir(directory / "files"),
                        {str(path.relative_to(logs)): path.read_bytes() for path in logs.rglob("*") if path.is_file()})

    class _Outbox:
        """One hand-over's messages to the driver, each delivered to the mailbox before training goes on, and
        counted: the driver compares the count with those it took."""

        def __init__(self, mailbox, token: int) -> None:
            self.mailbox, self.token, self.sent = mailbox, token, 0

        def put(self, kind: str, payload: tuple) -> None:
            try:
                ray.get(self.mailbox.put.remote((kind, self.token, payload)))
            except RayActorError as exc:
                raise _MailboxLost(cause(exc)) from None
            self.sent += 1

    class _OutboxEvents:
        """pipeline.Events, each job's sent to the driver through its outbox."""

        def __init__(self, outboxes: dict[str, _Outbox]) -> None:
            self.outboxes = outboxes

        def training_started(self, job: str, epochs: int, done: int) -> None:
            self.outboxes[job].put("training_started", (epochs, done))

        def epoch_ended(self, job: str, epoch: int, logs: dict) -> None:
            self.outboxes[job].put("epoch_ended", (epoch, logs))

    class _OutboxLog(logging.Handler):
        """The job's warnings, shown by the driver (Ray's own forwarding of worker output is off)."""

        def __init__(self, outbox: _Outbox) -> None:
            super().__init__(logging.INFO)
            self.outbox = outbox

        def emit(self, record: logging.LogRecord) -> None:
            with contextlib.suppress(_MailboxLost):  # the job finds out at its next checkpoint
                self.outbox.put("log", (record.levelno, record.getMessage()))

    class _ShipCheckpoints(keras.callbacks.Callback):
        """After each epoch's checkpoint is written (training.EpochCheckpoint comes before it), sends the files
        of the job's backup directory that changed, and the names of those deleted, to the driver."""

        def __init__(self, backup: Path, outbox: _Outbox) -> None:
            super().__init__()
            self.backup, self.outbox = backup, outbox
            self._sent = {name: _digest(content) for name, content in _read_dir(backup).items()}

        def on_epoch_end(self, epoch, logs=None):
            now = _read_dir(self.backup)
            changed = {name: content for name, content in now.items() if self._sent.get(name) != _digest(content)}
            gone = [name for name in self._sent if name not in now]
            self.outbox.put("checkpoint", (changed, gone))
            self._sent = {name: _digest(content) for name, content in now.items()}

    def _digest(content: bytes) -> str:
        return hashlib.sha256(content).hexdigest()
