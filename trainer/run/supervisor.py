"""A run on Ray drives it from a child process, which this one supervises (`run --executor ray`, cli.py)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

from ..errors import RunStopped


def ray_driver_in_a_child(at_close: Callable[[Callable[[], None]], None]) -> None:
    """A run on Ray, from a terminal or a script on Linux: this process forks, the child goes on as the run (it
    drives Ray) and this one waits for it. Ray ends a driver whose node's raylet is gone, at any moment, with a
    bare exit 1 from its C++ core ("Exiting because the Raylet IPC connection failed" in Ray's log; no Python
    handler runs), which the executor forestalls at the reads it makes but cannot everywhere: this process,
    outliving the child, says it in one line. The child dies with this process (kill -9 of the command kills the
    run); SIGTERM and SIGHUP are passed on to it, and SIGINT unless the terminal sent it (Ctrl-C reaches both).
    Not under click's CliRunner (no real stdout to share) nor off Linux, where the run stays in this process.
    `at_close` registers what the child calls once the command's last line is out (click's root context's
    call_on_close)."""
    try:
        sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    sys.stdout.flush(), sys.stderr.flush()
    parent, (said, say) = os.getpid(), os.pipe()
    # held until each side handles them: a signal in the instant after the fork is neither lost nor taken by the
    # interpreter's at-fork handlers
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    child = os.fork()
    if child == 0:
        os.close(said)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
        if os.getppid() != parent:  # it died before that
            os._exit(1)
        at_close(lambda: os.write(say, b"."))  # when the command's last line is out: the parent adds none
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return
    os.close(say)

    def pass_on(signum, frame):
        with contextlib.suppress(OSError, AttributeError, ValueError):  # no terminal
            if signum == signal.SIGINT and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp():
                return  # Ctrl-C: the terminal sent it to the child as well
        with contextlib.suppress(ProcessLookupError):  # it has ended
            os.kill(child, signum)

    for passed in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(passed, pass_on)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if os.read(said, 1):
        sys.exit(code if code >= 0 else 128 - code)
    how = f"was killed ({signal.Signals(-code).name})" if code < 0 else \
        f"ended with exit {code} (Ray's way when the Ray node of this run is gone: its log says why)"
    raise RunStopped(f"stopped: the run's Ray driver (process {child}) {how}; run the same command again to "
                     "resume (finished epochs are kept)")
