"""Shared fixtures: the real candles bundled in data/ohlcv (and freqtrade's files in tests/fixtures), a tiny
config that runs every code path fast, and one run of it trained once for the whole session (`trained_run`,
shared by every test that only reads a finished run; CONTRIBUTING.md). Nothing here needs ../shared: a clone runs
the suite on its own."""
from __future__ import annotations

import fcntl
import gc
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from trainer.evaluation.results import JobSummary
from trainer.run.engine import keras_on_jax

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Each pytest-xdist worker's TensorFlow, and the processes it starts, size their thread pools to its share of the
# CPUs, not to all of them (trainer.model.machine.CPUS_ENV): with two workers a core, pools as wide as the machine in
# every one oversubscribe it (2026-11-27, tests/run/test_resume.py and test_training.py: 381 s -> 345 s).
os.environ.setdefault("CRYPTOTRAIN_CPUS", str(max(1, len(os.sched_getaffinity(0))
                                                  // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))

# What XLA compiles in the JAX processes the tests start (`run --pack`, a Ray worker that packs, `run` without
# TensorFlow) is compiled without LLVM's costly passes: the same computations, for less CPU (tests/run/test_pack.py
# alone, runs interleaved, 2026-12-07, 2-core AMD EPYC: 132-187 busy core-seconds, mean 158, in 5 runs against 177-201,
# mean 192, in 3 at XLA's defaults: this machine's noise is as large, the gain likely but not sure). A pack's jobs equal
# to the same jobs alone, to the last bit, is checked at XLA's default level: tests/test_jax.py sets its own flags.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

if os.environ.get("KERAS_BACKEND") == "jax":  # tests/jax's process (tests/test_jax.py), set up as a JAX run's is:
    keras_on_jax()  # without TensorFlow

REPO = Path(__file__).resolve().parents[1]
CANDLES_DIR = REPO / "data" / "ohlcv"  # real Binance candles, the last 3,000 rows of 8 series (its SOURCES.md)
FREQTRADE_DIR = REPO / "tests" / "fixtures" / "freqtrade" / "binance"  # freqtrade's own files, trimmed (its README.md)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory; nothing leaks between tests or into ~/.cache."""
    monkeypatch.setenv("CRYPTOTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _tensorflow_set_up_first(request):
    """Every test process starts as the CLI's does: trainer.model.device.setup configures TensorFlow before anything
    uses it. Otherwise whichever test first builds a model fixes TensorFlow's thread pools, and every later
    in-process `cryptotrain run` warns that they keep their sizes. Not on another Keras backend (tests/jax): the
    process's tests use no TensorFlow; nor in a `pytest --setup-only`, which runs none.

    Then what the process has imported is frozen (gc.freeze), as a run freezes it (pipeline.long_lived_frozen): a
    collection, Keras's or the interpreter's own while a model traces, scans only what the tests made since.

    Nor in tests/ray's session (tests/test_ray.py's network namespace, where nothing but the loopback is): its tests
    start Ray clusters and `cryptotrain` processes, which import their own TensorFlow, and train nothing in the test
    process (tests/test_ray.py alone, 2026-11-30: 245 busy core-seconds before, 236-243 after)."""
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow" or request.config.option.setuponly \
            or only_loopback():
        return
    from trainer.config import TrainConfig
    from trainer.run.engine import import_tensorflow

    import_tensorflow()  # as the CLI imports it (JAX left out: run.engine.jax_unimported)
    from trainer.model.device import setup

    setup(TrainConfig())
    gc.freeze()


@pytest.fixture
def fresh_keras_session():
    """For tests that build Keras models: the next test starts from a clear session. Without Keras's
    gc.collect: in a process that has imported TensorFlow, each takes ~0.3 s, and the collector runs on its own."""
    import keras  # here, not at the top: conftest loads for every test, and loading Keras takes seconds
    yield
    keras.backend.clear_session(free_memory=False)


class Drive(NamedTuple):
    """A mounted stand-in for Google Drive (tests/drive.py)."""
    path: Path  # the mount point
    trash: Path  # the files Drive would have put in its trash, a line each ("deleted PATH", "replaced PATH")

    def trashed(self) -> list[str]:
        return self.trash.read_text().splitlines() if self.trash.exists() else []


@pytest.fixture
def drive(tmp_path) -> Drive:
    """A mounted stand-in for Google Drive (tests/drive.py: a FUSE passthrough whose files refuse a shared mmap, on
    tmp_path/drive-disk), unmounted after the test by its own process. Skipped, saying why, where FUSE cannot be
    had."""
    import importlib.util
    import subprocess
    import sys
    import time

    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        pytest.skip("FUSE is not available here (/dev/fuse and fusermount3: Debian's fuse3 package)")
    if importlib.util.find_spec("mfusepy") is None:
        pytest.skip("mfusepy is not installed (the dev extra)")
    disk, mount = tmp_path / "drive-disk", tmp_path / "drive"
    disk.mkdir()
    mount.mkdir()
    trash = tmp_path / "drive-trash.log"
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "drive.py"), str(disk), str(mount), str(trash)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mount):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.skip(f"a FUSE mount was refused here: {server.communicate()[1].strip()[-300:]}")
            time.sleep(0.05)
        yield Drive(mount, trash)
    finally:  # unmounted, its server (ours, by its process) has nothing left to serve
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True)
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def only_loopback() -> bool:
    """Whether this process's network namespace has no interface but the loopback (tests/test_ray.py makes one)."""
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]  # not /sys/class/net: the mount's namespace


# tests/ray's tests, each Ray of theirs listening where nothing but the loopback is
on_loopback_only = pytest.mark.skipif(not only_loopback(), reason=(
    "in a network namespace where nothing but the loopback is: tests/test_ray.py runs tests/ray there"))


def own_session_environ(**extra: str) -> dict[str, str]:
    """The environment of a pytest session a test starts (tests/test_jax.py, tests/test_ray.py): this process's,
    less pytest-xdist's variables, so that the session is not taken for one of this session's workers (its fork
    server, its temporary directory and its test order are its own), with `extra` set."""
    return {**{key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST_")}, **extra}


def same_selection(config: pytest.Config) -> list[str]:
    """The marker expression this session was given (`-m`), as options for a pytest session a test starts: `make
    test` leaves out the bench tier in tests/jax and tests/ray too."""
    expression = config.getoption("markexpr")
    return ["-m", expression] if expression else []


def _session_directory(tmp_path_factory) -> Path:
    """The test session's own temporary directory: under pytest-xdist, the one above each worker's."""
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared


@pytest.fixture(scope="session")
def forked(tmp_path_factory):
    """Starts `cryptotrain` processes for the tests that stop one with a signal, forked with TensorFlow imported
    (tests/forkserver.py): one server a session, shared by its pytest-xdist workers, started by the first to ask; it
    ends with the session (pytest, or xdist's controller: each worker's parent)."""
    from tests.forkserver import ForkServer
    return ForkServer(_session_directory(tmp_path_factory) / "forkserver",
                      owner=os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid())


def tiny_config_dict(tmp_path: Path, **sections) -> dict:
    """A small V7-shaped config over the bundled real candles; sections replace top-level keys."""
    cfg = {
        "name": "tiny",
        "output_dir": str(tmp_path / "run"),
        "cache_dir": str(tmp_path / "cache"),
        "data": {
            "source": "local",
            "local": {"path": str(CANDLES_DIR), "pattern": "{symbol}_{timeframe}.csv.gz"},
            "symbols": ["BTCUSDT", "ETHUSDT"],
            "timeframes": ["1h"],
            "max_rows": 600,
        },
        "features": {
            "base": ["open", "high", "low", "close"],
            "indicators": [
                {"name": "rsi", "window": 14},
                {"name": "bb_upper", "window": 20, "std": 2.0},
                {"name": "bb_lower", "window": 20, "std": 2.0},
                {"name": "atr", "window": 14},
            ],
        },
        "window": {"lookback": 16, "horizon": 3, "scaler": "standard"},
        "heads": [
            {"name": "ohlc", "kind": "candle", "columns": ["open", "high", "low", "close"], "weight": 1.0},
            {"name": "bb", "columns": ["bb_upper", "bb_lower"], "weight": 0.8},
        ],
        # V7's shape, as small as it goes: an encoder, LayerNorm, a sequence of `horizon` steps for the heads (the
        # families' layer kinds, bidirectional ones included, are built and checked in tests/model/test_models.py;
        # each recurrent layer here costs every test that trains ~2 s of tracing)
        "model": {"layers": [
            {"kind": "lstm", "units": 8},
            {"kind": "layernorm"},
            {"kind": "repeat_vector"},
            {"kind": "lstm", "units": 8, "return_sequences": True},
        ]},
        "train": {"batch_size": 64, "epochs": 2, "learning_rate": 0.003, "seed": 1,
                  "early_stopping": {"patience": 3}, "reduce_lr": {"patience": 2}},
    }
    cfg.update(sections)
    return cfg


def job_summary(job: str = "BTCUSDT_1h", **fields) -> JobSummary:
    """A done job's summary row with made-up figures; fields replace them."""
    return JobSummary(**{"job": job, "epochs": 2, "best_epoch": 2, "best_val_loss": 0.1, "head": "ohlc.close",
                         "test_mae": 0.5, "persistence_mae": 0.6, "skill": 1 - 0.5 / 0.6, "seconds": 1.0, **fields})


class TrainedRun(NamedTuple):
    """A finished `cryptotrain run -v` of the tiny config: BTCUSDT and ETHUSDT 1h, 2 epochs each."""
    run_dir: Path
    config: Path  # its config file
    output: str  # what the run printed (not on a terminal)

    def copy(self, to: Path) -> TrainedRun:
        """The run copied under `to` with a config of its own that points at the copy: for a test that changes it."""
        run_dir = Path(shutil.copytree(self.run_dir, to / "run"))
        config = to / "tiny.yaml"
        config.write_text(yaml.safe_dump({**yaml.safe_load(self.config.read_text()), "output_dir": str(run_dir)},
                                         sort_keys=False))
        return TrainedRun(run_dir, config, self.output)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    """The session's one trained run, for every test that only reads a finished run's results: read it, never
    change it (`trained_run.copy(tmp_path)` for a test that does). Under pytest-xdist each worker is a process of
    its own: the first to ask trains it, in process, under a file lock; the others wait and read what it wrote."""
    from click.testing import CliRunner  # here: conftest loads for every test, the CLI's imports take a while

    from trainer.cli import main

    shared = _session_directory(tmp_path_factory)
    root = shared / "trained-run"
    config, output = root / "tiny.yaml", root / "output.txt"
    with open(shared / "trained-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not output.exists():
            shutil.rmtree(root, ignore_errors=True)  # what a worker that failed here left
            root.mkdir()
            # Its candle head starts at HAR + time of day, as the families' do; its interval is the default's
            # (adaptive conformal: its margin moves along the test split)
            heads = tiny_config_dict(root)["heads"]
            heads[0].update(kind="har_candle", loss="mae")
            config.write_text(yaml.safe_dump(tiny_config_dict(root, heads=heads), sort_keys=False))
            with pytest.MonkeyPatch.context() as env:
                env.setenv("HF_HUB_OFFLINE", "1")
                result = CliRunner().invoke(main, ["run", "--config", str(config), "-v"], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            output.write_text(result.output)  # last: its presence says the run is whole
    return TrainedRun(root / "run", config, output.read_text())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads the shared trained run is in the train tier (pyproject's markers) without saying so. The
    costliest tiers run first: under pytest-xdist the workers then end together, short tests filling the gaps
    (a stable sort: each module's tests stay together, its module-scoped fixtures made once a worker). xdist
    hands each worker a run of consecutive tests at the start, so `make test` lets an idle worker take tests
    queued on a busy one (--dist worksteal): otherwise one worker gets the Ray tests and the kill tests both."""
    for item in items:
        if "trained_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.train)
    items.sort(key=lambda item: 0 if item.get_closest_marker("processes") else
               1 if item.get_closest_marker("train") else 2)
    # The longest single tests head the workers' first runs, one each in turn: wherever xdist would put them, one
    # that starts late is the suite's tail, and two in one worker's run follow each other while the others steal
    # only from its end (2026-11-29: tests/test_jax.py started 9 minutes into a 14-minute suite)
    longest = sorted((item for item in items if item.nodeid.startswith(LONGEST)),
                     key=lambda item: next(k for k, prefix in enumerate(LONGEST) if item.nodeid.startswith(prefix)))
    rest = [item for item in items if not item.nodeid.startswith(LONGEST)]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    run = -(-len(items) // workers)  # xdist's first run for each worker: this many consecutive tests
    ordered, start = [], 0  # start: of `rest`, the first test not placed yet
    for worker in range(workers):
        heads = longest[worker::workers]
        end = start + run - len(heads) if worker < workers - 1 else len(rest)
        ordered += heads + rest[start:end]
        start = end
    items[:] = ordered


# The suite's longest single tests, the longest first (pytest --durations, 2026-11-29: 50-150 s each on 2 cores;
# tests/test_ray.py, all of tests/ray one at a time, ~190 s alone on 2026-11-30)
LONGEST = ("tests/test_ray.py::", "tests/test_jax.py::", "tests/test_notebook.py::",
           "tests/test_benchmarks.py::test_bench_run", "tests/run/test_pack.py::test_a_pack_killed",
           "tests/test_benchmarks.py::test_bench_throughput")


@pytest.fixture
def tiny_config(tmp_path):
    """Write a tiny config to tmp_path and return (path, dict); pass sections to replace parts."""
    def write(**sections) -> Path:
        path = tmp_path / "tiny.yaml"
        path.write_text(yaml.safe_dump(tiny_config_dict(tmp_path, **sections), sort_keys=False))
        return path
    return write


WITHOUT = """
from __future__ import annotations
import sys

{finder}
sys.meta_path.insert(0, NotInstalled({hidden!r}))
from trainer.cli import main
main(sys.argv[1:])
"""


def cli_without(*packages: str) -> list[str]:
    """The command line that runs `cryptotrain` (arguments to follow) in an interpreter of its own, as a user gets
    it without `packages` (`forked`'s `without` forks it so, where the fork server has not imported them)."""
    import inspect
    import sys

    from tests.forkserver import NotInstalled
    return [sys.executable, "-c", WITHOUT.format(finder=inspect.getsource(NotInstalled), hidden=set(packages))]
