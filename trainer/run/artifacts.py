"""One self-describing directory per finished job (its files: jobdir.JobDir), written atomically with a sha256
manifest.

Files are written (once: straight from the job's result, see stage_job) into a staging directory beside the
final one, the manifest last, everything made durable; then the staging directory is renamed into place (commit):
a reader sees a complete job directory or none at all. The runner commits while the ledger confirms it still holds
the job (Ledger.mark_done); a process that lost the job discards its staging directory instead.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from ..files import fsync, pid_alive
from .jobdir import JobDir

STAGING_PREFIX = ".staging-"


def jobs_dir(run_dir: Path) -> Path:
    return run_dir / "jobs"


def staging_dir(run_dir: Path, job_name: str) -> Path:
    """A fresh, empty directory owned by this process for writing one job's files."""
    stage = jobs_dir(run_dir) / f"{STAGING_PREFIX}{job_name}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    return stage


def seal(stage: Path) -> str:
    """Write the manifest of a staging directory's files and make everything durable; returns the manifest's
    sha256."""
    digest = JobDir(stage).write_manifest()
    for path in stage.iterdir():
        fsync(path)
    return digest


def commit(stage: Path, final: Path) -> None:
    """Rename a sealed staging directory into place."""
    if final.exists():  # a stale directory whose manifest no longer verified: replaced, not merged
        shutil.rmtree(final)
    os.replace(stage, final)
    fsync(final.parent)


def stage_job(run_dir: Path, job_name: str, write: Callable[[Path], None]) -> tuple[Path, str]:
    """A job's files in a sealed staging directory of this process (`write` puts them there), ready to commit into
    jobs/JOB; and its manifest's sha256. What fails on the way leaves no staging directory; a process killed on
    the way leaves one that remove_abandoned_staging removes."""
    stage = staging_dir(run_dir, job_name)
    try:
        write(stage)
        return stage, seal(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def remove_abandoned_staging(run_dir: Path) -> list[Path]:
    """Staging directories of processes that died mid-write (their pid is gone)."""
    removed = []
    for stage in jobs_dir(run_dir).glob(f"{STAGING_PREFIX}*"):
        pid = stage.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stage, ignore_errors=True)
            removed.append(stage)
    return removed


def write_config(path: Path, config_data: dict) -> None:
    path.write_text(yaml.safe_dump(config_data, sort_keys=False))
