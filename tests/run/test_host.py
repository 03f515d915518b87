"""run.host: a job's host work on worker processes of their own, as it would run inline: its result, its log lines, its
exceptions (one that would not survive pickling comes back as one of its kind), a worker that dies; and which jobs a
pack takes of those prepared (runner.like_lengths)."""
from __future__ import annotations

import logging
import os
import signal

import pytest

from trainer.errors import JobError, UserError
from trainer.run.host import HostPool, HostTraceback, Inline, host_workers
from trainer.run.runner import like_lengths

pytestmark = pytest.mark.processes  # worker processes


class _Unpicklable(UserError):
    """An error whose class cannot be rebuilt from its arguments (as run.jobdir.JobFileError's)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


def _logs_then_returns(value: int) -> int:
    logging.getLogger("trainer.data.market").info("reference %s left out", "XRPUSDT")
    return value * 2


def _raises(kind: str) -> None:
    if kind == "job":
        raise JobError("BTCUSDT_1h.csv.gz: 12 candles are too few")
    raise _Unpicklable("jobs/BTCUSDT_1h/metrics.json", "not JSON")


def _dies() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _pid() -> int:
    return os.getpid()


def test_host_work_on_workers_comes_back_as_it_would_inline(caplog):
    caplog.set_level(logging.INFO)  # the run's logging, as the workers start: theirs
    pool = HostPool(2)
    try:
        assert pool.submit(_logs_then_returns, 21).result(timeout=60) == 42
        assert [(r.name, r.getMessage()) for r in caplog.records] == [
            ("trainer.data.market", "reference XRPUSDT left out")]  # logged here, as if it ran here
        assert pool.submit(_pid).result(timeout=60) != os.getpid()

        with pytest.raises(JobError, match=r"^BTCUSDT_1h.csv.gz: 12 candles are too few$") as raised:
            pool.submit(_raises, "job").result(timeout=60)
        assert isinstance(raised.value.__cause__, HostTraceback) and "_raises" in str(raised.value.__cause__)
        # not the class it was (it would not come back), but of its kind, saying the same
        with pytest.raises(UserError, match=r"^jobs/BTCUSDT_1h/metrics.json: not JSON$"):
            pool.submit(_raises, "unpicklable").result(timeout=60)

        # a worker killed under its task (the out-of-memory killer, say) fails that task; the next gets new workers
        with pytest.raises(Exception, match="terminated abruptly"):
            pool.submit(_dies).result(timeout=60)
        assert pool.submit(_logs_then_returns, 1).result(timeout=60) == 2
    finally:
        pool.close()


def test_inline_host_work_runs_in_this_process_and_auto_is_inline_for_one_job_at_a_time():
    host = Inline()
    assert host.submit(_pid).result() == os.getpid()
    with pytest.raises(JobError):
        host.submit(_raises, "job").result()
    assert host_workers("auto", 1) == 1 and host_workers("3", 1) == 3
    assert 1 <= host_workers("auto", 8) <= len(os.sched_getaffinity(0))


def test_a_pack_takes_the_jobs_of_likest_lengths_the_earliest_claimed_where_it_is_a_tie():
    # sorted by length: 95 (3), 100 (0), 390 (4), 400 (1), 410 (2); two of them: 400 and 410 idle least
    assert like_lengths([100, 400, 410, 95, 390], 2) == [1, 2]
    assert like_lengths([100, 400, 410, 95, 390], 3) == [1, 2, 4]
    assert like_lengths([300, 300, 300, 300], 2) == [0, 1]
    assert like_lengths([5, 7], 4) == [0, 1]
