"""What the command line shows and a run leaves behind for people: the live progress display, the summary
table and files (summary.csv / summary.json), `cryptotrain status` (which needs no TensorFlow, so answers at
once), and the rendering of what the other commands' library functions return (plan, doctor, features, data
download, predict). The library never prints; cli.py calls these."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ..errors import UserError
from ..evaluation.results import JobSummary, calibration_text
from ..formatting import NO_DIRECTION, direction, number
from ..run.jobs import Job, selected
from ..run.ledger import STATUSES

if TYPE_CHECKING:  # the modules behind these import pandas or TensorFlow; status must answer at once
    from ..data import DownloadOutcome
    from ..data.features import FeatureOutcome
    from ..model.device import Diagnosis
    from ..publish.predict import Prediction, TrackRecord
    from ..run.planning import Plan
    from ..run.rundir import RunDir

console = Console(stderr=True)  # progress and warnings; tables go to stdout
NOTEBOOK_ENV = {"JPY_PARENT_PID", "COLAB_RELEASE_TAG"}  # set for a Jupyter kernel's (Colab's) commands


# ----------------------------------------------------------------------------- progress
class JobProgress:
    """What a run shows while it works (pipeline.Events, for every job under way). On a terminal: one bar for
    the jobs (i/N, ETA) and one per job under way for its epochs and losses, with a line per finished job above
    them. Piped to a file or another program: no bars, the same line per finished job. `verbose`: a line per
    epoch too.

    While the bars are live, whatever native code writes to the process's stderr (TensorFlow's C++ log) is
    shown above them as a line of its own (NativeStderr) instead of tearing them."""

    def __init__(self, verbose: bool = False) -> None:
        # A notebook's shell command (`!cryptotrain run` in Jupyter or Colab) runs on a terminal of its own, whose
        # output cell does not redraw bars: plain lines there too
        self.live = console.is_terminal and not NOTEBOOK_ENV & os.environ.keys()
        self.verbose = verbose
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False, disable=not self.live)
        self.jobs_task = None
        self._bars: dict[str, int] = {}  # job -> its epochs bar
        self._epochs: dict[str, int] = {}
        self._finished: set[str] = set()  # a job retried after a failure counts once

    @contextlib.contextmanager
    def running(self, total: int, done: int) -> Iterator[None]:
        """The bars, live while the jobs run (`done` of `total` already)."""
        self.jobs_task = self.progress.add_task("jobs", total=total, completed=done, info="")
        with NativeStderr() if self.live else contextlib.nullcontext():
            self.progress.start()
            try:
                yield
            finally:
                self.progress.stop()

    def start_job(self, job: Job) -> None:
        self._bars[job.name] = self.progress.add_task(f"  {job.name}", total=None, info="loading data")

    def finish_job(self, job: Job, line: str, failed: bool = False) -> None:
        if (bar := self._bars.pop(job.name, None)) is not None:
            self.progress.remove_task(bar)
        if job.name not in self._finished:
            self._finished.add(job.name)
            if self.jobs_task is not None:
                self.progress.advance(self.jobs_task)
        self.note(f"{job.name}: {'failed: ' if failed else ''}{line}", style="red" if failed else None)

    def job_done(self, job: Job, summary: JobSummary) -> None:
        self.finish_job(job, summary_line(summary))

    def training_started(self, job: str, epochs: int, done: int = 0) -> None:
        """`done`: epochs an interrupted run of this job had finished, which training goes on after."""
        self._epochs[job] = epochs
        if (bar := self._bars.get(job)) is not None:
            self.progress.update(bar, total=epochs, completed=done,
                                 info=f"resuming at epoch {done + 1}" if done else "training")
        if done:
            saved = "epoch 1 was" if done == 1 else f"epochs 1-{done} were"
            self.note(f"{job}: resuming at epoch {done + 1} of {epochs} ({saved} saved)")

    def epoch_ended(self, job: str, epoch: int, logs: dict) -> None:
        info = f"loss {logs.get('loss', float('nan')):.4g}  val {logs.get('val_loss', float('nan')):.4g}"
        if (bar := self._bars.get(job)) is not None:
            self.progress.update(bar, completed=epoch + 1, info=info)
        if self.verbose:
            self.note(f"{job}: epoch {epoch + 1}/{self._epochs.get(job, '?')}  {info}")

    def note(self, line: str, style: str | None = None) -> None:
        """One line, never wrapped (a log file keeps one line per event), never read as markup."""
        console.print(Text(line, style=style or ""), soft_wrap=True)


class NativeStderr:
    """While active, file descriptor 2 is a pipe read by a thread that prints each line through the console
    (dimmed), so that the live display stays whole; Python's sys.stderr writes to the real stderr meanwhile
    (rich's live display routes it above the bars)."""

    def __enter__(self) -> NativeStderr:
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._python_stderr = sys.stderr
        sys.stderr = open(self._saved_fd, "w", buffering=1, closefd=False, errors="replace")
        self._relay = threading.Thread(target=self._print_lines, args=(read_fd,), daemon=True,
                                       name="native-stderr")
        self._relay.start()
        return self

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved_fd, 2)  # the pipe's last write end closes: the relay reads to the end and stops
        self._relay.join(timeout=5)
        sys.stderr.close()
        sys.stderr = self._python_stderr
        os.close(self._saved_fd)

    @staticmethod
    def _print_lines(read_fd: int) -> None:
        with open(read_fd, "rb") as pipe:
            for line in pipe:
                console.print(Text(line.decode(errors="replace").rstrip(), style="dim"), soft_wrap=True)


# ----------------------------------------------------------------------------- summary and status
def summary_line(summary: JobSummary) -> str:
    return (f"done in {summary.epochs} epochs, test MAE ({summary.head}) {summary.test_mae:.4g} vs "
            f"persistence {summary.persistence_mae:.4g}: skill {skill_text(summary.skill)}{verdict(summary.skill)}"
            + ("; validation found no deviation from no change worth keeping" if summary.shrink == 0 else "")
            + repeating_phrase(summary.repeating) + candle_phrase(summary))


def repeating_phrase(heads: list[str]) -> str:
    """The heads served as their persistence, said plainly."""
    if not heads:
        return ""
    return (f"; validation found {', '.join(heads)} no better than repeating {'its' if len(heads) == 1 else 'their'}"
            " last value: served as that")


def candle_phrase(summary: JobSummary) -> str:
    """The size of the next candle vs HAR + time of day on its validation level, and the 80 % interval's coverage,
    said plainly."""
    skills = {"high": summary.high_skill_har, "low": summary.low_skill_har, "range": summary.range_skill_har}
    if all(v is None for v in skills.values()):
        return ""
    worse = [q for q, v in skills.items() if v is not None and v < 0]
    weight = summary.network_weight
    combined = "" if weight is None else " (HAR alone: validation gave the network no weight)" if weight == 0 else \
        f" (the network weighted {weight:.2f} beside HAR)"
    return ("; next candle vs HAR + time of day on its level" + combined + ": "
            + ", ".join(f"{q} {number(v, '+.3f')}" for q, v in skills.items())
            + (f" (WORSE than HAR for the {' and the '.join(worse)})" if worse else "")
            + (f"; 80 % interval covered {summary.interval_coverage:.0%} of the test split"
               if summary.interval_coverage is not None else ""))


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
        s = record.summary
        figures = ["-"] * 6 if s is None else [
            number(s.epochs, "d"), number(s.test_mae, ".4g"), number(s.persistence_mae, ".4g"), number(s.skill, "+.3f"),
            direction(s.direction_accuracy, s.shrink), number(s.majority_rate, ".3f")]
        flagged = s is not None and s.synthetic
        synthetic |= flagged
        table.add_row(record.name, record.status + ("*" if flagged else ""), *figures)
    table.caption = "skill = 1 - MAE / persistence MAE (< 0: worse than repeating the last close)\n" \
        f"dir: direction accuracy of the close ({NO_DIRECTION}: shrunk to exactly no change, it forecasts no " \
        "direction); major.: the majority-class rate"
    if synthetic:
        table.caption += "\n* trained on SYNTHETIC candles: these numbers show the pipeline, not a market"
    out = Console()  # stdout, unlike the progress console
    out.print(table)
    candles = [(r.name, r.summary) for r in records if r.summary and r.summary.range_skill_har is not None]
    if candles:
        sizes = Table(title="the next candle: MAE skill vs HAR + time of day on its validation level, test split",
                      box=box.SIMPLE_HEAD,
                      padding=(0, 1), collapse_padding=True, pad_edge=False,
                      caption="high / low: excursion from the last close; range: ln(high / low) (< 0: worse than "
                              "HAR)\nnetwork: its weight beside HAR, chosen on validation (0: HAR alone)\n"
                              "80 % interval: how often it held the next close")
        sizes.add_column("job", no_wrap=True)
        for column in ("high", "low", "range", "network", "80 % interval"):
            sizes.add_column(column, justify="right", no_wrap=True)
        for name, s in candles:
            sizes.add_row(name, *(number(v, "+.3f") for v in (s.high_skill_har, s.low_skill_har, s.range_skill_har)),
                          number(s.network_weight, ".2f"), number(s.interval_coverage, ".1%"))
        out.print(sizes)
    for record in records:
        if record.status == "failed":
            out.print(f"{record.name} failed: {record.error}", markup=False, soft_wrap=True)


def print_run_end(outcome, report: Path | None) -> None:
    """After a run (runner.Outcome, and its report.html: None where it could not be written): the summary table,
    the totals with where to look, how to retry."""
    records = outcome.records
    print_summary_table(records)
    notes = [f"{outcome.count('pending')} pending"] if outcome.count("pending") else []
    notes += [f"{outcome.count('running')} still running in another process"] if outcome.count("running") else []
    notes += [f"{outcome.not_pushed} not pushed to the Hub"] if outcome.not_pushed else []
    console.print(f"{outcome.count('done')}/{len(records)} jobs done, {outcome.count('failed')} failed"
                  + "".join(f", {note}" for note in notes) + f"; run directory: {outcome.run_dir}"
                  + (f"; report: {report}" if report else ""), soft_wrap=True, markup=False,
                  highlight=False)
    if outcome.device is not None and outcome.device.training > 0:
        console.print(outcome.device.line(), soft_wrap=True, markup=False, highlight=False)
    if outcome.count("failed"):
        console.print("Failed jobs whose candles you fix are retried when you run the same command again; to retry "
                      f"the others as they are, add --retry-failed (or --retries {outcome.retries + 1})",
                      soft_wrap=True, markup=False, highlight=False)


def print_resume_hint(command: str, jobs: list[str]) -> None:
    during = f" during {', '.join(jobs)}" if jobs else ""
    console.print(f"\nInterrupted{during}; finished epochs are saved. Resume with:\n  {command}",
                  soft_wrap=True, markup=False, highlight=False)  # one line, to copy and paste


def skill_text(skill: float | None) -> str:
    """A skill to three decimals, or in two significant digits where those would show a tiny gain or loss as
    +0.000 beside the verdict "better" or "WORSE"."""
    if skill is not None and 0 < abs(skill) < 0.0005:
        return f"{skill:+.1e}"
    return number(skill, "+.3f")


def print_status(run: RunDir, as_json: bool = False, only: tuple[str, ...] = (),
                 timeframes: tuple[str, ...] = (), show_all: bool = False) -> None:
    """The run's jobs (those matching --only / --timeframes), one line each, errors cut to fit the line
    (whole in --json). Jobs of the config that no run has asked for yet are counted apart from the pending
    ones (listed with `show_all`; always in --json, with selected_at null)."""
    run_dir = run.path
    matching = [r for r in run.ledger.jobs() if selected(r.name, only, timeframes)]
    if (only or timeframes) and not matching:
        raise UserError(f"{run_dir}: no job matches {' '.join([*only, *timeframes])}")
    if as_json:
        print(json.dumps([r.to_dict() for r in matching], indent=1, default=str))
        return
    records = [r for r in matching if show_all or r.selected_at is not None]
    never = [r.name for r in matching if r.selected_at is None]
    repos = sorted({r.pushed_repo for r in records if r.pushed_commit})
    table = Table(title=f"{run_dir}", caption=f"pushed to {', '.join(repos)}" if repos else None,
                  box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    rows = []
    for r in records:
        mae, skill, range_skill = (None,) * 3 if r.summary is None else (
            r.summary.test_mae, r.summary.skill, r.summary.range_skill_har)
        owner = f"pid {r.pid} on {r.host}, heartbeat {_ago(r.heartbeat_at)}" if r.status == "running" else ""
        error = " ".join((r.error or "").split())  # one line, however many the error had
        state = r.status if r.selected_at is not None else "not selected"
        rows.append((r.name, state, str(r.attempts), number(mae, ".4g"), number(skill, "+.3f"),
                     number(range_skill, "+.3f"), number(r.seconds, ".0f"), (r.pushed_commit or "")[:7],
                     error or owner))
    # Every column keeps its width; the error is what is cut to fit the terminal (whole in --json).
    out = Console()
    columns = ("job", "status", "tries", "MAE", "skill", "rng/HAR", "secs", "pushed")
    widths = [max([len(column)] + [len(row[i]) for row in rows]) for i, column in enumerate(columns)]
    room = max(20, out.width - sum(widths) - 2 * len(widths) - 1)
    for i, column in enumerate(columns):
        table.add_column(column, no_wrap=True, min_width=widths[i], justify="left" if i < 2 else "right")
    table.add_column("error / owner", no_wrap=True, max_width=room)
    for row in rows:
        table.add_row(*row[:-1], row[-1] if len(row[-1]) <= room else row[-1][:room - 1] + "…")
    out.print(table)
    counts = Counter(r.status for r in matching if r.selected_at is not None)
    print(", ".join(f"{counts[status]} {status}" for status in STATUSES)
          + (f"; {len(never)} never selected" if never else ""))
    if never and not show_all:  # jobs of the config that runs so far left out with --only / --timeframes
        listed = ", ".join(never[:3]) + (", ..." if len(never) > 3 else "")
        print(f"never selected: {listed} (--all lists them)")


def _ago(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    return f"{time.time() - timestamp:.0f}s ago at {datetime.fromtimestamp(timestamp, UTC):%H:%M:%S}Z"


# ----------------------------------------------------------------------------- plan
def print_plan(plan: Plan) -> None:
    """`cryptotrain plan`: the run's settings, its recurrent layers' cuDNN eligibility and the job table."""
    cfg, jobs, n_features, params = plan.cfg, plan.jobs, plan.n_features, plan.params
    out = Console()
    source = cfg.data.source + (" (SYNTHETIC candles)" if cfg.data.chosen.synthetic else "")
    out.print(f"[bold]{cfg.name}[/]: {len(jobs)} jobs, data from {source}, run directory {cfg.run_dir}")
    out.print(f"inputs ({n_features}): {', '.join(cfg.features.columns)}")
    heads = ", ".join(f"{h.name} ({', '.join(h.columns)}) weight {h.weight:g}, {h.loss}" for h in cfg.heads)
    out.print(f"heads: {heads}", markup=False)
    out.print(f"model: {params:,} parameters, {plan.flops_per_sample / 1e6:.1f} MFLOP per sample "
              f"(forward); batch {cfg.train.batch_size}, up to {cfg.train.epochs} epochs, "
              f"precision {cfg.train.precision}")

    eligibility = Table(title="recurrent layers: fused cuDNN kernel on a GPU")
    for column in ("layer", "kind", "cuDNN", "why not"):
        eligibility.add_column(column)
    for layer in plan.layers:
        eligibility.add_row(f"model.layers[{layer.index}]", layer.kind, "yes" if layer.eligible else "[red]no[/]",
                            "; ".join(layer.blockers))
    out.print(eligibility)

    table = Table(title="jobs")
    for column in ("#", "job", "symbol", "timeframe", "params", "lookback", "horizon", "heads"):
        table.add_column(column, no_wrap=column == "job")
    head_names = ", ".join(h.name for h in cfg.heads)
    for i, job in enumerate(jobs, 1):
        table.add_row(str(i), job.name, job.symbol, job.timeframe, f"{params:,}", str(cfg.window.lookback),
                      str(cfg.window.horizon), head_names)
    out.print(table)


# ----------------------------------------------------------------------------- features, data download
class JobLines:
    """A line per finished job on stdout, under a transient progress bar while the jobs go on (on a terminal):
    `with JobLines("Downloading", len(jobs)) as lines:`, then `lines.add(line, failed)` per job, and
    `lines.summary(line)` once the bar is gone."""

    def __init__(self, description: str, total: int) -> None:
        self.console = Console(soft_wrap=True)  # one line per job, however long
        self.progress = Progress(*Progress.get_default_columns(), console=self.console, transient=True)
        self._task = self.progress.add_task(description, total=total)

    def __enter__(self) -> JobLines:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def add(self, line: str, failed: bool = False) -> None:
        """One job's line, never read as markup; a failure in red."""
        self.console.print(line, style="red" if failed else None, markup=False, highlight=False)
        self.progress.advance(self._task)

    def summary(self, line: str) -> None:
        """A closing line (after the bar is gone)."""
        self.console.print(line)


def feature_line(outcome: FeatureOutcome) -> str:
    if outcome.failed:
        return f"{outcome.job.name}: FAILED: {outcome.error}"
    return (f"{outcome.job.name}: {'cache hit' if outcome.hit else 'computed'}, {outcome.rows} rows x "
            f"{outcome.columns} columns <- {outcome.source}")


def features_summary(outcomes: list[FeatureOutcome]) -> str:
    failed = sum(o.failed for o in outcomes)
    hits = sum(o.hit for o in outcomes if not o.failed)
    return f"features: {hits} cache hits, {len(outcomes) - hits - failed} misses, {failed} failed"


def download_line(outcome: DownloadOutcome) -> str:
    if outcome.failed:
        return f"{outcome.job.name}: FAILED: {outcome.error}"
    news = "" if outcome.added is None else f", {outcome.added} new"
    return (f"{outcome.job.name}: {outcome.rows} candles{news}, {outcome.first:%Y-%m-%d %H:%M} .. "
            f"{outcome.last:%Y-%m-%d %H:%M} UTC, {outcome.gaps} gaps <- {outcome.source}")


def download_summary(outcomes: list[DownloadOutcome]) -> str:
    failed = sum(o.failed for o in outcomes)
    return f"{len(outcomes) - failed} of {len(outcomes)} jobs ready, {failed} failed"


# ----------------------------------------------------------------------------- predict
def print_prediction(prediction: Prediction, as_json: bool) -> None:
    """`cryptotrain predict`: the forecast as a table and the model's track record in a sentence, or as JSON."""
    if as_json:
        print(json.dumps(prediction.as_dict(), indent=1))
        return
    forecast = prediction.forecast
    synthetic = " (SYNTHETIC candles: a demonstration, not a market)" if prediction.synthetic else ""
    title = (f"{prediction.symbol} {prediction.timeframe}: the next {len(forecast)} candle(s) after "
             f"{prediction.last_candle:%Y-%m-%d %H:%M} UTC, from {prediction.candles_source}{synthetic}")
    if prediction.left_out:
        title += (f"\n(the last candle whose market input is known: the {prediction.left_out} later candle(s) given "
                  "have no reference series' candle yet)")
    # pandas' plain text never truncates a number to fit a narrow (or non-)terminal, unlike a rich table.
    table = forecast.set_axis(forecast.index.strftime("%Y-%m-%d %H:%M").rename("open time (UTC)"))
    print(f"{title}\n{table.to_string(float_format=lambda value: f'{value:.8g}')}")
    print(track_record_text(prediction.test_skill))


def track_record_text(record: TrackRecord) -> str:
    """predict.track_record, said plainly."""
    what = f"{record.head}.{record.column}" if record.column else record.head
    skill = "n/a" if record.skill is None else f"{record.skill:+.3f}"
    first, last = record.test_range
    text = (f"On its test split ({first[:10]} to {last[:10]}) this model's {what} MAE was {record.mae:.6g} against "
            f"persistence's {record.persistence_mae:.6g}: skill {skill}.")
    if record.worse_than_persistence:
        text += " It was WORSE than persistence: repeating the last candle forecast better than this model."
    if candles := record.candles:
        skills = {"high": candles.high_skill_har, "low": candles.low_skill_har, "range": candles.range_skill_har}
        worse = [q for q, value in skills.items() if (value or 0) < 0]
        text += (" Its next candle against HAR + time of day on its validation level (MAE skill): "
                 + ", ".join(f"{q} {number(value, '+.3f')}" for q, value in skills.items())
                 + (f" (WORSE than HAR for the {' and the '.join(worse)})" if worse else "")
                 + f"; its 80 % interval held the next close {number(candles.interval_coverage, '.1%')} of the time."
                 + " expected_high / _low / _range_pct: the network's combined with HAR-X's and HAR's as on the test"
                 " split; close_80_low / close_80_high: the 80 % interval "
                 f"({calibration_text(candles.interval_method, candles.interval_level)}).")
    return text


# ----------------------------------------------------------------------------- doctor
def print_doctor(diagnosis: Diagnosis, out: Console | None = None, as_json: bool = False) -> None:
    """`cryptotrain doctor`: device.diagnose()'s report as tables and findings with their fixes, or as JSON."""
    if as_json:
        print(json.dumps(diagnosis.model_dump(mode="json"), indent=2))
        return
    out = out or Console()
    v = diagnosis.versions
    cuda = f"CUDA {v['cuda']}, cuDNN {v['cudnn']}" if v["cuda_build"] else "CPU-only build"
    tensorflow = f"TensorFlow {v['tensorflow']} ({cuda})" if v["tensorflow"] else \
        f"TensorFlow not installed, JAX {v.get('jax')}"
    out.print(f"[bold]cryptotrain doctor[/]  Python {v['python']}, {tensorflow}, Keras {v['keras']}")

    devices = Table(title="devices TensorFlow sees" if v["tensorflow"] else "devices")
    for column in ("device", "kind", "memory", "compute capability", "memory growth"):
        devices.add_column(column)
    for d in diagnosis.devices:
        if d["name"] == "CPU":
            devices.add_row("CPU", d["kind"], f"{_size(d['memory_bytes'])} RAM", "", "n/a")
        else:
            devices.add_row(d["name"], d["kind"], "nvidia-smi below", d["compute_capability"],
                            "on" if d["memory_growth"] else "[red]off[/]")
    out.print(devices)
    threads = diagnosis.devices[0]["threads"]
    pools = f"; TensorFlow intra-op {threads['intra_op']}, inter-op {threads['inter_op']}" if "intra_op" in threads \
        else ""
    out.print(f"CPU threads: {threads['usable_cpus']} usable CPUs{pools}")
    driver = diagnosis.driver
    if driver["gpus"]:
        out.print("driver (nvidia-smi): " + "; ".join(
            escape(f"GPU {g['index']} {g['name']}, {_size(g['memory_total_bytes'])} "
                   f"({_size(g['memory_used_bytes'])} used), driver {g['driver']}") for g in driver["gpus"]))
    else:
        why = escape(driver["error"]) if driver["error"] else "lists none" if driver["found"] else "not found"
        out.print(f"driver (nvidia-smi): [yellow]no GPU visible[/] ({why})")

    packing = diagnosis.packing
    timed = [*diagnosis.train_steps, *([packing["train_step"]] if packing.get("train_step") else [])]
    steps = Table(title=f"one training step of a small model ({timed[0]['model']})" if timed else
                  "one training step of a small model: not timed (JAX did not start)")
    for column in ("device", "precision", "ms / step", "samples/s", "peak GPU memory", "fused cuDNN kernel"):
        steps.add_column(column)
    for s in timed:  # what is not measured on a device (the CPU; JAX's): n/a
        steps.add_row(s["device"], s["precision"], f"{s['step_ms']:.1f}", f"{s['samples_per_s']:.0f}",
                      "n/a" if s["peak_memory_bytes"] is None else _size(s["peak_memory_bytes"]),
                      "n/a" if s["fused_kernel"] is None else "yes" if s["fused_kernel"] else "[red]no[/]")
    out.print(steps)
    out.print(f"precision 'auto' resolves to: {diagnosis.precision_auto}")
    out.print(escape(f"packing (run --pack, JAX {packing['jax']}): on {packing['device']}; --pack auto for V7's 40 "
                     f"jobs: {packing['why']}") if packing["available"] else
              f"packing (run --pack): [yellow]not available[/] ({escape(packing['why'])})")

    for f in diagnosis.findings:
        style = "red" if f.severity == "problem" else "yellow"
        out.print(f"[{style}]{f.severity}[/]: {escape(f.message)}\n  fix: {escape(f.fix)}")
    out.print(f"verdict: [{'green' if not diagnosis.problems else 'red'}]{diagnosis.verdict}[/]")


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
