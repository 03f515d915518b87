"""Host work beside the device: each job's preparation (candles -> features -> windows, its baselines:
pipeline.prepare) and evaluation (its scores, what is served, its files but the model: pipeline.evaluated) run in
worker processes, one per usable CPU (fewer where memory is short), while the device trains; or inline, one at a
time, where that is all there is to gain (a run that trains one job at a time, a Ray worker, --host-workers 1).

The workers are fresh interpreters started by multiprocessing's forkserver (spawn where there is none), never forks of
a process that holds a device's runtime (JAX and CUDA are not fork-safe); they import the job's host side only
(pipeline: numpy, pandas, ta; no Keras, JAX or TensorFlow). They leave Ctrl-C to the run, which stops them; each
task's log records come back with its result and are logged here, as if it had run here; an exception that would
not survive the way back (one whose class cannot be rebuilt from its arguments) comes back as one of its kind
(UserError, JobError, else RuntimeError) saying what it was, and the worker's traceback is the cause of whatever
comes back (HostTraceback: the run writes it to the job's log). The same numbers either way: a task computes in a
worker exactly what it computes inline.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JobError, UserError
from ..files import pid_alive
from ..model.machine import usable_cpus

log = logging.getLogger(__name__)

# What a worker holds at most: the interpreter with numpy, pandas and ta (~200 MB), one job's candles, features and
# windows (tens of MB for a year of 15m candles), and their copies on the way in and out.
MEMORY_PER_WORKER = 1 << 30
# What a worker imports before it is forked off the forkserver: every task's code, once
PRELOAD = "trainer.run.pipeline"


def host_workers(requested: int | str, capacity: int) -> int:
    """Host workers for `requested` (run --host-workers): a number as it is; "auto": 1 where the executor trains one
    job at a time (`capacity` 1: a job's host work is a small part of its training, and a pool's start would cost
    more than it saves), else one per usable CPU, as many as MEMORY_PER_WORKER each of the memory available leaves
    room for."""
    if requested != "auto":
        return int(requested)
    if capacity == 1:
        return 1
    return max(1, min(usable_cpus(), available_memory() // MEMORY_PER_WORKER))


def available_memory() -> int:
    """Bytes of memory available to new work (Linux's MemAvailable; else the free physical pages)."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class HostTraceback(Exception):
    """The traceback of an exception raised in a host worker, as text: the cause of the exception the caller
    gets."""

    def __str__(self) -> str:
        return f"in a host worker:\n{self.args[0]}"


class Inline:
    """Host work one task at a time, in this process (the same calls as HostPool's)."""
    workers = 1

    def submit(self, fn: Callable, /, *args) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # KeyboardInterrupt goes on up
            future.set_exception(exc)
        return future

    def close(self) -> None:
        pass


class HostPool:
    """`workers` worker processes (see the module's docstring); `submit` returns a Future of the task's result, or of
    the exception it raised. A worker that dies (the OS's out-of-memory killer, say) fails the tasks under way with
    BrokenProcessPool, and the next task gets new workers."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        methods = multiprocessing.get_all_start_methods()
        self._context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if self._context.get_start_method() == "forkserver":
            self._context.set_forkserver_preload([PRELOAD])
        self._level = logging.getLogger().getEffectiveLevel()
        if self._context.get_start_method() == "forkserver":  # started now, with its workers' BLAS threads
            with _environ(blas_threads(workers)):
                multiprocessing.forkserver.ensure_running()
        self._pool = self._new_pool()
        threading.Thread(target=self._start_workers, daemon=True).start()

    def _start_workers(self) -> None:
        """The workers started now, in the background (the forkserver imports the jobs' host side first, ~1 s of
        CPU), while the run builds its model: the first job's preparation does not wait for them."""
        with contextlib.suppress(Exception):  # closed meanwhile
            for _ in range(self.workers):
                self._pool.submit(int)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=self._context, initializer=_started,
                                   initargs=(self._level, os.getpid()))

    def submit(self, fn: Callable, /, *args) -> Future:
        outer = Future()
        try:
            inner = self._pool.submit(_call, fn, args)
        except BrokenProcessPool:  # a worker died since the last task: new ones for this one
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            inner = self._pool.submit(_call, fn, args)
        inner.add_done_callback(lambda done: _settle(done, outer))
        outer.add_done_callback(lambda settled: settled.cancelled() and inner.cancel())
        return outer

    def close(self) -> None:
        """Tasks not started are cancelled; those under way finish first (each is one job's, seconds)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def blas_threads(workers: int) -> dict[str, str]:
    """The environment that gives each of `workers` processes its share of the CPUs for numpy's BLAS (OpenBLAS,
    MKL, OpenMP read it as they load): the machine's cores, not every core each (a worker's BLAS spinning on
    another worker's core slowed the host's work below one process's, 2026-12-07)."""
    threads = str(max(1, usable_cpus() // workers))
    return {name: threads for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")}


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """os.environ with `values`, for a process started meanwhile (the forkserver, which its workers inherit it
    from); then as it was."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def open_host(workers: int) -> HostPool | Inline:
    return Inline() if workers <= 1 else HostPool(workers)


@dataclass
class _Outcome:
    """What a task hands back: its value or its exception (with the worker's traceback), and its log records."""
    value: object = None
    error: BaseException | None = None
    traceback: str = ""
    records: list[logging.LogRecord] = field(default_factory=list)


def _settle(done: Future, outer: Future) -> None:
    if outer.cancelled():  # its job was let go (an interrupted run)
        return
    try:
        outcome = done.result()
    except BaseException as exc:  # BrokenProcessPool: the worker died under the task
        outer.set_exception(exc)
        return
    for record in outcome.records:
        logging.getLogger(record.name).handle(record)
    if outcome.error is None:
        outer.set_result(outcome.value)
    else:
        outcome.error.__cause__ = HostTraceback(outcome.traceback)
        outer.set_exception(outcome.error)


def _started(level: int, run: int) -> None:
    """A worker, as it starts: Ctrl-C is the run's to handle (a terminal sends it to every process of the group), its
    logging as the run's, and it ends when the run's process (pid `run`) does, however that ends: a run killed with
    SIGKILL leaves no worker behind (they would hold its terminal, or a pipe its caller reads, open). On Linux the
    kernel kills it once its parent goes (the forkserver, which ends with the run); elsewhere a thread of its own
    watches the run's process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger().setLevel(level)
    with contextlib.suppress(AttributeError, OSError):  # prctl(PR_SET_PDEATHSIG, SIGKILL): Linux's alone
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    threading.Thread(target=_end_with, args=(run,), daemon=True).start()


def _end_with(run: int) -> None:
    while pid_alive(run):
        time.sleep(1.0)
    os._exit(1)


class _Kept(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None  # its arguments need not travel
        if record.exc_info:
            record.exc_text, record.exc_info = logging.Formatter().formatException(record.exc_info), None
        self.records.append(record)


def _call(fn: Callable, args: tuple) -> _Outcome:
    """In a worker: `fn(*args)`, its log records kept."""
    outcome = _Outcome()
    handler = _Kept(outcome.records)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        outcome.value = fn(*args)
    except Exception as exc:
        outcome.error, outcome.traceback = _travelling(exc), "".join(traceback.format_exception(exc))
    finally:
        root.removeHandler(handler)
    return outcome


def _travelling(exc: Exception) -> Exception:
    """`exc`, or, where it would not come back intact, one of its kind saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        kind = UserError if isinstance(exc, UserError) else JobError if isinstance(exc, JobError) else RuntimeError
        return kind(str(exc) if kind is not RuntimeError else f"{type(exc).__name__}: {exc}")
