"""A job's two charts, each drawn once: its loss curves, and its close on the test split against persistence.

`loss_chart` and `price_chart` say what a chart shows (its lines, colours, axes); `svg` renders a chart inline
for the HTML report, `draw` onto Matplotlib axes for the job's plot.png. The report renders without Matplotlib
(a second to import, a tenth of a second and 100 kB a chart) and from the job's data files alone, so it draws
the jobs of earlier versions too, which have no plot.png or only a history.csv.
"""
from __future__ import annotations

import html
import itertools
import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

MAX_POINTS = 1600  # per price line: longer test splits keep each pixel column's lowest and highest value
MARKED_EPOCHS = 40  # loss curves of at most this many epochs mark each epoch
_chart_ids = itertools.count()  # clip paths need ids unique within the page


class NoChart(Exception):
    """Why a chart cannot be drawn from what the job stored."""


@dataclass(frozen=True)
class Line:
    label: str
    x: np.ndarray  # numbers, or datetime64 on a time axis
    y: np.ndarray
    color: str
    dash: tuple[float, float] | None = None  # on, off
    width: float = 1.5
    markers: bool = False


@dataclass(frozen=True)
class Chart:
    lines: list[Line]
    x_label: str
    y_label: str
    log_y: bool = False
    integer_x: bool = False

    @property
    def time_x(self) -> bool:
        return bool(self.lines) and np.issubdtype(self.lines[0].x.dtype, np.datetime64)


# ----------------------------------------------------------------------------- what each chart shows
def loss_chart(history: pd.DataFrame) -> Chart:
    """Train and validation loss by epoch (history.csv); on a log scale where they span 20 times or more."""
    if "epoch" not in history or "loss" not in history:
        raise NoChart("the history has no epoch / loss columns")
    epochs = history["epoch"].to_numpy(dtype=float)
    markers = len(epochs) <= MARKED_EPOCHS
    lines = [Line("train loss", epochs, history["loss"].to_numpy(dtype=float), "#1f77b4", markers=markers)]
    if "val_loss" in history:
        lines.append(Line("validation loss", epochs, history["val_loss"].to_numpy(dtype=float), "#ff7f0e",
                          markers=markers))
    values = np.concatenate([line.y for line in lines])
    values = values[np.isfinite(values)]
    log_y = len(values) > 0 and values.min() > 0 and values.max() / values.min() >= 20
    return Chart(lines, "epoch", "loss (log)" if log_y else "loss", log_y=log_y, integer_x=True)


def price_chart(times: np.ndarray, actual: np.ndarray, predicted: np.ndarray, persistence: np.ndarray | None,
                last: int | None = None) -> Chart:
    """The first forecast step's close on the test split by target time: actual, predicted and persistence's
    (the last input close). `last`: only the last bars, each marked; else the whole split, decimated."""
    # Persistence last, dashed: where the forecast is no change at all it lies on the prediction, still seen.
    series = [("actual close", actual, "#222", None, 1.6), ("predicted close", predicted, "#d62728", None, 1.4)]
    if persistence is not None:
        series.append(("persistence (last close)", persistence, "#1f77b4", (5, 4), 1.4))
    times = np.asarray(times).astype("datetime64[ns]")
    if last:
        lines = [Line(label, times[-last:], y[-last:], color, dash, width, markers=True)
                 for label, y, color, dash, width in series]
    else:
        lines = [Line(label, *_decimate(times, np.asarray(y, dtype=float)), color, dash, width)
                 for label, y, color, dash, width in series]
    return Chart(lines, "target time (UTC)", "price")


def _decimate(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about `points` points: each of points/2 runs keeps its lowest and highest value, in order."""
    if len(x) <= points:
        return x, y
    keep = []
    for run in np.array_split(np.arange(len(x)), points // 2):
        finite = run[np.isfinite(y[run])]
        if len(finite):
            keep += sorted({int(finite[np.argmin(y[finite])]), int(finite[np.argmax(y[finite])])})
    return x[keep], y[keep]


# ----------------------------------------------------------------------------- Matplotlib (plot.png)
def draw(ax, chart: Chart) -> None:
    """The chart on Matplotlib axes, its legend in a band above them as in the report's SVG."""
    from matplotlib.dates import ConciseDateFormatter
    from matplotlib.ticker import LogFormatter, MaxNLocator

    for line in chart.lines:
        ax.plot(line.x, line.y, label=line.label, color=line.color, linewidth=line.width,
                linestyle=(0, line.dash) if line.dash else "-", marker="o" if line.markers else None, markersize=3.5)
    ax.set(xlabel=chart.x_label, ylabel=chart.y_label, yscale="log" if chart.log_y else "linear")
    ax.grid(color="#e6e9ec")
    if chart.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if chart.time_x:
        ax.xaxis.set_major_formatter(ConciseDateFormatter(ax.xaxis.get_major_locator()))
    if chart.log_y:  # plain text: Matplotlib's default typesets log labels as math, a third of the plot's time
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    # A fixed place costs nothing (loc="best" searches every data point) and hides no data.
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=len(chart.lines), borderaxespad=0, frameon=False,
              fontsize=9)


# ----------------------------------------------------------------------------- SVG (the report)
def svg(chart: Chart, width: int, height: int) -> str:
    """The chart as inline SVG: axes with ticks and labels, a light grid, and the legend in a band above the
    plot area. Styled by the page's CSS classes plot, grid, tick, axis and legend."""
    left, right, top, bottom = 74, 14, 30, 44
    pw, ph = width - left - right, height - top - bottom
    lines = [(line, _numbers(line.x), np.asarray(line.y, dtype=float)) for line in chart.lines]
    log_y = chart.log_y
    xs = np.concatenate([x for _, x, _ in lines]) if lines else np.array([])
    ys = np.concatenate([y for _, _, y in lines]) if lines else np.array([])
    ok = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
    if not ok.any():
        return "<p class=note>nothing to draw: no finite values</p>"
    x0, x1 = float(xs[ok].min()), float(xs[ok].max())
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    yv = np.log10(ys[ok]) if log_y else ys[ok]
    y0, y1 = float(yv.min()), float(yv.max())
    pad = (y1 - y0) * 0.05 or (abs(y0) * 0.05 or 1.0)
    y0, y1 = y0 - pad, y1 + pad

    def sx(x):
        return left + (np.asarray(x, dtype=float) - x0) / (x1 - x0) * pw

    def sy(y):
        v = np.log10(np.asarray(y, dtype=float)) if log_y else np.asarray(y, dtype=float)
        return top + ph - (v - y0) / (y1 - y0) * ph

    clip = f"clip{next(_chart_ids)}"
    out = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{_e(chart.y_label)} against {_e(chart.x_label)}">']
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>')
    for value, label in (_log_ticks(y0, y1) if log_y else _linear_ticks(y0, y1, 6)):
        y = top + ph - ((math.log10(value) if log_y else value) - y0) / (y1 - y0) * ph
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_e(label)}</text>')
    x_ticks = _time_ticks(x0, x1) if chart.time_x else _linear_ticks(x0, x1, 7, integer=chart.integer_x)
    for value, label in x_ticks:
        x = float(sx(value))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="grid"/>'
                   f'<text x="{x:.1f}" y="{top + ph + 16}" class="tick" text-anchor="middle">{_e(label)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" class="axis" text-anchor="middle">'
               f'{_e(chart.x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" class="axis" '
               f'text-anchor="middle">{_e(chart.y_label)}</text>')
    out.append(f'<clipPath id="{clip}"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath>')
    out.append(f'<g clip-path="url(#{clip})">')
    for line, lx, ly in lines:
        keep = np.isfinite(lx) & np.isfinite(ly) & ((ly > 0) if log_y else True)
        px, py = sx(lx[keep]), sy(ly[keep])
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))
        out.append(f'<polyline points="{points}" fill="none" stroke="{line.color}" stroke-width="{line.width}"'
                   f'{_dash(line)} stroke-linejoin="round"/>')
        if line.markers:
            out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.6" fill="{line.color}"/>' for a, b in zip(px, py)]
    out.append("</g>")
    x = left
    for line, _, _ in lines:  # the legend, above the plot area: never over the data
        out.append(f'<line x1="{x}" x2="{x + 22}" y1="{top - 12}" y2="{top - 12}" stroke="{line.color}" '
                   f'stroke-width="{max(line.width, 2)}"{_dash(line)}/>'
                   f'<text x="{x + 27}" y="{top - 8}" class="legend">{_e(line.label)}</text>')
        x += 27 + 7 * len(line.label) + 18
    out.append("</svg>")
    return "".join(out)


def _numbers(x: np.ndarray) -> np.ndarray:
    """An axis' values as floats: datetime64 as Unix seconds."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.datetime64):
        return x.astype("datetime64[ns]").astype(np.int64) / 1e9
    return x.astype(float)


def _dash(line: Line) -> str:
    return f' stroke-dasharray="{line.dash[0]:g} {line.dash[1]:g}"' if line.dash else ""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _nice_step(raw: float) -> float:
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _linear_ticks(lo: float, hi: float, count: int, integer: bool = False) -> list[tuple[float, str]]:
    step = _nice_step((hi - lo) / max(count - 1, 1))
    if integer:
        step = max(1.0, round(step))
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if str(step).rstrip("0").endswith("25") else 0))
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + 1e-9 * abs(step):
        ticks.append((value, f"{value:,.{decimals}f}" if abs(value) >= 1e4 else f"{value:.{decimals}f}"))
        value = first + len(ticks) * step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """lo, hi: log10 of the range. Ticks at 1, 2, 5 x 10^k inside it."""
    ticks = [(m * 10.0**k, f"{m * 10.0**k:g}") for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)
             if lo <= math.log10(m * 10.0**k) <= hi]
    return ticks if len(ticks) >= 2 else [(10**v, f"{10**v:.3g}") for v, _ in _linear_ticks(lo, hi, 4)]


_TIME_STEPS = [60, 300, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400,
               14 * 86400]


def _time_ticks(lo: float, hi: float, most: int = 7) -> list[tuple[float, str]]:
    """Unix seconds -> ticks at round UTC times (month starts beyond a few months), labelled to the precision
    the step needs."""
    step = next((s for s in _TIME_STEPS if (hi - lo) / s <= most), None)
    if step is None:
        months = next(m for m in itertools.chain((1, 2, 3, 6), itertools.count(12, 12))
                      if (hi - lo) / (m * 30.44 * 86400) <= most)
        start = pd.Timestamp(lo, unit="s", tz="UTC").normalize().replace(day=1) + pd.DateOffset(months=1)
        stamps = pd.date_range(start, pd.Timestamp(hi, unit="s", tz="UTC"), freq=f"{months}MS")
        return [(stamp.timestamp(), stamp.strftime("%Y-%m")) for stamp in stamps]
    first = math.ceil(lo / step) * step
    form = "%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M"
    return [(t, datetime.fromtimestamp(t, UTC).strftime(form)) for t in np.arange(first, hi + 1, step)]
