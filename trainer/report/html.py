"""`cryptotrain report`: one self-contained HTML page about a run, made from the run directory alone.

The page: a header (config, data, a SYNTHETIC label, totals, wall time), a symbol x timeframe heatmap of
the headline test skill against persistence, a sortable table of every job, and per job (collapsible) its
loss curves, its predicted vs actual close on the test split beside persistence, and its error. Charts are
inline SVG (charts.py, which draws the job's plot.png too), and the page's CSS and JS (static/) are put inline;
nothing is fetched from anywhere, so the file opens from disk offline. No TensorFlow,
no Keras: the page is written at once, for a run that is finished, failed, or still going.

Every number comes from the run's own files (ledger.sqlite, config.yaml, jobs/NAME/*); a job whose files
are missing or unreadable is shown with a note saying which, never a crash.
"""
from __future__ import annotations

import contextlib
import html
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TypeVar

import pandas as pd

from .. import __version__
from ..config import DataConfig, RunConfig
from ..errors import UserError
from ..evaluation import charts
from ..evaluation.names import Baseline
from ..evaluation.results import BAR, CloseScores, Headline, JobMetrics
from ..files import atomic_write
from ..formatting import NO_DIRECTION, direction, number
from ..run.artifacts import jobs_dir
from ..run.jobdir import METRICS, PREDICTIONS, PREPROCESSING, CloseSeries, JobDir, JobFileError, MissingJobFile
from ..run.jobs import Job
from ..run.ledger import JobRecord
from ..run.rundir import CONFIG, DeviceTime, RunDir
from .console import verdict

log = logging.getLogger(__name__)

REPORT = "report.html"
T = TypeVar("T")
ZOOM_BARS = 60  # the close-up of the test split's last bars, where forecast and persistence can be told apart


def report_at_end(run_dir: Path) -> Path | None:
    """A run's report.html, written at its end; None, and a warning, where it cannot be: a report never fails a
    run."""
    try:
        with RunDir.open(run_dir) as run:
            return write_report(run)
    except Exception as exc:
        log.warning("report.html not written: %s", exc)
        return None


def write_report(run: RunDir, out: Path | None = None) -> Path:
    """Write the run's HTML report (default RUN_DIR/report.html, atomically) and return its path."""
    jobs = [_load_job(run.path, record, run.config) for record in run.ledger.jobs()]
    page = _page(run.path, run.config, run.config_problem, jobs)
    out = Path(out) if out is not None else run.path / REPORT
    try:
        atomic_write(out, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{out}: cannot write the report ({exc.strerror or exc}); give another path with -o") from None
    return out


# ----------------------------------------------------------------------------- reading a run
@dataclass
class _Job:
    record: JobRecord
    symbol: str
    timeframe: str
    metrics: JobMetrics | None = None
    line: Headline | None = None  # the headline: metrics.json's, else the ledger's summary
    history: pd.DataFrame | None = None
    prices: CloseSeries | None = None  # the headline head's close, first forecast step
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def skill(self) -> float | None:
        return self.line.skill if self.line and self.status == "done" else None

    @property
    def synthetic(self) -> bool:
        if self.metrics is not None:
            return self.metrics.data.synthetic
        return self.record.summary is not None and self.record.summary.synthetic


def _load_job(run_dir: Path, record: JobRecord, config: RunConfig | None) -> _Job:
    named = Job.from_name(record.name)
    job = _Job(record, named.symbol, named.timeframe)
    if record.status != "done":
        return job  # a failed, pending or running job has no files of its own worth showing
    job_dir = JobDir(jobs_dir(run_dir) / record.name)
    if not job_dir.path.is_dir():
        job.notes.append(f"its directory {job_dir.path} is missing: no metrics, curves or predictions to show")
    else:
        if not job_dir.has_manifest() or job_dir.verify() != record.manifest_sha256:
            job.notes.append("its files are missing or changed since the job finished (the manifest does not "
                             "verify); a rerun of the same command trains it again")
        job.metrics = _read(job_dir.metrics, job.notes)
        job.history = _read(job_dir.history, job.notes)
        if job.metrics is not None:
            head = job.metrics.headline.head
            job.prices = _read(lambda: job_dir.test_closes(head, _head_columns(job_dir, config, head)), job.notes)
    if job.metrics is not None:
        job.line = job.metrics.headline
    elif (s := record.summary) is not None:  # the ledger keeps the headline too (JobMetrics.summary)
        job.line = Headline(head=s.head, skill=s.skill, mae=s.test_mae, persistence_mae=s.persistence_mae,
                            majority_rate=s.majority_rate, direction_accuracy=s.direction_accuracy, shrink=s.shrink)
        job.notes.append("the headline numbers come from the run ledger")
    return job


def _read(read: Callable[[], T], notes: list[str]) -> T | None:
    """`read()` (one of a JobDir's readers), or None with a note saying why the file could not be used."""
    try:
        return read()
    except charts.NoChart as exc:
        notes.append(f"no price chart: {exc}")
    except MissingJobFile as exc:
        notes.append(f"{exc.path.name} is missing")
    except JobFileError as exc:  # a corrupt or foreign file: said, never a crash
        notes.append(f"{exc.path.name} is unreadable ({_one_line(exc.reason)})")
    except UserError as exc:  # a job directory of a newer format
        notes.append(_one_line(exc))
    return None


def _head_columns(job_dir: JobDir, config: RunConfig | None, head: str) -> list[str]:
    """The head's columns, from the job's preprocessing.json, else the run's config."""
    with contextlib.suppress(UserError):
        for head_target in job_dir.preprocessing().heads:
            if head_target.name == head:
                return list(head_target.columns)
    for spec in config.heads if config is not None else ():
        if spec.name == head:
            return list(spec.columns)
    raise charts.NoChart(f"neither {PREPROCESSING} nor {CONFIG} names the columns of head {head}")


# ----------------------------------------------------------------------------- the page
def _page(run_dir: Path, config: RunConfig | None, config_note: str | None, jobs: list[_Job]) -> str:
    """The page; without a config (config_note says why) it shows what the run's files alone say."""
    name = config.name if config is not None else run_dir.name
    data = config.data if config is not None else None
    body = [f"<h1>{_e(name)} <span class=sub>run report</span></h1>", _header(run_dir, config, config_note, jobs)]
    if not jobs:
        body.append("<p class=note>The ledger lists no jobs yet.</p>")
    else:
        body += [*_heatmaps(data, jobs),
                 "<h2>Jobs</h2>", _table(jobs),
                 "<h2>Per job</h2>",
                 "<p class=hint><button type=button id=open-all>expand all</button> "
                 "<button type=button id=close-all>collapse all</button></p>",
                 *(_details(job) for job in jobs)]
    return (f"<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n"
            f"<meta name=viewport content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(name)}: cryptotrain run report</title>\n<style>\n{_static('report.css')}</style>\n"
            "</head>\n<body>\n" + "\n".join(body) + f"\n<script>\n{_static('report.js')}</script>\n</body>\n</html>\n")


@cache
def _static(name: str) -> str:
    """A file of trainer/report/static (package data), put inline: the page fetches nothing. Read once a process."""
    return (files(__package__) / "static" / name).read_text(encoding="utf-8")


def _header(run_dir: Path, config: RunConfig | None, config_note: str | None, jobs: list[_Job]) -> str:
    counts = Counter(job.status for job in jobs)
    seconds = sum(job.record.seconds or 0.0 for job in jobs)
    data = config.data if config is not None else None
    facts = [("run directory", _e(str(run_dir.resolve()))),
             ("data", _e(data.chosen.describe() if data else f"unknown (no {CONFIG})")),
             ("symbols", _e(", ".join(data.symbols if data else sorted({j.symbol for j in jobs})))),
             ("timeframes", _e(", ".join(data.timeframes if data else sorted({j.timeframe for j in jobs}))))]
    firsts, lasts, tests = [], [], []
    for job in jobs:
        if job.metrics:
            firsts.append(job.metrics.data.first)
            lasts.append(job.metrics.data.last)
            tests += job.metrics.test_range
    firsts, lasts, tests = [x for x in firsts if x], [x for x in lasts if x], [x for x in tests if x]
    if firsts and lasts:
        facts.append(("candles", f"{_e(_when(min(firsts)))} to {_e(_when(max(lasts)))} UTC"
                                 + (f" (at most {data.max_rows:,} rows a job)" if data and data.max_rows else "")))
    if tests:
        facts.append(("test split", f"{_e(_when(min(tests)))} to {_e(_when(max(tests)))} UTC (target times)"))
    if config is not None:
        facts.append(("model", _e(f"lookback {config.window.lookback}, horizon {config.window.horizon}; heads "
                                  f"{', '.join(h.name for h in config.heads)}; up to {config.train.epochs} epochs")))
    shown = [s for s in ("done", "failed", "pending", "running") if counts[s] or s != "running"]
    facts.append(("jobs", _e(f"{len(jobs)}: " + ", ".join(f"{counts[s]} {s}" for s in shown))))
    spans = [(job.record.started_at, job.record.finished_at) for job in jobs
             if job.record.started_at is not None and job.record.finished_at is not None]
    if spans:
        facts.append(("wall time", _e(f"{_duration(max(end for _, end in spans) - min(start for start, _ in spans))} "
                                      "from the first job's start to the last one's end (any pause between "
                                      "processes included)")))
    facts.append(("job time", _e(f"{_duration(seconds)}, the sum of the jobs' seconds (jobs trained at once, "
                                 "packed or on Ray workers, each count the time they shared)")))
    if (device := DeviceTime.read(run_dir)) is not None:
        facts.append(("device time", _e(f"{device.line()} (the last run)")))
    facts.append(("report", _e(f"written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by cryptotrain "
                               f"{__version__}")))
    out = []
    if any(job.synthetic for job in jobs) or (data and data.chosen.synthetic):
        out.append("<p class=synthetic>SYNTHETIC candles: these jobs were trained on generated data. The numbers "
                   "show the pipeline works, not what a model is worth on a market.</p>")
    if config_note:
        out.append(f"<p class=note>{_e(config_note)}</p>")
    out.append("<dl class=facts>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- heatmap
@dataclass(frozen=True)
class _Measure:
    """What a heatmap shows of each done job: its value (None: not measured), the cell's text and colour."""
    name: str
    value: Callable[[_Job], float | None]
    text: Callable[[float], str]
    goodness: Callable[[float], float]  # > 0 green, < 0 red, 0 white
    hint: str


CLOSE_SKILL = _Measure(
    "skill", lambda job: job.skill, lambda v: f"{v:+.3f}", lambda v: v,
    f"skill = 1 - MAE / persistence MAE of the close on the test split, every horizon step ({METRICS} headline). "
    "Green: better than repeating the last close; red: worse; white: no better.")


def _candle_skill(quantity: str) -> _Measure:
    def value(job: _Job) -> float | None:
        candles = job.metrics.candles if job.metrics and job.status == "done" else None
        return getattr(candles, quantity).skill.get(BAR) if candles else None
    return _Measure(f"{quantity} vs HAR", value, lambda v: f"{v:+.3f}", lambda v: v, "")


def _coverage(job: _Job) -> float | None:
    candles = job.metrics.candles if job.metrics and job.status == "done" else None
    return candles.interval.coverage if candles else None


COVERAGE = _Measure("80 % interval", _coverage, lambda v: f"{v:.1%}", lambda v: 0.03 - abs(v - 0.8), "")
CANDLES_HINT = (
    "The next candle on the test split: MAE skill of its high (ln(high / last close)), low (ln(last close / low)) "
    "and range (ln(high / low)) vs HAR + time of day on its validation level (as the network is put on its "
    "own), the network combined with HAR, its weight chosen on "
    "validation (red: worse than HAR); and how often the 80 % interval of the next close, calibrated by conformal "
    "prediction (adaptive: its level moved after each outcome; split: on validation alone), held it (green: within "
    "3 points of 80 %; red: further off). Click a cell for the job's details.")


def _heatmaps(data: DataConfig | None, jobs: list[_Job]) -> list[str]:
    """The close's skill; with a candle head, the next candle's high, low and range vs HAR (one colour scale)
    and the interval's coverage, side by side."""
    out = ["<h2>Test skill against persistence</h2>", _heatmap(data, jobs, CLOSE_SKILL)]
    if any(_coverage(job) is not None for job in jobs):
        measures = [_candle_skill(q) for q in ("high", "low", "range")]
        extent = [abs(v) for m in measures for v in map(m.value, jobs) if v is not None]
        scale = _nice_ceiling(max([*extent, 0.01]))
        out += ["<h2>The next candle against HAR + time of day on its validation level</h2><div class=heatwrap>",
                *(_heatmap(data, jobs, m, scale) for m in measures), _heatmap(data, jobs, COVERAGE),
                f"</div><div class=scale><span>skill vs HAR</span><span>{-scale:+.3g}</span><span class=bar></span>"
                f"<span>{scale:+.3g}</span></div><p class=hint>{_e(CANDLES_HINT)}</p>"]
    return out


def _heatmap(data: DataConfig | None, jobs: list[_Job], measure: _Measure, scale: float | None = None) -> str:
    """One measure's symbol x timeframe table (the config's symbols and timeframes, then any other job's); with
    its own colour scale and hint unless `scale` is given."""
    symbols = list(dict.fromkeys([*(data.symbols if data else []), *(j.symbol for j in jobs)]))
    timeframes = list(dict.fromkeys([*(data.timeframes if data else []), *(j.timeframe for j in jobs)]))
    by_cell = {(j.symbol, j.timeframe): j for j in jobs}
    values = {j.name: measure.value(j) for j in jobs}
    extent = [abs(measure.goodness(v)) for v in values.values() if v is not None]
    alone = scale is None
    scale = scale or _nice_ceiling(max([*extent, 0.01]))
    rows = [f"<tr><th>{_e(measure.name)}</th>" + "".join(f"<th scope=col>{_e(tf)}</th>" for tf in timeframes)
            + "</tr>"]
    for symbol in symbols:
        cells = []
        for timeframe in timeframes:
            job = by_cell.get((symbol, timeframe))
            if job is None:
                cells.append("<td class=absent>not in this run</td>")
                continue
            value = values[job.name]
            attrs = f' data-job="{_e(job.name)}" data-status="{_e(job.status)}" data-measure="{_e(measure.name)}"'
            if job.status == "done" and value is not None:
                attrs += f' data-value="{value!r}" style="{_skill_style(measure.goodness(value), scale)}"'
                text = measure.text(value)
                title = f"{job.name}: {measure.name} {text}" + (verdict(value) if measure is CLOSE_SKILL else "")
            elif job.status == "done":
                attrs += ' data-value=""'
                text = "n/a" if job.line else "no metrics"
                title = f"{job.name}: " + ("not measured" if job.line else "; ".join(job.notes))
            else:
                attrs += f' data-value="" class="{_e(job.status)}"'
                text = job.status
                title = f"{job.name} {job.status}" + (f": {_one_line(job.record.error)}" if job.record.error else "")
            cells.append(f'<td{attrs} title="{_e(title)}"><a href="#job-{_e(job.name)}">{_e(text)}</a></td>')
        rows.append(f"<tr><th scope=row>{_e(symbol)}</th>{''.join(cells)}</tr>")
    table = f"<table class=heatmap>{''.join(rows)}</table>"
    if not alone or measure is COVERAGE:
        return table
    return (f"<div class=heatwrap>{table}<div class=scale><span>{_e(measure.name)}</span><span>{-scale:+.3g}</span>"
            f"<span class=bar></span><span>{scale:+.3g}</span></div><p class=hint>{_e(measure.hint)} Hatched: failed "
            "or not yet done. Click a cell for the job's details.</p></div>")


def _skill_style(skill: float, scale: float) -> str:
    t = min(1.0, abs(skill) / scale)
    end = (26, 152, 80) if skill > 0 else (215, 48, 39)  # green / red
    rgb = tuple(round(255 + (c - 255) * t) for c in end)
    ink = "#fff" if t > 0.55 else "#111"
    return f"background:rgb{rgb};color:{ink}"


def _nice_ceiling(value: float) -> float:
    magnitude = 10 ** math.floor(math.log10(value))
    return next(m * magnitude for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * magnitude >= value - 1e-12)


# ----------------------------------------------------------------------------- table
def _table(jobs: list[_Job]) -> str:
    heads = list(dict.fromkeys(h for j in jobs if j.metrics for h in j.metrics.heads))
    with_direction = {h for j in jobs if j.metrics for h, s in j.metrics.heads.items()
                      if s.model.direction_accuracy is not None}
    groups: list[tuple[str, list[tuple[str, str]]]] = [
        ("", [("job", "the job: SYMBOL_TIMEFRAME"), ("status", "done, failed, pending or running"),
              ("epochs", "epochs run (the best epoch is in the job's details)"),
              ("secs", "the job's wall time in seconds (its last attempt)")]),
        ("close (headline)", [("MAE", "test MAE of the close, every horizon step, price units"),
                              ("persist.", "MAE of persistence: the last close repeated"),
                              ("skill", "1 - MAE / persistence MAE"),
                              ("dir.", f"direction accuracy of the close ({NO_DIRECTION}: shrunk to exactly no "
                                       "change, it forecasts no direction)"),
                              ("up", "up-move rate: the share of test moves that went up"),
                              ("major.", "majority rate: always answering the most frequent move (up, down, "
                                         "flat); the direction accuracy to beat")])]
    for head in heads:
        columns = [("MAE", f"{head}: test MAE over its columns, every horizon step"),
                   ("persist.", f"{head}: persistence MAE over its columns"),
                   ("skill", f"{head}: 1 - MAE / persistence MAE"),
                   ("mix", f"{head}: the network's weight in what is served, beside its persistence (each column's "
                           "last value; a candle's body: the last close), chosen on validation; 0: validation found "
                           "the network no better than persistence"),
                   ("val. gain", f"{head}: on validation, 1 - MAE / persistence MAE of the best weight, which is "
                                 "kept only where its gain is significant")]
        if head in with_direction:
            columns.append(("dir.", f"{head}: direction accuracy of its close"))
        groups.append((f"head {head}", columns))
    errors = any(job.record.error and job.status != "done" for job in jobs)
    if errors:
        groups.append(("", [("error", "why the job failed (whole in the job's details)")]))

    top = "".join(f"<th colspan={len(cols)} class=group>{_e(title)}</th>" if title else
                  f"<th colspan={len(cols)}></th>" for title, cols in groups)
    labels = [column for _, cols in groups for column in cols]
    names = [f'<th data-col={i} title="{_e(tip)}">{_e(label)}</th>' for i, (label, tip) in enumerate(labels)]
    rows = []
    for job in jobs:
        line, close = job.line, _close_scores(job)
        epochs = job.metrics.epochs_run if job.metrics else job.record.summary.epochs if job.record.summary else None
        cells = [_cell(job.name, link=f"#job-{job.name}"), _cell(job.status, css=job.status),
                 _num(epochs, "d"), _num(job.record.seconds, ".1f"),
                 _num(line and line.mae, ".5g"), _num(line and line.persistence_mae, ".5g"),
                 _num(job.skill, "+.4f", css=_sign(job.skill)),
                 _direction(line and line.direction_accuracy, line.shrink if line else 1.0),
                 _num(close and close.up_move_rate, ".3f"),
                 _num(line and line.majority_rate, ".3f")]
        for head in heads:
            scores = job.metrics.heads.get(head) if job.metrics else None
            skill = scores.skill if scores and job.status == "done" else None
            gain = scores.validation_gain if scores and job.status == "done" else None
            cells += [_num(scores and scores.model.mae, ".5g"), _num(scores and scores.persistence.mae, ".5g"),
                      _num(skill, "+.4f", css=_sign(skill)), _num(scores and scores.shrink, ".2f"),
                      _num(gain, "+.4f", css=_sign(gain))]
            if head in with_direction:
                cells.append(_direction(scores and scores.model.direction_accuracy, scores.shrink if scores else 1.0))
        error = job.record.error if job.status != "done" else ""
        if errors:
            cells.append(_error_cell(error or ""))
        rows.append(f'<tr data-job="{_e(job.name)}">{"".join(cells)}</tr>')
    return (f"<div class=scroll><table class=\"jobs sortable\"><thead><tr>{top}</tr><tr>{''.join(names)}</tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class=hint>Click a column header to sort (again to reverse). MAE in price units on the test split. "
            f"Direction accuracy means something only above the majority rate; {NO_DIRECTION}: the close was shrunk "
            "to exactly no change (validation found no deviation worth keeping), so it forecasts no direction and "
            "has no direction accuracy.</p>")


def _close_scores(job: _Job) -> CloseScores | None:
    """The headline head's close scores, where the job's metrics.json holds them."""
    if job.metrics is None or job.line is None or job.line.column != "close":
        return None
    head = job.metrics.heads.get(job.line.head)
    return head.close if head else None


def _cell(text: str, css: str = "", link: str | None = None) -> str:
    content = f'<a href="{_e(link)}">{_e(text)}</a>' if link else _e(text)
    return f'<td{f" class={css}" if css else ""} data-v="{_e(text)}">{content}</td>'


def _error_cell(error: str) -> str:
    """The error in at most three lines; whole in its tooltip, and in the job's details."""
    if not error:
        return '<td data-v=""></td>'
    return f'<td class=err data-v="{_e(error)}" title="{_e(error)}"><div class=clamp>{_e(error)}</div></td>'


def _num(value, spec: str, css: str = "") -> str:
    """A number's cell, carrying the value it sorts on; without one "-", sorted last."""
    text = number(value, spec, missing="")
    if not text:
        return f'<td class="num none{f" {css}" if css else ""}" data-v="">-</td>'
    return f'<td class="num{f" {css}" if css else ""}" data-v="{_e(value)}">{_e(text)}</td>'


def _direction(accuracy: float | None, shrink: float) -> str:
    """A close's direction accuracy cell; NO_DIRECTION, sorted last, where it forecasts no direction (shrink 0)."""
    if direction(accuracy, shrink) == NO_DIRECTION:
        return f'<td class="num none" data-v="">{NO_DIRECTION}</td>'
    return _num(accuracy, ".3f")


def _sign(value: float | None) -> str:
    return "" if value is None or value == 0 else "pos" if value > 0 else "neg"


# ----------------------------------------------------------------------------- per job
def _details(job: _Job) -> str:
    summary = f"<span class=jobname>{_e(job.name)}</span> <span class=\"badge {job.status}\">{job.status}</span>"
    if job.skill is not None:
        summary += f" skill <b class={_sign(job.skill)}>{job.skill:+.4f}</b>{_e(verdict(job.skill))}"
        if job.line and job.line.shrink == 0:
            summary += "<span class=hint>: validation found no deviation from no change worth keeping</span>"
    elif job.status == "failed" and job.record.error:
        summary += f" <span class=err>{_e(_shorten(_one_line(job.record.error), 140))}</span>"
    parts = []
    if job.record.error:
        what = "error" if job.status == "failed" else "last note"
        parts.append(f"<p><b>{what}</b> (attempt {job.record.attempts}):</p><pre class=error>{_e(job.record.error)}"
                     "</pre>")
    if job.status in ("pending", "running") and not job.record.error:
        parts.append(f"<p class=hint>{'Not trained yet.' if job.status == 'pending' else 'Being trained now.'}</p>")
    parts += [f"<p class=note>{_e(note)}</p>" for note in job.notes]
    if job.metrics:
        parts.append(_job_facts(job))
    if job.history is not None or job.prices is not None:
        loss = _loss_chart(job.history) if job.history is not None else ""
        prices = _price_charts(job.prices) if job.prices is not None else ""
        parts.append(f"<div class=charts><div>{loss}</div><div>{prices}</div></div>")
    return (f'<details id="job-{_e(job.name)}" data-job="{_e(job.name)}"><summary>{summary}</summary>'
            f"<div class=body>{''.join(parts)}</div></details>")


def _job_facts(job: _Job) -> str:
    m, data, line = job.metrics, job.metrics.data, job.metrics.headline
    facts = [("candles", f"{data.source}: {_when(data.first)} to {_when(data.last)} UTC, "
                         f"{data.rows} rows, {data.gaps} gaps" + (" (SYNTHETIC)" if data.synthetic else "")),
             ("test split", f"{m.n_test} samples, targets {' to '.join(map(_when, m.test_range))} UTC"),
             ("headline", f"{line.label}: MAE {number(line.mae, '.5g')} vs persistence "
                          f"{number(line.persistence_mae, '.5g')}, skill {number(line.skill, '+.4f')}; "
                          f"direction {direction(line.direction_accuracy, line.shrink)} vs majority "
                          f"{number(line.majority_rate, '.3f')}; shrink {number(line.shrink, '.5g')}")]
    close = _close_scores(job)
    if close and close.skill_by_step:
        facts.append(("skill by step", ", ".join(number(s, "+.4f") for s in close.skill_by_step)))
    candles = m.candles
    if candles and Baseline.HARX_LEVEL in candles.range.network_skill:
        maes = [f"{q} MAE {number(getattr(candles, q).network_skill[Baseline.HARX_LEVEL], '+.4f')} "
                f"({number(getattr(candles, q).skill[Baseline.HARX_LEVEL], '+.4f')})" for q in ("range", "high", "low")]
        facts.append(("vs HAR-X", "the next candle against HAR + time of day with the network's extra inputs, linear, "
                      "on its validation level: the network alone (what users get) range QLIKE "
                      f"{number(candles.range.network_qlike_skill.get(Baseline.HARX_LEVEL_RMS), '+.4f')} "
                      f"({number(candles.range.qlike_skill.get(Baseline.HARX_LEVEL_RMS), '+.4f')}), "
                      + ", ".join(maes)))
    facts.append(("training", f"{m.epochs_run} epochs, best {m.best_epoch} (val loss "
                              f"{number(m.best_val_loss, '.5g')}); {number(m.seconds, '.1f')} s from loading to "
                              f"evaluation, {number(m.train_step_seconds, '.1f')} s of it in training steps"
                              + (" (its pack's)" if m.engine and m.engine.jobs > 1 else "")
                              + f", RSS {number(m.rss_mb, '.0f')} MB"))
    if m.engine is not None:
        facts.append(("engine", m.engine.describe()))
    return "<dl class=facts>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts) + "</dl>"


def _loss_chart(history: pd.DataFrame) -> str:
    try:
        chart = charts.loss_chart(history)
    except charts.NoChart as exc:
        return f"<p class=note>{_e(exc)}</p>"
    return _figure(charts.svg(chart, width=440, height=300), "training and validation loss")


def _price_charts(prices: CloseSeries) -> str:
    closes = prices.times, prices.actual, prices.predicted, prices.persistence
    caption = (f"the close on the test split, first forecast step (next bar), price units; actual and persistence "
               f"from {PREDICTIONS}")
    out = [_figure(charts.svg(charts.price_chart(*closes), width=820, height=300), caption)]
    if len(prices.times) > 2 * ZOOM_BARS:
        out.append(_figure(charts.svg(charts.price_chart(*closes, last=ZOOM_BARS), width=820, height=280),
                           f"the last {ZOOM_BARS} bars of the test split, close up"))
    return "".join(out)


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


# ----------------------------------------------------------------------------- text
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(iso: str | None) -> str:
    """"2026-01-21T09:45:00+00:00" -> "2026-01-21 09:45"."""
    if not iso:
        return "?"
    return str(iso).replace("T", " ")[:16]


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


__all__ = ["write_report"]
