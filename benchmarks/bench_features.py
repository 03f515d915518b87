"""Data preparation of a job, old way vs ours: load + validate + features + train/val/test windows.

  make bench-features
  python benchmarks/bench_features.py --repeats 5 --json benchmarks/results/features.json

Over every series in ../shared/data/ohlcv, with V8-stable's features and windows (configs/v8_stable.yaml:
15 input columns, lookback 120, horizon 1, min-max scaling, windows relative to their last close), times
the whole preparation until the arrays are ready for `fit`:

  (a) old    the Colab scripts' way: pandas read_csv, RSI by a Python loop over rows (Wilder smoothing,
             warm-up rows 0), the other indicators with pandas (ROC through np.roll), a scaler fit on the
             whole series, every window built by a Python loop, then a chronological 70/15/15 split.
  (b) cold   ours with an empty cache, what a job runs before fit (pipeline.prepare, then train_one's
             job_windows): trainer.data.load_candles (parse + validate + store), load_features (compute +
             store), trainer.data.windows.make_windows (the rows the device gathers batches from, and the input
             and target scalers fit on every framed train window), and, for V8-stable's head that starts at
             HAR, the baselines fitted on the train split with HAR's forecast of each window.
  (c) cached the same calls again: candles and features come from the on-disk cache.
  (d)        not in (b) or (c): what a job still frames on the host after fit, from the same windows: the
             validation inputs (window.shrink) and the test inputs to predict, with the raw values they are
             scored against. Training's windows are gathered and framed on the device, batch by batch, in
             the train step (bench-throughput's figures hold that).

Each series is timed `--repeats` times per variant, the variants interleaved so that load from other
processes hits them alike, the garbage collector off during each timing (as timeit does); per series
the median is kept (and the best time, in the JSON). Prints a table of per-series medians with the
ratios old/cold and old/cached, the median ratio over series against the targets (cold >= 3x,
cached >= 10x), the same with (d) added, and writes the figures as JSON with the CPU and the machine's
load average.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import track
from rich.table import Table

from trainer.config import RunConfig, load_config
from trainer.data import load_candles
from trainer.data.features import load_features
from trainer.data.windows import Windows
from trainer.run.pipeline import job_windows

REPO = Path(__file__).resolve().parents[1]
SHARED_OHLCV = (REPO.parent / "shared" / "data" / "ohlcv").resolve()
DEFAULT_JSON = REPO / "benchmarks" / "results" / "features.json"
TARGETS = {"cold": 3.0, "cached": 10.0}  # required speed-up over the old way


# ----------------------------------------------------------------------------- (a) the old way
def old_rsi(close: np.ndarray, period: int = 14) -> np.ndarray:
    """The scripts' RSI: Wilder smoothing seeded with the first `period` changes, a loop over rows."""
    deltas = np.diff(close)
    seed = deltas[:period]
    up, down = seed[seed >= 0].sum() / period, -seed[seed < 0].sum() / period
    rsi = np.zeros_like(close)
    for i in range(period, len(close)):
        delta = deltas[i - 1]
        gain, loss = (delta, 0.0) if delta > 0 else (0.0, -delta)
        up = (up * (period - 1) + gain) / period
        down = (down * (period - 1) + loss) / period
        rsi[i] = 100.0 - 100.0 / (1.0 + up / down) if down else 100.0
    return rsi


def old_prepare(path: Path, lookback: int, horizon: int, max_rows: int | None = None) -> tuple[np.ndarray, ...]:
    df = pd.read_csv(path)
    if max_rows:
        df = df.tail(max_rows)  # the most recent rows, as data.max_rows keeps them
    df["timestamp"] = pd.to_datetime(df["timestamp"])
    for column in ("open", "high", "low", "close", "volume"):
        df[column] = pd.to_numeric(df[column])
    close = df["close"]
    df["rsi"] = old_rsi(close.to_numpy())
    df["macd"] = close.ewm(span=12, adjust=False).mean() - close.ewm(span=26, adjust=False).mean()
    df["signal"] = df["macd"].ewm(span=9, adjust=False).mean()
    shifted = np.roll(close.to_numpy(), 12)
    df["roc"] = (close - shifted) / shifted * 100
    sma, std = close.rolling(20).mean(), close.rolling(20).std()
    df["bb_upper"], df["bb_lower"] = sma + 2 * std, sma - 2 * std
    df["bb_width_pct"] = (df["bb_upper"] - df["bb_lower"]) / sma
    df["bb_position"] = ((close - df["bb_lower"]) / (df["bb_upper"] - df["bb_lower"])).clip(0, 1)
    df["volatility"] = std / sma
    previous = close.shift(1)
    true_range = pd.concat([df["high"] - df["low"], (df["high"] - previous).abs(),
                            (df["low"] - previous).abs()], axis=1).max(axis=1)
    df["atr"] = true_range.rolling(14).mean()
    df["volume_norm"] = df["volume"] / df["volume"].rolling(20).mean()
    df = df.dropna()
    columns = ["open", "high", "low", "close", "rsi", "macd", "signal", "roc", "bb_upper", "bb_lower",
               "bb_width_pct", "bb_position", "volatility", "atr", "volume_norm"]
    data = df[columns].to_numpy()
    low, high = data.min(axis=0), data.max(axis=0)
    data = (data - low) / (high - low)  # MinMaxScaler fit on the whole series (the old leak)
    x, y = [], []
    for i in range(lookback, len(data) - horizon + 1):
        x.append(data[i - lookback:i])
        y.append(data[i:i + horizon, :4])
    x, y = np.array(x), np.array(y)
    train_end, val_end = int(len(x) * 0.7), int(len(x) * 0.85)
    return x[:train_end], y[:train_end], x[train_end:val_end], y[train_end:val_end], x[val_end:], y[val_end:]


# ----------------------------------------------------------------------------- (b), (c) ours
def our_prepare(cfg: RunConfig, symbol: str, timeframe: str) -> tuple[bool, Windows]:
    """Whether the features came from the cache, and the windows."""
    candles = load_candles(cfg, symbol, timeframe)
    frame, hit = load_features(candles, cfg.features, cfg.cache_path)
    horizon = cfg.window.horizon
    shapes = {h.name: (len(h.columns),) if horizon == 1 else (horizon, len(h.columns)) for h in cfg.heads}
    return hit, job_windows(cfg, timeframe, frame, shapes)[0]


def after_fit(windows: Windows, shrink: bool) -> None:
    """(d): the host arrays pipeline.train_one reads from the windows after fit (choose_shrink, predict, evaluate)."""
    for split in (windows.val, windows.test) if shrink else (windows.test,):
        split.x, split.last_close, split.y_raw  # noqa: B018 (computed when first read)
    windows.test.last_inputs  # noqa: B018


def timed(step: Callable[[], object]) -> tuple[float, object]:
    """Seconds and result of step(); the garbage collector is off meanwhile, as in timeit, so that
    a collection owed to one variant's garbage is not charged to another."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = step()
        return time.perf_counter() - start, result
    finally:
        gc.enable()


def time_series(cfg: RunConfig, path: Path, repeats: int, scratch: Path) -> dict:
    """Median and best seconds of each variant over `repeats` interleaved rounds on one series."""
    symbol, timeframe = path.name.removesuffix(".csv.gz").rsplit("_", 1)
    window = cfg.window
    times: dict[str, list[float]] = {"old": [], "cold": [], "cached": [], "after_fit": []}
    for repeat in range(repeats):
        ours = cfg.model_copy(update={"cache_dir": scratch / f"{path.name}-{repeat}"})
        times["old"].append(timed(partial(old_prepare, path, window.lookback, window.horizon))[0])
        for variant, expect_hit in (("cold", False), ("cached", True)):
            elapsed, (hit, windows) = timed(partial(our_prepare, ours, symbol, timeframe))
            assert hit == expect_hit, f"{path.name}: {variant} run: cache hit {hit}"
            times[variant].append(elapsed)
        times["after_fit"].append(timed(partial(after_fit, windows, window.shrink))[0])
        shutil.rmtree(ours.cache_dir)
    rows = len(load_candles(cfg, symbol, timeframe))
    return {"series": path.name, "rows": rows, **{k: statistics.median(v) for k, v in times.items()},
            "best": {k: min(v) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timings per series and variant (median kept)")
    parser.add_argument("--only", default="*", help="glob over the series' file names (SYMBOL_TIMEFRAME)")
    parser.add_argument("--data", type=Path, default=SHARED_OHLCV,
                        help="a directory of SYMBOL_TIMEFRAME.csv.gz (default: ../shared/data/ohlcv; data/ohlcv: the "
                             "bundled candles)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args(argv)

    if not args.data.is_dir():
        sys.exit(f"bench-features runs over every series in {args.data} (../shared beside the checkout, or --data); "
                 "it is not there, so nothing was measured")
    paths = sorted(args.data.glob(f"{args.only}.csv.gz"))
    if not paths:
        sys.exit(f"no series matching {args.only!r} in {args.data}")
    cfg = load_config(REPO / "configs" / "v8_stable.yaml",
                      # one job's own candles: the market input reads other series (timed by job_features)
                      ["data.source=local", f"data.local.path={args.data}", "features.market=null"])
    console = Console(width=124)  # the table's width, in a terminal or not
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-features-") as scratch:
        results = [time_series(cfg, path, args.repeats, Path(scratch))
                   for path in track(paths, description="Timing", console=console, transient=True)]
    summary = summarise(results)
    print_table(console, results, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "what": "data preparation of one job (load + validate + features + windows), seconds, per-series "
                "median; after_fit: what a job frames on the host after fit (see the module's docstring)",
        "config": "configs/v8_stable.yaml without the market (16 columns, lookback 120, horizon 1)",
        "repeats": args.repeats, "machine": platform.platform(), "cpu": cpu_name(),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
        "series": results, "summary": summary,
    }, indent=2))
    console.print(f"wrote {args.json}")


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform says."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else platform.processor()


def summarise(results: list[dict]) -> dict:
    median = {k: statistics.median(r[k] for r in results) for k in ("old", "cold", "cached", "after_fit")}
    ratios = {k: [r["old"] / r[k] for r in results] for k in TARGETS}
    best_ratios = {k: [r["best"]["old"] / r["best"][k] for r in results] for k in TARGETS}
    with_after_fit = {k: statistics.median(r["old"] / (r[k] + r["after_fit"]) for r in results) for k in TARGETS}
    return {
        "median_seconds": median,
        "speedup_median": {k: statistics.median(v) for k, v in ratios.items()},
        "speedup_worst": {k: min(v) for k, v in ratios.items()},
        "speedup_median_of_best_times": {k: statistics.median(v) for k, v in best_ratios.items()},
        "speedup_median_with_after_fit": with_after_fit,
        "targets": TARGETS,
        "targets_met": {k: statistics.median(v) >= TARGETS[k] for k, v in ratios.items()},
    }


def print_table(console: Console, results: list[dict], summary: dict) -> None:
    table = Table(title="Data preparation per job: median ms over repeats (V8-stable features, lookback 120)")
    table.add_column("series", no_wrap=True)
    for column in ("rows", "(a) old", "(b) cold", "(c) cached", "(d) after fit", "old/cold", "old/cached"):
        table.add_column(column, justify="right")
    variants = ("old", "cold", "cached", "after_fit")
    for r in results:
        table.add_row(r["series"], str(r["rows"]), *(f"{r[k] * 1e3:.1f}" for k in variants),
                      f"{r['old'] / r['cold']:.1f}x", f"{r['old'] / r['cached']:.1f}x")
    m, s = summary["median_seconds"], summary["speedup_median"]
    table.add_row("median", "", *(f"{m[k] * 1e3:.1f}" for k in variants), f"{s['cold']:.1f}x", f"{s['cached']:.1f}x",
                  style="bold")
    console.print(table)
    for variant, target in TARGETS.items():
        verdict = "met" if summary["targets_met"][variant] else "NOT met"
        console.print(f"{variant}: {summary['speedup_median'][variant]:.1f}x faster than the old way (median over "
                      f"series; worst series {summary['speedup_worst'][variant]:.1f}x, best times "
                      f"{summary['speedup_median_of_best_times'][variant]:.1f}x); target >= {target:g}x: {verdict}")
    after = summary["speedup_median_with_after_fit"]
    console.print(f"(d) after fit, the validation and test inputs framed on the host for prediction: median "
                  f"{m['after_fit'] * 1e3:.1f} ms, not in (b) or (c); with it, cold {after['cold']:.1f}x and cached "
                  f"{after['cached']:.1f}x")


if __name__ == "__main__":
    main()
