"""`cryptotrain` processes for the tests that stop one with a real signal, forked from a process that has imported
what the command imports (TensorFlow, Keras, pandas, ta, the trainer) already.

Each such test needs a process of its own to kill; started as `python -m trainer`, each spent ~5 s of its CPU
importing TensorFlow before doing anything the test is about, and the suite starts ~40 of them. The fork server (one
a test session, shared by its pytest-xdist workers, started by the first to need it: the `forked` fixture) pays the
imports once. What it forks is still a process of its own: its own pid, the signals sent to it, its own stdout and
stderr, its exit status as `waitpid` gives it (-9 for SIGKILL). It runs the command's `main` with the arguments
given, from the working directory and environment given, as `python -m trainer` or tests/kill_points.py would; or
as a user without some packages runs it (`without`: a package the server has not imported can be hidden). What a
forked process does not go through is the interpreter's start-up and the imports: tests/test_install.py and the demo
start the command as a user does.

The server is single-threaded, and nothing in it has used TensorFlow: a fork there copies no thread or runtime
state (TensorFlow starts its thread pools on first use, in the forked process). It ends when the process it serves
(the test session's: pytest, or pytest-xdist's controller) does.

    python -m tests.forkserver SOCKET OWNER_PID   (started by ForkServer)
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path

KILL_POINTS = str(Path(__file__).with_name("kill_points.py"))


class Forked:
    """A process the fork server forked, as much of subprocess.Popen as the tests use. Its stdout and stderr go to
    files (nothing to drain while it runs), read as text once it ended."""

    def __init__(self, connection: socket.socket, stdout, stderr) -> None:
        self._connection, self._out, self._err = connection, stdout, stderr
        self.pid = int(connection.recv(64))
        self.returncode: int | None = None

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                status = self._connection.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout) from None
            if not status:
                raise RuntimeError(f"the fork server ended before forked process {self.pid} did")
            self.returncode = int(status)
            self._connection.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self.wait()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout, self.stderr

    @property
    def stdout(self) -> str:
        return self._read(self._out)

    @property
    def stderr(self) -> str:
        return self._read(self._err)

    @staticmethod
    def _read(file) -> str:
        if file is None:  # stderr, sent to stdout
            return ""
        file.seek(0)
        return file.read().decode(errors="replace")


class ForkServer:
    """`cryptotrain` processes forked by the server in `directory` (`python -m tests.forkserver`), which the first
    ForkServer there starts, under a lock; the server ends when process `owner` does."""

    def __init__(self, directory: Path, owner: int) -> None:
        directory.mkdir(exist_ok=True)
        self._socket = str(directory / "socket")
        with open(directory / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(self._socket):  # started by another pytest-xdist worker of the session
                return
            with open(directory / "log", "a+b") as log:  # what the server itself says
                server = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self._socket, str(owner)],
                                          cwd=Path(__file__).parents[1], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=log, text=True)
                if server.stdout.readline() != "ready\n":
                    raise RuntimeError(f"the fork server did not start (exit code {server.wait()}): "
                                       f"{Forked._read(log)[-3000:]}")

    def start(self, *args: str, cwd: Path, env: dict[str, str] | None = None, kill_point: list[str] = (),
              default_sigint: bool = False, stderr_to_stdout: bool = False, new_interpreter: bool = False,
              without: Collection[str] = ()) -> Forked:
        """`cryptotrain ARGS` (through tests/kill_points.py, paused at `kill_point`'s POINT MARKER EPOCH_LOG, if
        given) in a process of its own; `default_sigint`: Ctrl-C raises KeyboardInterrupt, as in a command typed
        at a terminal (a process started in the background inherits SIGINT ignored); `new_interpreter`: as
        `python -m trainer` in the forked process, for a command that chooses its own Keras backend (--pack);
        `without`: as if these packages were not installed (NotInstalled)."""
        argv = [KILL_POINTS, *kill_point, *args] if kill_point else ["cryptotrain", *args]
        # appended to: a read meanwhile (its own offset is the process's too) never makes it write over what it wrote
        stdout = tempfile.TemporaryFile("a+b")  # noqa: SIM115 — Forked's, to read
        stderr = stdout if stderr_to_stdout else tempfile.TemporaryFile("a+b")  # noqa: SIM115
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(self._socket)
        request = {"argv": argv, "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                   "default_sigint": default_sigint, "new_interpreter": new_interpreter, "without": sorted(without)}
        socket.send_fds(connection, [json.dumps(request).encode()], [stdout.fileno(), stderr.fileno()])
        return Forked(connection, stdout, None if stderr_to_stdout else stderr)

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600,
            new_interpreter: bool = False, without: Collection[str] = ()) -> subprocess.CompletedProcess:
        process = self.start(*args, cwd=cwd, env=env, new_interpreter=new_interpreter, without=without)
        try:
            stdout, stderr = process.communicate(timeout)
        finally:
            process.kill()
        return subprocess.CompletedProcess(process.pid, process.returncode, stdout, stderr)


class NotInstalled:
    """As if `packages` were not installed: importing one raises ModuleNotFoundError (on sys.meta_path, first)."""

    def __init__(self, packages: Collection[str]) -> None:
        self.packages = set(packages)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _serve(path: str, owner: int) -> dict:
    """Fork a process for each request, until process `owner` ends; in the server, send each its pid, then its exit
    status. Returns (in the forked process only) the request it is to carry out."""
    from trainer.run.engine import import_tensorflow

    import_tensorflow()  # as `run` imports it (JAX left out: run.engine.jax_unimported)
    import tests.kill_points  # noqa: F401 — and through it trainer.cli, Keras, pandas
    import trainer.run.runner  # noqa: F401 — what `run` imports on its own

    gc.freeze()  # what every forked process inherits: its collections skip it, as a run's do (long_lived_frozen)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    owner_ended, waiting = os.pidfd_open(owner), {}  # readable once it has
    while True:
        readable = select.select([listener, owner_ended], [], [], 0.05)[0]
        if owner_ended in readable:
            break
        if listener in readable:
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 2)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                os.close(owner_ended)
                os.dup2(fds[0], 1)
                os.dup2(fds[1], 2)
                for fd in fds:
                    os.close(fd)
                return json.loads(message)
            for fd in fds:
                os.close(fd)
            connection.send(str(pid).encode())
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            with contextlib.suppress(OSError):  # its test may have given up on it
                waiting[pid].send(str(os.waitstatus_to_exitcode(status)).encode())
            waiting.pop(pid).close()
    raise SystemExit(0)


if __name__ == "__main__":
    request = _serve(sys.argv[1], int(sys.argv[2]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["default_sigint"]:  # as Python starts when SIGINT is not ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = request["argv"]
    if request["without"]:
        if imported := [package for package in request["without"] if package in sys.modules]:
            raise SystemExit(f"the fork server imported {imported}: a process forked from it cannot be without them")
        sys.meta_path.insert(0, NotInstalled(request["without"]))
    if request["new_interpreter"]:
        os.execv(sys.executable, [sys.executable, "-m", "trainer", *sys.argv[1:]])
    if sys.argv[0] == KILL_POINTS:
        from tests import kill_points
        kill_points.run(sys.argv[1:])
    else:
        from trainer.cli import main
        main(sys.argv[1:], prog_name="cryptotrain")
