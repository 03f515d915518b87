"""The two kinds of failure a user sees, each as one line.

UserError: bad input to a command (config, arguments, a run directory that does not match):
           nothing is done, exit code 2.
JobError:  one job could not be done (missing data, failed download, NaN loss): recorded against
           that job, the other jobs go on, exit code 1 at the end.
And the ways a run stops: Terminated, SIGTERM turned into what Ctrl-C raises, so that both stop alike;
Interrupted, what a run raises once it has released the jobs under way; RunStopped, a run that cannot go on
(a full disk), its jobs left to resume, exit code 1.
"""


class UserError(Exception):
    exit_code = 2


RAY_MISSING = ("--executor ray needs Ray: pip install 'cryptotrain[ray]' (or pip install 'ray>=2.9'), or run without "
               "--executor ray")


class ConfigError(UserError):
    """A bad config or override: the message is one line naming the file and the key path."""


class JobError(Exception):
    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a process manager, `kill`, a notebook's stop button): a clean stop like Ctrl-C's."""
    exit_code = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM, its jobs under way released to resume from their last epoch."""

    def __init__(self, jobs: list[str], exit_code: int) -> None:
        super().__init__(f"interrupted during {', '.join(jobs)}" if jobs else "interrupted")
        self.jobs, self.exit_code = jobs, exit_code


class RunStopped(Exception):
    exit_code = 1


def out_of_memory(exc: BaseException) -> bool:
    """Whether an error is a failed allocation on the device: TensorFlow's ResourceExhaustedError, or XLA's
    RESOURCE_EXHAUSTED (JAX's JaxRuntimeError)."""
    return "ResourceExhausted" in type(exc).__name__ or str(exc).startswith("RESOURCE_EXHAUSTED")


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, cut to `limit` characters ("" for an empty message): what a
    one-line error shows of a cause it did not raise itself."""
    return (str(exc).strip().splitlines() or [""])[0][:limit]


def cause(exc: BaseException) -> str:
    """first_line, or the exception's type when its message is empty (a bare ConnectionError, a KeyError())."""
    return first_line(exc) or type(exc).__name__
