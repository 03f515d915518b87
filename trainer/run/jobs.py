"""The job matrix: one job (data.Job) per symbol x timeframe, filtered by --only / --timeframes."""
from __future__ import annotations

import fnmatch

from ..config import RunConfig
from ..data import Job
from ..errors import ConfigError


def make_jobs(cfg: RunConfig, only: tuple[str, ...] = (), timeframes: tuple[str, ...] = ()) -> list[Job]:
    """Every symbol x timeframe of the config, in config order, keeping those that match.

    `only` holds shell-style patterns matched (case-insensitively) against the symbol or the job
    name, e.g. 'BTC*', 'ETHUSDT_1h'. An empty result is an error: a filter that matches nothing is
    almost always a typo.
    """
    unknown = [tf for tf in timeframes if tf not in cfg.data.timeframes]
    if unknown:
        raise ConfigError(
            f"--timeframes {','.join(unknown)}: not in data.timeframes ({', '.join(cfg.data.timeframes)})"
        )
    jobs = [
        Job(symbol, tf)
        for symbol in cfg.data.symbols
        for tf in cfg.data.timeframes
        if (not timeframes or tf in timeframes) and _matches(Job(symbol, tf), only)
    ]
    if not jobs:
        raise ConfigError(f"--only {' '.join(only)}: matches none of {', '.join(cfg.data.symbols)}")
    return jobs


def selected(name: str, only: tuple[str, ...] = (), timeframes: tuple[str, ...] = ()) -> bool:
    """Whether a job named SYMBOL_TIMEFRAME passes the --only / --timeframes filters, as in make_jobs."""
    job = Job.from_name(name)
    return (not timeframes or job.timeframe in timeframes) and _matches(job, only)


def _matches(job: Job, patterns: tuple[str, ...]) -> bool:
    if not patterns:
        return True
    return any(
        fnmatch.fnmatchcase(job.symbol, p.upper()) or fnmatch.fnmatchcase(job.name.upper(), p.upper())
        for p in patterns
    )
