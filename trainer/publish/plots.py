"""The plot.png a push uploads beside a job's files: the report's two charts of the job (trainer.evaluation.charts),
its losses and its test split's close against persistence, drawn from history.csv and predictions.npz. The Hub has
no report.html; a local reader has report.html, which draws the same charts."""
from __future__ import annotations

import io

import pandas as pd

from ..evaluation import charts
from ..evaluation.results import Headline
from ..files import sha256_file
from ..formatting import number
from ..run.jobdir import HISTORY, METRICS, PREDICTIONS, PREPROCESSING, CloseSeries, JobDir

PLOT = "plot.png"  # where a push puts it, beside the job's files
DRAWN_KEPT = 128  # plots kept (~60 kB each): more than a family's jobs
DRAWN_FROM = (METRICS, PREPROCESSING, HISTORY, PREDICTIONS)  # every file job_plot reads
_drawn: dict[tuple[str, ...], bytes] = {}  # the sha256 of each file in DRAWN_FROM -> the plot they draw


def job_plot(job: JobDir) -> bytes:
    """The job's plot.png, drawn from its history.csv and predictions.npz (the losses alone where its heads
    forecast no close). Drawing takes ~0.3 s, so files drawn before in this process (a job pushed again, or a
    copy of it) are not drawn again: the plot is kept under the sha256 of each file it is drawn from."""
    try:
        key = tuple(sha256_file(job.path / name) for name in DRAWN_FROM)
    except OSError:  # one is missing: reading it says which (JobFileError)
        key = None
    if key in _drawn:
        return _drawn[key]
    metrics, prep = job.metrics(), job.preprocessing()
    head = next((h for h in prep.heads if "close" in h.columns), None)
    closes = job.test_closes(head.name, list(head.columns)) if head is not None else None
    plot = draw_plot(job.history(), closes, metrics.job, metrics.headline, metrics.data.synthetic)
    if key is not None:
        if len(_drawn) >= DRAWN_KEPT:
            del _drawn[next(iter(_drawn))]  # the oldest
        _drawn[key] = plot
    return plot


def draw_plot(history: pd.DataFrame, closes: CloseSeries | None, title: str, scores: Headline | None = None,
              synthetic: bool = False) -> bytes:
    """The report's two charts of a job (charts.py) in one PNG: its loss curves, and the predicted vs actual close
    of the first forecast step on the test split beside persistence's (dashed); without `closes`, the losses alone.

    scores: the job's headline test metrics (JobMetrics.headline: MAE, persistence's, skill), in the title.
    synthetic: the candles were generated; the figure says so in red."""
    # Imported here: the HTML report and `cryptotrain status` read job directories and need no Matplotlib.
    from matplotlib.figure import Figure  # the object API: no GUI backend, safe on headless servers

    fig = Figure(figsize=(11, 6.5 if closes is not None else 3.5))
    heading = f"{title}: training loss, and the test split in price units"
    if scores:
        heading += (f"\ntest {scores.label} (every horizon step): MAE {number(scores.mae, '.5g')} vs persistence "
                    f"{number(scores.persistence_mae, '.5g')}, skill {number(scores.skill, '+.4f', missing='n/a')}")
    fig.suptitle(heading, fontsize=11)
    if synthetic:
        fig.text(0.01, 0.985, "SYNTHETIC data", color="white", fontweight="bold", fontsize=11, ha="left", va="top",
                 bbox={"boxstyle": "round,pad=0.3", "facecolor": "#c62828", "edgecolor": "none"})
    axes = fig.subplots(2 if closes is not None else 1, 1, squeeze=False)[:, 0]
    charts.draw(axes[0], charts.loss_chart(history))
    if closes is not None:
        charts.draw(axes[1], charts.price_chart(closes.times, closes.actual, closes.predicted, closes.persistence))
    fig.subplots_adjust(left=0.08, right=0.97, top=0.84 if scores else 0.88, hspace=0.5)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=72)
    return out.getvalue()
