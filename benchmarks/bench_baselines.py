"""What the baselines a quant would try first score on every real series (trainer/evaluation/baselines.py).

  python benchmarks/bench_baselines.py
  python benchmarks/bench_baselines.py --only '*_1h'

Over every series in ../shared/data/ohlcv, split as a job with V7's window (lookback 60, horizon 10; train /
validation / test 70 / 15 / 15 %, trainer.data.windows.make_windows), the baselines fitted on the train split with
their parameters chosen on validation, scored on the test split:
  - next-candle log range, MAE skill: EWMA vs persistence, HAR + time of day vs persistence and vs EWMA; over
    the horizon (every step) and of the mean range of the next 10 candles vs persistence; QLIKE skill of HAR's
    root-mean-square range (har_tod_rms) vs persistence and vs EWMA
  - next-candle high / low excursion, MAE skill of HAR + time of day vs no change and vs persistence
  - HAR + time of day put on its level on validation (har_tod_level: per step, times the factor with the lowest
    MAE there; its root-mean-square range by QLIKE's) vs as fitted: what that level alone is worth
  - a ceiling, not a forecast: HAR + time of day given also the future's local volatility (the mean ln range,
    less its time-of-day mean, of the 12 candles before and the 12 after the target candle; least squares with
    ln HAR's range on the train split, the excursions as shares of it as HAR's). Its high / low MAE skill vs
    HAR bounds what any forecast of the candles' scale can add to HAR at the next candle
  - coverage of the next return's 80 % interval (quantiles 0.1 and 0.9): EWMA-scaled, overall and by tercile
    of the EWMA volatility; static (train) quantiles; split conformal around "no change" normalised by the
    HAR volatility and by the geometric mean of HAR's and the EWMA's (intervals.SplitConformal), overall and by
    tercile of that volatility; adaptive conformal inference (intervals.AdaptiveConformal, gamma 0.005) with the
    same normalisers, and how much wider its intervals are than split conformal's on average;
  - on validation alone, the choice of the interval's normaliser: split and adaptive conformal around "no change",
    calibrated on the validation split's first half and scored on its second, normalised by the EWMA's, HAR's or
    their geometric mean's volatility, and the EWMA's alpha in it (0.03, 0.06, 0.12) (VALIDATION_COLUMNS: printed
    after the table, in the JSON per series).
Prints each series and the median [min, max] over series, for coverage how many series are inside 77-83 % and how
many have every tercile within 5 points of 80 %; writes benchmarks/results/baselines.json.
../shared/docs/forecasting.md gives the figures to expect.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer.data import read_candles_file
from trainer.data.settings import WindowConfig
from trainer.data.validate import timeframe_delta
from trainer.data.windows import make_windows
from trainer.evaluation import baselines as bl
from trainer.evaluation.intervals import AdaptiveConformal, Forecasts, SplitConformal
from trainer.evaluation.scores import coverage, mae, point_scores, skill
from trainer.files import atomic_write, write_json
from trainer.heads import CANDLE, CandleHead

REPO = Path(__file__).resolve().parents[1]
SHARED_OHLCV = (REPO.parent / "shared" / "data" / "ohlcv").resolve()
RESULTS = REPO / "benchmarks" / "results" / "baselines.json"
WINDOW = WindowConfig(lookback=60, horizon=10)
LEVELS = (0.1, 0.5, 0.9)  # 0.1 and 0.9: the 80 % interval

# column -> (what, format): the figures of one series, in the table's order
COLUMNS = {
    "range_ewma_vs_persistence": ("range EWMA/pers", "+.3f"),
    "range_har_vs_persistence": ("range HAR/pers", "+.3f"),
    "range_har_vs_ewma": ("range HAR/EWMA", "+.3f"),
    "range_har_vs_persistence_horizon": ("range HAR/pers all steps", "+.3f"),
    "mean_range_har_vs_persistence": ("mean range 10 HAR/pers", "+.3f"),
    "range_qlike_har_vs_persistence": ("range QLIKE HAR/pers", "+.3f"),
    "range_qlike_har_vs_ewma": ("range QLIKE HAR/EWMA", "+.3f"),
    "range_har_level_vs_har": ("range HAR level/HAR", "+.3f"),
    "range_qlike_har_level_vs_har": ("range QLIKE HAR level/HAR", "+.3f"),
    "high_har_level_vs_har": ("high HAR level/HAR", "+.3f"),
    "low_har_level_vs_har": ("low HAR level/HAR", "+.3f"),
    "high_har_vs_no_change": ("high HAR/no change", "+.3f"),
    "high_har_vs_persistence": ("high HAR/pers", "+.3f"),
    "low_har_vs_no_change": ("low HAR/no change", "+.3f"),
    "low_har_vs_persistence": ("low HAR/pers", "+.3f"),
    "high_oracle_vs_har": ("high ceiling/HAR", "+.3f"),
    "low_oracle_vs_har": ("low ceiling/HAR", "+.3f"),
    "cover_ewma_scaled": ("80% EWMA-scaled", ".1%"),
    "cover_ewma_scaled_t1": ("t1", ".1%"),
    "cover_ewma_scaled_t2": ("t2", ".1%"),
    "cover_ewma_scaled_t3": ("t3", ".1%"),
    "cover_static": ("80% static", ".1%"),
    "cover_conformal_har": ("80% conformal HAR", ".1%"),
    "cover_conformal_har_t1": ("t1", ".1%"),
    "cover_conformal_har_t2": ("t2", ".1%"),
    "cover_conformal_har_t3": ("t3", ".1%"),
    "cover_conformal_har_ewma": ("80% conformal HAR x EWMA", ".1%"),
    "cover_conformal_har_ewma_t1": ("t1", ".1%"),
    "cover_conformal_har_ewma_t2": ("t2", ".1%"),
    "cover_conformal_har_ewma_t3": ("t3", ".1%"),
    "cover_adaptive_har": ("80% adaptive HAR", ".1%"),
    "cover_adaptive_har_t1": ("t1", ".1%"),
    "cover_adaptive_har_t2": ("t2", ".1%"),
    "cover_adaptive_har_t3": ("t3", ".1%"),
    "width_adaptive_har": ("width adaptive/split HAR", "+.1%"),
    "cover_adaptive_har_ewma": ("80% adaptive HAR x EWMA", ".1%"),
    "cover_adaptive_har_ewma_t1": ("t1", ".1%"),
    "cover_adaptive_har_ewma_t2": ("t2", ".1%"),
    "cover_adaptive_har_ewma_t3": ("t3", ".1%"),
    "width_adaptive_har_ewma": ("width adaptive/split HAR x EWMA", "+.1%"),
}


# The interval's normaliser checked on validation alone (docs/model-quality.md, "Which split chose what"): each
# method calibrated on the validation split's first half, its coverage scored on the second half, per normaliser
VALIDATION_NORMALISERS = ("ewma", "har", "har_ewma")
# and the EWMA's alpha in its volatility (RiskMetrics' 0.06, what jobs use, and half and twice it), by the adaptive
# interval normalised by HAR's x the EWMA's (jobs' default)
VALIDATION_ALPHAS = (0.03, 0.06, 0.12)
VALIDATION_COLUMNS = {f"val_cover_{method}_{normaliser}{tercile}": None
                      for method in ("conformal", "adaptive") for normaliser in VALIDATION_NORMALISERS
                      for tercile in ("", "_t1", "_t2", "_t3")}
VALIDATION_COLUMNS |= {f"val_cover_adaptive_har_ewma_alpha{alpha}{tercile}": None
                       for alpha in VALIDATION_ALPHAS for tercile in ("", "_t1", "_t2", "_t3")}


METHODS = {"conformal": SplitConformal, "adaptive": AdaptiveConformal}


def _no_change(fitted: bl.Baselines, rows: np.ndarray, normaliser: str) -> Forecasts:
    """"No change" for the next candle's return at the samples `rows`, its residuals normalised by `normaliser`'s
    volatility forecast."""
    returns = fitted.actual(rows)["return"][:, :1]
    return Forecasts(np.zeros_like(returns), np.zeros_like(returns), returns,
                     fitted.volatility(rows)[normaliser][:, :1], rows)


def _validation_coverage(fitted: bl.Baselines, val: np.ndarray, normalisers=VALIDATION_NORMALISERS,
                         methods=tuple(METHODS), suffix: str = "") -> dict[str, float]:
    """VALIDATION_COLUMNS' figures: an interval around "no change" for the next candle's return, calibrated on the
    first half of the validation samples and scored on the second, by each normaliser; the test split unused."""
    first, second = val[:len(val) // 2], val[len(val) // 2:]
    figures = {}
    for normaliser in normalisers:
        calibrate, score = _no_change(fitted, first, normaliser), _no_change(fitted, second, normaliser)
        for method in methods:
            made = METHODS[method]().intervals(calibrate, score)
            covered = coverage(made.lower[:, 0], made.upper[:, 0], score.actual[:, 0], score.scale[:, 0])
            name = f"val_cover_{method}_{normaliser}{suffix}"
            figures[name] = covered.overall
            figures |= {f"{name}_t{i + 1}": share for i, share in enumerate(covered.terciles)}
    return figures


def series_figures(path: Path) -> dict:
    """The figures of one series (see COLUMNS) and the fitted parameters worth seeing."""
    timeframe = path.name.removesuffix(".csv.gz").split("_")[1]
    candles = read_candles_file(path, timeframe)
    head = CandleHead(kind="candle", name="ohlc", columns=list(CANDLE))
    windows = make_windows(candles, WINDOW, list(CANDLE), [head], {"ohlc": (WINDOW.horizon, len(CANDLE))})
    fitted = bl.fit_baselines(candles, timeframe, WINDOW.horizon, windows.train.first_target_rows,
                              windows.val.first_target_rows, LEVELS)
    test, val = windows.test.first_target_rows, windows.val.first_target_rows
    actual, forecast = fitted.actual(test), fitted.forecast(test)
    scores = {name: {q: point_scores(f, actual[q], q, fitted.floor) for q, f in by_quantity.items()}
              for name, by_quantity in forecast.items()}
    B = bl.Baseline

    def skill_of(quantity: str, model: str, baseline: str, key: str = "mae") -> float | None:
        return skill(getattr(scores[model][quantity], key), getattr(scores[baseline][quantity], key))

    def mean_range_mae(name: str) -> float:
        return mae(forecast[name]["range"].mean(axis=1), actual["range"].mean(axis=1))

    figures = {
        "range_ewma_vs_persistence": skill_of("range", B.EWMA, B.PERSISTENCE),
        "range_har_vs_persistence": skill_of("range", B.HAR_TOD, B.PERSISTENCE),
        "range_har_vs_ewma": skill_of("range", B.HAR_TOD, B.EWMA),
        "range_har_vs_persistence_horizon": skill_of("range", B.HAR_TOD, B.PERSISTENCE, "mae_horizon"),
        "mean_range_har_vs_persistence": skill(mean_range_mae(B.HAR_TOD), mean_range_mae(B.PERSISTENCE)),
        "range_qlike_har_vs_persistence": skill_of("range", B.HAR_TOD_RMS, B.PERSISTENCE, "qlike"),
        "range_qlike_har_vs_ewma": skill_of("range", B.HAR_TOD_RMS, B.EWMA, "qlike"),
        **{f"{q}_har_vs_{b}": skill_of(q, B.HAR_TOD, b) for q in bl.EXCURSIONS for b in (B.NO_CHANGE, B.PERSISTENCE)},
        # What putting HAR on its level on validation (per step, the factor with the lowest MAE / QLIKE there, as the
        # network's forecasts are put) is worth by itself: the gap between HAR as fitted and bench-skill's bar
        **{f"{q}_har_level_vs_har": skill_of(q, B.HAR_TOD_LEVEL, B.HAR_TOD) for q in ("range", *bl.EXCURSIONS)},
        "range_qlike_har_level_vs_har": skill_of("range", B.HAR_TOD_LEVEL_RMS, B.HAR_TOD_RMS, "qlike"),
    }
    figures |= {f"{q}_oracle_vs_har": skill for q, skill in _ceiling(candles, fitted, windows).items()}
    returns = actual["return"][:, 0]
    quantiles = fitted.quantile_forecasts(test)
    vol_test = fitted.volatility(test)
    intervals = {
        "ewma_scaled": (quantiles["ewma_scaled"]["return"][[0, 2], :, 0], vol_test["ewma"][:, 0]),
        "static": (quantiles["static"]["return"][[0, 2], :, 0], vol_test["ewma"][:, 0]),
    }
    for normaliser in ("har", "har_ewma"):
        no_change = _no_change(fitted, val, normaliser), _no_change(fitted, test, normaliser)
        scale = no_change[1].scale  # the next candle's: (N, 1)
        made = {name: method().intervals(*no_change) for name, method in METHODS.items()}
        for name, calibrated in made.items():
            intervals[f"{name}_{normaliser}"] = ((calibrated.lower[:, 0], calibrated.upper[:, 0]), scale[:, 0])
        figures[f"width_adaptive_{normaliser}"] = float(np.mean(made["adaptive"].margin * scale)
                                                        / np.mean(made["conformal"].margin * scale) - 1)
    for name, ((lower, upper), scale) in intervals.items():
        covered = coverage(lower, upper, returns, scale)
        figures[f"cover_{name}"] = covered.overall
        if name != "static":
            figures |= {f"cover_{name}_t{i + 1}": share for i, share in enumerate(covered.terciles)}
    figures |= _validation_coverage(fitted, val)
    for alpha in VALIDATION_ALPHAS:
        refitted = bl.fit_baselines(candles, timeframe, WINDOW.horizon, windows.train.first_target_rows, val, LEVELS,
                                    volatility_alpha=alpha)
        figures |= _validation_coverage(refitted, val, ("har_ewma",), ("adaptive",), f"_alpha{alpha}")
    parameters = {"ewma_alpha_next": {q: float(a[0]) for q, a in fitted.ewma_alphas.items()},
                  "har_next": dict(zip(bl.HAR_TERMS, fitted.har_coefficients[0].tolist())),
                  "excursion_shares_next": {q: float(s[0]) for q, s in fitted.excursion_shares.items()},
                  "n_test": len(test)}
    return {"figures": figures, "parameters": parameters}


def _ceiling(candles, fitted: bl.Baselines, windows) -> dict[str, float]:
    """High / low MAE skill vs HAR at the next candle of HAR given the future's local volatility (docstring)."""
    times = candles.index if "timestamp" not in candles.columns else candles["timestamp"]
    slot = (pd.DatetimeIndex(times).as_unit("ns").asi8 % bl.DAY.value) // timeframe_delta(fitted.timeframe).value
    log_range = np.log(np.maximum(np.log(candles["high"] / candles["low"]).to_numpy(), fitted.floor))
    deviation = pd.Series(log_range - fitted.time_of_day[slot])
    around = (deviation.rolling(25, center=True, min_periods=1).sum() - deviation) / 24 + fitted.time_of_day[slot]
    train, test = windows.train.first_target_rows, windows.test.first_target_rows  # target rows: t + 1

    def design(rows: np.ndarray) -> np.ndarray:
        har = np.log(fitted.forecast(rows)[bl.Baseline.HAR_TOD]["range"][:, 0])
        return np.column_stack([np.ones(len(rows)), har, around.to_numpy()[rows]])

    ceiling = np.exp(design(test) @ np.linalg.lstsq(design(train), log_range[train], rcond=None)[0])
    fitted_train = np.exp(design(train) @ np.linalg.lstsq(design(train), log_range[train], rcond=None)[0])
    actual_train, actual, har = fitted.actual(train), fitted.actual(test), fitted.forecast(test)[bl.Baseline.HAR_TOD]
    out = {}
    for q in bl.EXCURSIONS:
        share = np.median(actual_train[q][:, 0] / fitted_train)
        out[q] = skill(mae(share * ceiling, actual[q][:, 0]), mae(har[q][:, 0], actual[q][:, 0]))
    return out


def summary(rows: dict[str, dict]) -> dict:
    """Per figure: median, min, max over series, and how many series are above 0 (skills and widths) or 77-83 %
    (coverage; where it has terciles, how many series have each of them within 5 points of 80 % too)."""
    out = {}
    columns = {**COLUMNS, **VALIDATION_COLUMNS}
    for column in columns:
        values = [r["figures"][column] for r in rows.values() if r["figures"].get(column) is not None]
        if not values:
            continue
        out[column] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
        out[column] |= {"in_77_83": sum(0.77 <= v <= 0.83 for v in values)} if "cover" in column \
            else {"above_0": sum(v > 0 for v in values)}
        if "cover" in column and f"{column}_t1" in columns:
            out[column]["terciles_within_5"] = sum(
                all(abs(r["figures"][f"{column}_t{i}"] - 0.8) <= 0.05 for i in (1, 2, 3)) for r in rows.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="*", help="series glob, e.g. 'BTC*' or '*_1h' (default: every series)")
    parser.add_argument("--data", type=Path, default=SHARED_OHLCV,
                        help="a directory of SYMBOL_TIMEFRAME.csv.gz (default: ../shared/data/ohlcv; data/ohlcv: the "
                             "bundled candles)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = parser.parse_args(argv)
    console = Console(width=200)
    if not args.data.is_dir():
        console.print(f"bench-baselines runs over every series in {args.data} (../shared beside the checkout, or "
                      "--data); it is not there, so nothing was measured")
        return 2
    paths = sorted(path for path in args.data.glob("*.csv.gz")
                   if fnmatch.fnmatch(path.name.removesuffix(".csv.gz"), args.only))
    if not paths:
        console.print(f"no series matching {args.only!r} in {args.data}")
        return 2

    started, cpu_started = time.perf_counter(), time.process_time()
    rows = {path.name.removesuffix(".csv.gz"): series_figures(path) for path in paths}
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started

    table = Table(title="baselines on the test split (last 15 %): MAE skill at the next candle, 80 % interval coverage")
    table.add_column("series")
    for label, _ in COLUMNS.values():
        table.add_column(label, justify="right")
    for name, row in rows.items():
        table.add_row(name, *(_fmt(row["figures"].get(column), spec) for column, (_, spec) in COLUMNS.items()))
    console.print(table)
    overall = summary(rows)
    for column, (_, spec) in COLUMNS.items():
        if column in overall:
            s = overall[column]
            count = f"{s['in_77_83']}/{s['n']} in 77-83 %" if "in_77_83" in s else f"{s['above_0']}/{s['n']} > 0"
            if "terciles_within_5" in s:
                count += f", every tercile within 5 points on {s['terciles_within_5']}/{s['n']}"
            console.print(f"{column:<36} median {_fmt(s['median'], spec):>7} [{_fmt(s['min'], spec)}, "
                          f"{_fmt(s['max'], spec)}]  {count}")
    console.print("the interval's normaliser on validation alone (calibrated on its first half, scored on its "
                  "second; around no change, the next candle):")
    for column in VALIDATION_COLUMNS:
        if column in overall and "terciles_within_5" in overall[column]:
            s = overall[column]
            console.print(f"{column:<36} median {_fmt(s['median'], '.1%'):>7}  {s['in_77_83']}/{s['n']} in 77-83 %, "
                          f"every tercile within 5 points on {s['terciles_within_5']}/{s['n']}")
    console.print(f"{len(rows)} series in {seconds:.1f} s, {cpu_seconds:.1f} s of CPU ({cpu_seconds / len(rows):.2f} s "
                  f"a series: read, split, fit, score); load average {os.getloadavg()[0]:.1f}")
    results = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus", "window": {"lookback": WINDOW.lookback, "horizon": WINDOW.horizon},
        "levels": LEVELS, "seconds": seconds, "cpu_seconds": cpu_seconds, "overall": overall, "per_series": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.json, lambda tmp: write_json(tmp, results))
    console.print(f"written: {args.json}")
    return 0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
