"""`cryptotrain run --executor ray` against a real Ray cluster started here (127.0.0.1, 2 CPUs, in a network
namespace where nothing but the loopback is: tests/test_ray.py): the same results as a local run; SIGKILL of a Ray
process of ours mid-run (a worker, the mailbox, the driver, the node's raylet or GCS) loses no finished epoch, and
the same command finishes every job exactly once; an unreachable cluster or a missing Ray is one line. The tests
start and stop only their own Ray."""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, on_loopback_only, tiny_config_dict
from tests.forkserver import ForkServer

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")
pytestmark = [pytest.mark.processes, on_loopback_only]  # a real Ray cluster, `cryptotrain run` processes killed

JOBS = ["BTCUSDT_15m", "BTCUSDT_1h"]
# Ray >= 2.59 authenticates every client of a cluster with a token: the cluster and its drivers share this one.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}


class RayHead:
    """A Ray head on 127.0.0.1 with 2 CPUs, as `ray start --head` makes one: its own ports and temp dir, its
    processes in a session of their own. stop() kills those, by pid — never `ray stop`, which stops every Ray on
    the machine (a user's cluster, another test run's)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._start()

    def restart(self) -> None:
        """Stopped, then started again at its address (after a test killed its node)."""
        self.stop()
        self._start()

    def _start(self) -> None:
        fixed = ("dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port")  # the same on every
        # head unless given: a second head on the machine could not bind them
        ports = _free_ports(len(fixed), taken={self.port})
        self.temp_dir = tempfile.mkdtemp(prefix="ct-ray-")  # short: Ray's socket paths under it must fit 107 bytes
        start = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head",
                                  "--node-ip-address=127.0.0.1", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
                                  "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                                  *(f"--{option}={free}" for option, free in zip(fixed, ports))],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                                 start_new_session=True)
        self.session = start.pid  # `ray start` leads the session; the processes it starts stay in it
        output, _ = start.communicate(timeout=180)
        if start.returncode != 0:
            self.stop()
            pytest.fail(f"ray start failed:\n{output[-3000:]}")

    def processes(self) -> dict[int, str]:
        """pid -> command line of each live process of this head, its workers included."""
        return {pid: command for pid, (session, command) in _processes().items() if session == self.session}

    def stop(self) -> None:
        deadline = time.monotonic() + 60
        while (running := self.processes()) and time.monotonic() < deadline:  # a process may start meanwhile
            for pid in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        assert not running, f"processes of the Ray head at {self.address} outlived SIGKILL: {running}"


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (session id, command line) of each live process on the machine (zombies left out)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found[int(proc.name)] = (os.getsid(int(proc.name)), command.strip())
            except OSError:  # ended meanwhile
                continue
    return found


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(n: int, taken: Collection[int | None] = ()) -> list[int]:
    """n distinct ports nothing listens on, none of `taken`: their probes are held open together, or the system
    may hand out one port twice (a head then refused to start: "dashboard is trying to use a port number ... that
    is used by other components")."""
    with contextlib.ExitStack() as probes:
        ports: list[int] = []
        while len(ports) < n:
            probe = probes.enter_context(socket.socket())
            probe.bind(("127.0.0.1", 0))
            if (port := probe.getsockname()[1]) not in taken:
                ports.append(port)
        return ports  # nothing listens there once the probes are closed


@pytest.fixture(scope="module")
def cluster():
    head = RayHead()
    yield head
    head.stop()


def _config(tmp_path: Path, name: str, **train) -> Path:
    """The tiny config's JOBS."""
    raw = tiny_config_dict(tmp_path)
    raw["output_dir"] = str(tmp_path / name)
    raw["data"] |= {"symbols": ["BTCUSDT"], "timeframes": ["15m", "1h"]}
    raw["train"].update(train)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _run(forked: ForkServer, *args: str, timeout: int = 600, new_interpreter: bool = False
         ) -> subprocess.CompletedProcess:
    return forked.run("run", *args, cwd=REPO, env=ENV, timeout=timeout, new_interpreter=new_interpreter)


def _ledger(run_dir: Path) -> tuple[dict, dict]:
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        statuses = dict(db.execute("SELECT name, status FROM jobs"))
        attempts = {}
        for job, outcome in db.execute("SELECT job, outcome FROM attempts ORDER BY job, attempt"):
            attempts.setdefault(job, []).append(outcome)
    return statuses, attempts


def test_jobs_on_two_ray_workers_end_as_they_do_locally(forked, cluster, tmp_path):
    local = _run(forked, "--config", str(_config(tmp_path, "local")))
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = _run(forked, "--config", str(_config(tmp_path, "ray")), "--executor", "ray", "--ray-address",
                  cluster.address, "--workers", "2", "--cpus-per-worker", "1", "--tensorboard")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    # none of Ray's own start-up lines through the display; the run's own says what starting cost
    said = [line for line in on_ray.stderr.splitlines() if "Ray" in line]
    assert len(said) == 1 and re.fullmatch(r"Ray: 2 workers ready [\d.]+ s after the run asked for Ray \(connected "
                                           r"to Ray in [\d.]+ s\)", said[0]), said

    assert _ledger(tmp_path / "ray") == _ledger(tmp_path / "local") == (
        dict.fromkeys(JOBS, "done"), {job: ["done"] for job in JOBS})
    for job in JOBS:
        here, there = (tmp_path / where / "jobs" / job for where in ("local", "ray"))
        assert json.loads((there / "manifest.json").read_text()).keys() == \
            json.loads((here / "manifest.json").read_text()).keys()
        assert sorted(p.name for p in there.iterdir()) == sorted(p.name for p in here.iterdir())
        mine, theirs = (json.loads((d / "metrics.json").read_text()) for d in (here, there))
        assert theirs["epochs_run"] == mine["epochs_run"]
        np.testing.assert_allclose(theirs["best_val_loss"], mine["best_val_loss"], rtol=1e-3)
        for head, scores in mine["heads"].items():  # test MAE of each head's forecast, in price units
            np.testing.assert_allclose(theirs["heads"][head]["model"]["mae"], scores["model"]["mae"], rtol=1e-3)
        # the driver holds each job's last checkpoint, as a local run does: a longer budget goes on from it
        assert (tmp_path / "ray" / ".backup" / job / "checkpoint.npz").is_file()
        # and the TensorBoard logs the worker wrote, where a local run writes them
        for split in ("train", "validation"):
            assert list((tmp_path / "ray" / "tensorboard" / job / split).glob("events.out.tfevents.*")), (job, split)


def _checkpointed_epoch(backup: Path) -> int:
    try:
        with np.load(backup / "checkpoint.npz") as saved:
            return int(saved["epoch"])
    except (OSError, ValueError, KeyError):
        return 0


# Each kind of Ray process of ours, told apart among the head's processes by its command line (an actor's is
# Ray's title for it, e.g. "ray::_Worker.train" while it trains); the driver is the `cryptotrain run` process.
KINDS = {
    "worker": lambda command: command.startswith("ray::_Worker.train"),
    "mailbox": lambda command: command.startswith("ray::_Mailbox"),
    "raylet": lambda command: Path(command.split()[0]).name == "raylet",
    "gcs_server": lambda command: Path(command.split()[0]).name == "gcs_server",
}
NODE = ("raylet", "gcs_server")  # the head goes with them: the test starts the module's head again after


@pytest.mark.parametrize("victims, exit_code, said, pack", [
    # the run goes on: each job in a new worker; its mailbox killed next, with a new mailbox, the jobs under way
    # handed out again; then its driver killed, the same command goes on (one run for the three: each kill in a run of
    # its own would start a worker more, 10-15 s of CPU)
    (("worker", "mailbox", "driver"), -signal.SIGKILL,
     ("its Ray worker died", "Ray lost the mailbox the workers report to", ""), None),
    # one worker training both jobs packed (on Keras's JAX backend): both go on in its replacement
    (("worker",), 0, ("its Ray worker died",), 2),
    # the run stops, in one line: the executor's, or `cryptotrain run`'s should Ray end its driver process first;
    # the node started again, the same command goes on, and stops so again when the GCS is killed in its turn
    (("raylet", "gcs_server"), 1, ("the Ray node of this run is gone", "error: stopped: the Ray cluster at"), None),
], ids=["worker-mailbox-driver", "worker-of-a-pack", "raylet-gcs_server"])
def test_sigkill_of_a_ray_process_of_ours_mid_run_loses_no_finished_epoch(victims, exit_code, said, pack, cluster,
                                                                          forked, tmp_path):
    """SIGKILL of one kind of Ray process of ours while jobs train (of another after it, once a job has
    checkpointed an epoch since): no traceback; the run goes on, or ends (exit_code) and the same command goes on;
    either way every job resumes after the last checkpoint the driver held at the kill or later, no epoch is lost or
    repeated, no attempt counts as failed, every job is done exactly once."""
    if pack:
        pytest.importorskip("jax")
    config = _config(tmp_path, "run", epochs=4, batch_size=16)
    raw = yaml.safe_load(config.read_text())
    raw["data"]["max_rows"] = 1500  # epochs long enough to be killed in
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    # one worker, taking the jobs in turn (packed: both at once): each worker a process more that imports TensorFlow
    # and builds the model (10-15 s of CPU), and test_jobs_on_two_ray_workers_end_as_they_do_locally has two
    args = ["--config", str(config), "-v", "--executor", "ray", "--ray-address", cluster.address, "--workers", "1",
            *(["--pack", str(pack)] if pack else []), "--cpus-per-worker", "1",
            "--set", "executor.gcs_patience_s=0.5"]  # noticed well before the jobs end: their last three epochs
    # take ~2 s on a fast CPU (2026-11-28: with 2 s, a run finished both jobs before its GCS was missed)
    backups = tmp_path / "run" / ".backup"
    outputs = []  # each run's, the last one's once it ended
    kills = []  # for each kill: the checkpointed epoch of each job then, the jobs it was waited for, its run
    kept = {}  # for each run a kill ended: the checkpointed epoch of each job the same command went on from

    def start():
        return forked.start("run", *args, cwd=REPO, env=ENV, stderr_to_stdout=True, new_interpreter=bool(pack))

    def went_on() -> list[str]:
        """The jobs that have checkpointed an epoch since the last kill, in the new worker or run (their resumption
        shown: the driver shows a job's messages in order), or that had not started then."""
        at_kill, _, run = kills[-1]
        output = driver.stdout
        shown = _resumed(output.partition(said[len(kills) - 1])[2] if run == len(outputs) else output)
        return [job for job in JOBS
                if _checkpointed_epoch(backups / job) > at_kill[job] and (job in shown or at_kill[job] == 0)]

    try:
        driver = start()
        for victim in victims:
            deadline = time.monotonic() + 300
            if not kills:  # an epoch on the driver, more to go (a pack's jobs end their epochs together)
                watched = JOBS if pack else JOBS[:1]
                while min(_checkpointed_epoch(backups / job) for job in watched) < 1:
                    assert driver.poll() is None and time.monotonic() < deadline, driver.stdout[-3000:]
                    time.sleep(0.05)
            else:  # the jobs went on after the last kill
                while not (watched := went_on()):
                    assert driver.poll() is None and time.monotonic() < deadline, driver.stdout[-3000:]
                    time.sleep(0.05)
            kills.append(({job: _checkpointed_epoch(backups / job) for job in JOBS}, watched, len(outputs)))
            pids = [driver.pid] if victim == "driver" else \
                [pid for pid, command in cluster.processes().items() if KINDS[victim](command)]
            assert pids, f"no {victim} process"
            # a worker that packs trains on Keras's JAX backend and imports no TensorFlow (3-5 s of CPU each,
            # run.engine)
            assert not pack or not any("libtensorflow" in Path(f"/proc/{pid}/maps").read_text() for pid in pids)
            its_child = _children(driver.pid)  # the process that drives Ray: it dies with the command
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            if victim not in (*NODE, "driver"):
                continue  # the run goes on
            output, _ = driver.communicate(timeout=600)
            outputs.append(output)
            assert victim != "driver" or _gone(its_child), its_child
            assert driver.returncode == exit_code and "Traceback" not in output, output[-3000:]
            if exit_code == 1:  # its own line, the last
                lines = output.splitlines()
                assert [line for line in lines if line.startswith("error:")] == lines[-1:], output[-3000:]
            kept[len(outputs) - 1] = {job: _checkpointed_epoch(backups / job) for job in JOBS}
            if victim in NODE:  # the cluster back where it was
                cluster.restart()
            driver = start()  # the same command
        last, _ = driver.communicate(timeout=600)
        outputs.append(last)
        assert driver.returncode == 0 and "Traceback" not in last, last[-3000:]  # every job done
        said_in = [outputs[run] for _, _, run in kills]
        assert all(line in output for line, output in zip(said, said_in, strict=True)), said_in
        assert not pack or f"packed training on Ray workers: {pack} jobs at a time on each" in outputs[0], \
            outputs[0][-3000:]
    finally:
        if set(victims) & set(NODE) and not set(NODE) <= {Path(command.split()[0]).name
                                                         for command in cluster.processes().values()}:
            cluster.restart()  # for the module's next tests, had this one failed before it did

    for k, (at_kill, watched, run) in enumerate(kills):
        output = outputs[run]
        if run in kept and (k + 1 == len(kills) or kills[k + 1][2] != run):  # the kill that ended the run: the
            # same command went on after the last checkpoint on disk, each job it had not finished
            going_on = outputs[run + 1]
            if k + 1 < len(kills) and said[k + 1]:  # up to the next kill
                going_on = going_on[:going_on.index(said[k + 1])]
            resumed = _resumed(going_on)
            assert resumed == {job: epoch + 1 for job, epoch in kept[run].items() if 0 < epoch < 4}, (resumed, kept)
            continue
        # the run went on: the jobs under way in the same run, after the last checkpoint the driver had at the kill
        # or later; one whose training had ended when the kill landed (a worker's checkpoints reach the driver late
        # on a loaded machine) has no epoch left to resume at: it is evaluated in the new worker
        after = output[output.index(said[k]):]
        if k + 1 < len(kills) and kills[k + 1][2] == run and said[k + 1]:
            after = after[:after.index(said[k + 1])]  # up to the next kill
        resumed = _resumed(after)
        ended = {job for job in watched if not re.search(rf"^{job}: epoch", after, re.MULTILINE)
                 and len(pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")) == 4}
        assert set(watched) - ended <= resumed.keys(), after[-3000:]
        assert all(epoch - 1 >= max(at_kill[job], 1) for job, epoch in resumed.items()), (resumed, at_kill)
    statuses, attempts = _ledger(tmp_path / "run")
    assert statuses == dict.fromkeys(JOBS, "done")
    assert all(outcomes.count("done") == 1 and "failed" not in outcomes for outcomes in attempts.values()), attempts
    for job in JOBS:  # no epoch lost or repeated in what the job kept, none shown twice
        history = pd.read_csv(tmp_path / "run" / "jobs" / job / "history.csv")["epoch"].tolist()
        shown = [int(epoch) for output in outputs
                 for epoch in re.findall(rf"^{job}: epoch (\d)/4", output, re.MULTILINE)]
        assert history == list(range(1, len(history) + 1)), job
        assert shown == sorted(set(shown)) and set(shown) <= set(history), (job, shown, history)


def _resumed(output: str) -> dict[str, int]:
    """The epoch each job resumed at, as `output` says it (the last time, should it say it more than once)."""
    return {job: int(epoch) for job, epoch in re.findall(r"^(\w+): resuming at epoch (\d+) of 4", output, re.MULTILINE)}


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pids: list[int], timeout: float = 30) -> bool:
    """Whether every process of `pids` has ended (a zombie counts as ended) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while any(pid in _processes() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("victim, signum, said", [
    ("driver", signal.SIGKILL, "error: stopped: the run's Ray driver (process {child}) was killed (SIGKILL); run the "
                               "same command again to resume (finished epochs are kept)"),
    ("command", signal.SIGINT, "Aborted!"),  # passed on (no terminal sent it): the driver stops its own way
])
def test_the_command_outlives_its_ray_driver_and_passes_signals_on(victim, signum, said, forked, tmp_path):
    """`cryptotrain run --executor ray` drives Ray from a child process, which Ray may end without a word (when the
    raylet is gone): the command, outliving it, says what became of it in one line and exits 1. Here the child is
    SIGKILLed at once, while it starts (no Ray needed); or the command gets a SIGINT no terminal sent, which it
    passes on to the child (Ctrl-C at a terminal reaches both). The address answers (a listening socket, so that the
    command gets past its reachability check) and is no Ray: the child is stopped long before it would find out."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        command = forked.start("run", "--config", str(_config(tmp_path, "run")), "--executor", "ray",
                               "--ray-address", f"127.0.0.1:{listening.getsockname()[1]}", cwd=REPO, env=ENV,
                               default_sigint=True)
        deadline = time.monotonic() + 60
        while not (child := _children(command.pid)):
            assert command.poll() is None and time.monotonic() < deadline, command.communicate()
            time.sleep(0.01)
        os.kill(child[0] if victim == "driver" else command.pid, signum)
        out, err = command.communicate(timeout=60)
    assert command.returncode == 1, (out, err)
    assert err.strip().splitlines() == [said.format(child=child[0])], err
    assert not (tmp_path / "run").exists()


def test_the_tests_stop_only_their_own_ray(cluster, tmp_path):
    """Another Ray on the machine (a user's cluster, a second test run's) outlives this module's teardown: a run
    of the module's fixtures alone, next to this module's head (to that run, a Ray it did not start), stops the Ray it
    started and leaves the other running, every service of it. (The inner run sets up this test's fixtures: the
    module's head and nothing else, its body not run.)"""
    inner_tmp = tempfile.mkdtemp(prefix="ct-")  # where the inner run's head keeps its temp dir
    try:
        before = _services(cluster)
        inner = subprocess.run([sys.executable, "-m", "pytest", "--setup-only", "-p", "no:cacheprovider",
                                f"--basetemp={tmp_path / 'inner'}",
                                f"{__file__}::test_the_tests_stop_only_their_own_ray"],
                               cwd=REPO, capture_output=True, text=True, timeout=300, env={**ENV, "TMPDIR": inner_tmp})
        assert inner.returncode == 0 and "TEARDOWN M cluster" in inner.stdout, inner.stdout[-3000:]
        assert [command for _, command in _processes().values() if inner_tmp in command] == []  # its head gone
        assert _services(cluster) == before
    finally:
        shutil.rmtree(inner_tmp, ignore_errors=True)


def _services(head: RayHead) -> dict[int, str]:
    """The head's own processes (GCS, raylet, monitors; not its workers, which come and go)."""
    return {pid: command for pid, command in head.processes().items()
            if not command.startswith("ray::") and "default_worker.py" not in command}


def test_an_unreachable_cluster_is_one_line_and_nothing_is_written(forked, tmp_path):
    config = _config(tmp_path, "run")
    port = _free_port()
    result = _run(forked, "--config", str(config), "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                  timeout=120)
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: --ray-address 127.0.0.1:{port}: cannot reach the Ray cluster at 127.0.0.1:{port} ([Errno 111] "
        "Connection refused); start one with `ray start --head`, or leave --ray-address out for a Ray on this machine"]
    assert not (tmp_path / "run").exists()


def test_without_ray_local_runs_work_and_the_ray_executor_says_how_to_install_it(forked, tmp_path):
    config = str(_config(tmp_path, "run", epochs=1))
    local = forked.run("run", "--config", config, "--only", "BTCUSDT_1h", cwd=REPO, env=ENV, timeout=300,
                       without=["ray"])
    assert local.returncode == 0, local.stderr[-3000:]
    wanted = forked.run("run", "--config", config, "--executor", "ray", cwd=REPO, env=ENV, timeout=300,
                        without=["ray"])
    assert wanted.returncode == 2
    assert wanted.stderr.strip().splitlines() == [
        "error: --executor ray needs Ray: pip install 'cryptotrain[ray]' (or pip install 'ray>=2.9'), or run "
        "without --executor ray"]
