"""One self-describing directory per finished job, written atomically with a sha256 manifest.

Files are written (once: straight from the job's result, see commit_job) into a staging directory beside the
final one, the manifest last, then the staging directory is renamed into place: a reader sees a complete job
directory or none at all.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..evaluation import charts
from ..evaluation.results import Headline
from ..files import fsync, pid_alive, sha256_file
from ..formatting import number

MANIFEST = "manifest.json"
STAGING_PREFIX = ".staging-"


def jobs_dir(run_dir: Path) -> Path:
    return run_dir / "jobs"


def staging_dir(run_dir: Path, job_name: str) -> Path:
    """A fresh, empty directory owned by this process for writing one job's files."""
    stage = jobs_dir(run_dir) / f"{STAGING_PREFIX}{job_name}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    return stage


def commit(stage: Path, final: Path) -> str:
    """Write the manifest, make everything durable, rename into place; returns the manifest's sha256."""
    files = {p.name: sha256_file(p) for p in sorted(stage.iterdir()) if p.name != MANIFEST}
    (stage / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
    for path in stage.iterdir():
        fsync(path)
    if final.exists():  # a stale directory whose manifest no longer verified: replaced, not merged
        shutil.rmtree(final)
    os.replace(stage, final)
    fsync(final.parent)
    return sha256_file(final / MANIFEST)


def commit_job(run_dir: Path, job_name: str, write: Callable[[Path], None]) -> str:
    """A job's directory: `write` puts its files into a staging directory of this process, which is then
    committed (see commit). What fails on the way leaves no staging directory; a process killed on the way
    leaves one that remove_abandoned_staging removes."""
    stage = staging_dir(run_dir, job_name)
    try:
        write(stage)
        return commit(stage, jobs_dir(run_dir) / job_name)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def verify(job_dir: Path) -> str | None:
    """The manifest's sha256 if every listed file is present and intact, else None."""
    manifest = job_dir / MANIFEST
    if not manifest.is_file():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return None
    for name, digest in files.items():
        path = job_dir / name
        if not path.is_file() or sha256_file(path) != digest:
            return None
    return sha256_file(manifest)


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


def plot(path: Path, history: pd.DataFrame, target_times: np.ndarray, predicted_close: np.ndarray,
         actual_close: np.ndarray, title: str, *, persistence_close: np.ndarray | None = None,
         scores: Headline | None = None, synthetic: bool = False) -> None:
    """The report's two charts of the job (charts.py) in one PNG: its loss curves, and the predicted vs actual
    close of the first forecast step on the test split.

    persistence_close: each sample's last input close (persistence's forecast), drawn dashed.
    scores: the job's headline test metrics (JobMetrics.headline: MAE, persistence's, skill), in the title.
    synthetic: the candles were generated; the figure says so in red."""
    # Imported here: the HTML report and `cryptotrain status` use this module and need no Matplotlib.
    from matplotlib.figure import Figure  # the object API: no GUI backend, safe on headless servers

    fig = Figure(figsize=(11, 6.5))
    heading = f"{title}: training loss, and the test split in price units"
    if scores:
        heading += (f"\ntest {scores.label} (every horizon step): MAE {number(scores.mae, '.5g')} vs persistence "
                    f"{number(scores.persistence_mae, '.5g')}, skill {number(scores.skill, '+.4f', missing='n/a')}")
    fig.suptitle(heading, fontsize=11)
    if synthetic:
        fig.text(0.01, 0.985, "SYNTHETIC data", color="white", fontweight="bold", fontsize=11, ha="left", va="top",
                 bbox={"boxstyle": "round,pad=0.3", "facecolor": "#c62828", "edgecolor": "none"})
    losses, prices = fig.subplots(2, 1)
    charts.draw(losses, charts.loss_chart(history))
    charts.draw(prices, charts.price_chart(target_times, actual_close, predicted_close, persistence_close))
    fig.subplots_adjust(left=0.08, right=0.97, top=0.84 if scores else 0.88, hspace=0.5)
    fig.savefig(path, dpi=72)
