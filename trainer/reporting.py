"""What a run shows and leaves behind for people: the live progress display, the summary table and
files (summary.csv / summary.json), and `cryptotrain status` (which needs no TensorFlow, so answers at once)."""
from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from .errors import UserError
from .files import atomic_write
from .jobs import Job, selected
from .ledger import STATUSES, Ledger

console = Console(stderr=True)  # progress and warnings; tables go to stdout


# ----------------------------------------------------------------------------- progress
class JobProgress:
    """Rich progress: one bar for the jobs (i/N, ETA), one for the current job's epochs and losses."""

    def __init__(self, total: int, done: int) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False)
        self.jobs_task = self.progress.add_task("jobs", total=total, completed=done, info="")
        self.epoch_task = None
        self._job = ""
        self._finished: set[str] = set()  # a job retried after a failure counts once

    def __enter__(self) -> JobProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start_job(self, job: Job) -> None:
        if self.epoch_task is not None:
            self.progress.remove_task(self.epoch_task)
        self.epoch_task = self.progress.add_task(f"  {job.name}", total=None, info="loading data")
        self._job = job.name

    def finish_job(self, job: Job, line: str) -> None:
        if job.name not in self._finished:
            self._finished.add(job.name)
            self.progress.advance(self.jobs_task)
        self.progress.console.print(f"{job.name}: {line}")

    def training_started(self, epochs: int, done: int = 0) -> None:
        """`done`: epochs an interrupted run of this job had finished, which training goes on after."""
        self.progress.update(self.epoch_task, total=epochs, completed=done,
                             info=f"resuming at epoch {done + 1}" if done else "training")
        if done:
            saved = "epoch 1 was" if done == 1 else f"epochs 1-{done} were"
            self.progress.console.print(f"{self._job}: resuming at epoch {done + 1} of {epochs} ({saved} saved)")

    def epoch_ended(self, epoch: int, logs: dict) -> None:
        info = f"loss {logs.get('loss', float('nan')):.4g}  val {logs.get('val_loss', float('nan')):.4g}"
        self.progress.update(self.epoch_task, completed=epoch + 1, info=info)


# ----------------------------------------------------------------------------- summary and status
SUMMARY_COLUMNS = ["job", "epochs", "best_epoch", "best_val_loss", "head", "test_mae", "persistence_mae", "skill",
                   "shrink", "direction_accuracy", "majority_rate", "seconds", "train_step_seconds", "rss_mb",
                   "synthetic"]


def write_summary(run_dir: Path, ledger: Ledger) -> None:
    # The ledger's seconds cover the whole job, artifacts included (metrics.json's stop before them).
    rows = [{**j.summary, "seconds": round(j.seconds, 2)} for j in ledger.jobs() if j.status == "done" and j.summary]
    atomic_write(run_dir / "summary.json", lambda tmp: tmp.write_text(json.dumps(rows, indent=1, allow_nan=False)))
    lines = [",".join(SUMMARY_COLUMNS)] + [",".join(str(row.get(c, "")) for c in SUMMARY_COLUMNS) for row in rows]
    atomic_write(run_dir / "summary.csv", lambda tmp: tmp.write_text("\n".join(lines) + "\n"))


def summary_line(summary: dict) -> str:
    return (f"done in {summary['epochs']} epochs, test MAE ({summary['head']}) {summary['test_mae']:.4g} vs "
            f"persistence {summary['persistence_mae']:.4g}: skill {_fmt(summary['skill'], '+.3f')}"
            f"{verdict(summary['skill'])}"
            + ("; validation found no deviation from no change worth keeping" if summary.get("shrink") == 0 else ""))


def verdict(skill: float | None) -> str:
    """What a skill means, said plainly."""
    if skill is None:
        return ""
    return " (better than persistence)" if skill > 0 else " (WORSE than persistence: repeating the last close " \
        "forecasts better)" if skill < 0 else " (no better than persistence)"


def print_summary_table(records) -> None:
    """The run's table (the close, test split, price units), then one line per failed job."""
    table = Table(title="summary: the close on the test split, every horizon step, price units", box=box.SIMPLE_HEAD,
                  padding=(0, 1), collapse_padding=True, pad_edge=False)
    table.add_column("job", no_wrap=True, min_width=max((len(r.name) for r in records), default=3))
    table.add_column("status", no_wrap=True)
    for column in ("epochs", "MAE", "persist.", "skill", "dir", "major."):
        table.add_column(column, justify="right", no_wrap=True, min_width=5)
    synthetic = False
    for record in records:
        s = record.summary or {}
        synthetic |= bool(s.get("synthetic"))
        table.add_row(record.name, record.status + ("*" if s.get("synthetic") else ""), _fmt(s.get("epochs")),
                      _fmt(s.get("test_mae")), _fmt(s.get("persistence_mae")),
                      _fmt(s.get("skill"), "+.3f"), _fmt(s.get("direction_accuracy"), ".3f"),
                      _fmt(s.get("majority_rate"), ".3f"))
    table.caption = "skill = 1 - MAE / persistence MAE (< 0: worse than repeating the last close)\n" \
        "dir: direction accuracy of the close; major.: the majority-class rate"
    if synthetic:
        table.caption += "\n* trained on SYNTHETIC candles: these numbers show the pipeline, not a market"
    out = Console()  # stdout, unlike the progress console
    out.print(table)
    for record in records:
        if record.status == "failed":
            out.print(f"{record.name} failed: {record.error}", markup=False, soft_wrap=True)


def _fmt(value, spec: str = ".4g") -> str:
    if value is None:  # e.g. the skill when persistence is exact (its MAE 0)
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def print_status(run_dir: Path, as_json: bool = False, only: tuple[str, ...] = (),
                 timeframes: tuple[str, ...] = ()) -> None:
    """The run's jobs (those matching --only / --timeframes), one line each, errors cut to fit the line
    (whole in --json)."""
    if not (run_dir / "ledger.sqlite").is_file():
        raise UserError(f"{run_dir}: not a run directory (no ledger.sqlite); runs live under runs/<config name>")
    ledger = Ledger(run_dir)
    records = [r for r in ledger.jobs() if selected(r.name, only, timeframes)]
    if (only or timeframes) and not records:
        raise UserError(f"{run_dir}: no job matches {' '.join([*only, *timeframes])}")
    if as_json:
        print(json.dumps([vars(r) for r in records], indent=1, default=str))
        return
    repos = sorted({r.pushed_repo for r in records if r.pushed_commit})
    table = Table(title=f"{run_dir}", caption=f"pushed to {', '.join(repos)}" if repos else None,
                  box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    rows = []
    for r in records:
        s = r.summary or {}
        owner = f"pid {r.pid} on {r.host}, heartbeat {_ago(r.heartbeat_at)}" if r.status == "running" else ""
        error = " ".join((r.error or "").split())  # one line, however many the error had
        rows.append((r.name, r.status, str(r.attempts), _fmt(s.get("test_mae")), _fmt(s.get("skill"), "+.3f"),
                     _fmt(r.seconds, ".0f"), (r.pushed_commit or "")[:7], error or owner))
    # Every column keeps its width; the error is what is cut to fit the terminal (whole in --json).
    out = Console()
    widths = [max([len(column)] + [len(row[i]) for row in rows])
              for i, column in enumerate(("job", "status", "tries", "MAE", "skill", "secs", "pushed"))]
    room = max(20, out.width - sum(widths) - 2 * len(widths) - 1)
    for i, column in enumerate(("job", "status", "tries", "MAE", "skill", "secs", "pushed")):
        table.add_column(column, no_wrap=True, min_width=widths[i], justify="left" if i < 2 else "right")
    table.add_column("error / owner", no_wrap=True, max_width=room)
    for row in rows:
        table.add_row(*row[:-1], row[-1] if len(row[-1]) <= room else row[-1][:room - 1] + "…")
    out.print(table)
    counts = Counter(r.status for r in records)
    print(", ".join(f"{counts[status]} {status}" for status in STATUSES))


def _ago(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    return f"{time.time() - timestamp:.0f}s ago at {datetime.fromtimestamp(timestamp, timezone.utc):%H:%M:%S}Z"
