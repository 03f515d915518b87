"""The two kinds of failure a user sees, each as one line.

UserError: bad input to a command (config, arguments, a run directory that does not match):
           nothing is done, exit code 2.
JobError:  one job could not be done (missing data, failed download, NaN loss): recorded against
           that job, the other jobs go on, exit code 1 at the end.
And one way to stop: Terminated, SIGTERM turned into what Ctrl-C raises, so that both stop alike.
"""


class UserError(Exception):
    exit_code = 2


class JobError(Exception):
    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a process manager, `kill`, a notebook's stop button): a clean stop like Ctrl-C's."""
    exit_code = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
