"""Are the models worth having? Test skill vs persistence over every real series, absolute vs relative framing.

  make bench-skill
  python benchmarks/bench_skill.py --epochs 4 --only 'BTC*'

One small model of the V7 shape (the same layer stack with fewer units; V7's 12 inputs, lookback 60, horizon
10, heads ohlc / bb / volatility) is trained with `cryptotrain run` on every series in ../shared/data/ohlcv,
once per framing, with the same epochs, batch size and seed:
  (a) absolute  window.relative_to: null - z-scored price levels, as the old scripts did
  (b) relative  window.relative_to: last_close, ohlc a candle head - the bundled families' default
Per series, on the held-out chronological test split: skill of the close vs persistence over every horizon
step (1 - MAE / MAE of repeating the last close) - for (b) also before the validation-chosen shrink toward
"no change" (window.shrink) and its factor -, direction accuracy of the close next to the majority-class
rate, and the share of consistent predicted candles (high >= max(open, close), low <= min(open, close)).
Prints the table and the overall figures; writes JSON to benchmarks/results/skill.json.
Targets for (b): median skill >= 0.00, no series below -0.05, 100 % consistent candles.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SHARED_OHLCV = (REPO.parent / "shared" / "data" / "ohlcv").resolve()
RESULTS = BENCH_DIR / "results" / "skill.json"
TARGETS = {"median_skill": 0.0, "worst_skill": -0.05, "consistent_candles": 1.0}
FRAMINGS = {"absolute": None, "relative": "last_close"}


def bench_config(framing: str, symbols: list[str], timeframes: list[str], epochs: int, run_dir: Path,
                 cache_dir: Path) -> dict:
    """configs/v7.yaml with the series here, fewer units and epochs, and the framing under test."""
    family = yaml.safe_load((REPO / "configs" / "v7.yaml").read_text())
    relative = FRAMINGS[framing] is not None
    narrow = {128: 16, 64: 16, 32: 8}  # V7's units -> these
    layers = [{**layer, "units": narrow[layer["units"]]} if "units" in layer else layer
              for layer in family["model"]["layers"]]
    heads = [{**head, "candle": relative and head["name"] == "ohlc"} for head in family["heads"]]
    return {
        "name": f"bench_skill_{framing}", "output_dir": str(run_dir), "cache_dir": str(cache_dir),
        "data": {"source": "local", "local": {"path": str(SHARED_OHLCV)}, "symbols": symbols,
                 "timeframes": timeframes},
        "features": family["features"],
        "window": {**family["window"], "relative_to": FRAMINGS[framing]},
        "heads": heads,
        "model": {"layers": layers},
        "train": {**family["train"], "batch_size": 64, "epochs": epochs, "learning_rate": 0.001,
                  "early_stopping": {"patience": 2}, "reduce_lr": {"patience": 1}},
    }


def series_of(pattern: str) -> list[str]:
    return sorted(p.name.removesuffix(".csv.gz") for p in SHARED_OHLCV.glob("*.csv.gz")
                  if fnmatch.fnmatch(p.name.removesuffix(".csv.gz"), pattern))


def train(framing: str, series: list[str], epochs: int, scratch: Path) -> tuple[dict[str, dict], float]:
    """Runs `cryptotrain run` over the series; job name -> metrics.json, and the wall time."""
    symbols = sorted({s.split("_")[0] for s in series})
    timeframes = sorted({s.split("_")[1] for s in series})
    run_dir = scratch / framing
    config = scratch / f"{framing}.yaml"
    config.write_text(yaml.safe_dump(bench_config(framing, symbols, timeframes, epochs, run_dir,
                                                  scratch / "cache"), sort_keys=False))
    started = time.perf_counter()
    # Only the series that exist (not every symbol has both timeframes); a failed job shows in the table.
    only = [arg for s in series for arg in ("--only", s)]
    subprocess.run([sys.executable, "-m", "trainer", "run", "--config", str(config), *only], cwd=REPO,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=False)
    seconds = time.perf_counter() - started
    found = {}
    for name in series:
        path = run_dir / "jobs" / name / "metrics.json"
        if path.is_file():
            found[name] = json.loads(path.read_text())
    return found, seconds


def row(metrics: dict | None) -> dict:
    """The figures of one job: close skill (every step, and per step), direction vs majority, candles."""
    if metrics is None:
        return {"skill": None}
    head = metrics["headline"]["head"]
    scores = metrics["heads"][head]
    return {"skill": scores["close"]["skill"], "skill_by_step": scores["close"]["skill_by_step"],
            "skill_unshrunk": scores["close"]["skill_unshrunk"], "shrink": scores["shrink"],
            "direction_accuracy": scores["close"]["direction_accuracy"],
            "majority_rate": scores["close"]["majority_rate"], "up_move_rate": scores["close"]["up_move_rate"],
            "consistent_candles": 1 - scores["inconsistent_candles"]["model"], "epochs": metrics["epochs_run"]}


def overall(rows: list[dict]) -> dict:
    skills = [r["skill"] for r in rows if r["skill"] is not None]
    if not skills:
        return {"jobs": 0}
    return {
        "jobs": len(skills), "median_skill": statistics.median(skills), "mean_skill": statistics.fmean(skills),
        "worst_skill": min(skills), "best_skill": max(skills),
        "below_-0.05": sum(s < -0.05 for s in skills), "at_least_0": sum(s >= 0 for s in skills),
        "median_skill_unshrunk": statistics.median(r["skill_unshrunk"] for r in rows if r["skill"] is not None),
        "shrunk_to_no_change": sum(r["shrink"] == 0 for r in rows if r["skill"] is not None),
        "median_direction_accuracy": statistics.median(r["direction_accuracy"] for r in rows if r["skill"] is not None),
        "median_majority_rate": statistics.median(r["majority_rate"] for r in rows if r["skill"] is not None),
        "consistent_candles": statistics.fmean(r["consistent_candles"] for r in rows if r["skill"] is not None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs per job (early stopping may end sooner)")
    parser.add_argument("--only", default="*", help="series glob, e.g. 'BTC*' or '*_1h' (default: every series)")
    args = parser.parse_args()
    console = Console(width=120)
    if not SHARED_OHLCV.is_dir():
        console.print(f"bench-skill runs over every series in {SHARED_OHLCV} (../shared beside the checkout); "
                      "it is not there, so nothing was measured")
        return 2
    series = series_of(args.only)
    if not series:
        console.print(f"no series matching {args.only!r} in {SHARED_OHLCV}")
        return 2

    results, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-skill-") as scratch:
        for framing in FRAMINGS:
            console.print(f"[bold]{framing}[/]: training {len(series)} series, {args.epochs} epochs each")
            results[framing], seconds[framing] = train(framing, series, args.epochs, Path(scratch))

    rows = {framing: {s: row(results[framing].get(s)) for s in series} for framing in FRAMINGS}
    table = Table(title=f"test skill of the close vs persistence, every step of the horizon ({args.epochs} epochs)")
    for column in ("series", "skill abs", "skill rel", "unshrunk", "shrink", "dir abs", "dir rel", "majority",
                   "candles ok abs", "candles ok rel"):
        table.add_column(column, justify="left" if column == "series" else "right")
    for s in series:
        a, r = rows["absolute"][s], rows["relative"][s]
        table.add_row(s, _fmt(a["skill"], "+.3f"), _fmt(r["skill"], "+.4f"), _fmt(r.get("skill_unshrunk"), "+.4f"),
                      _fmt(r.get("shrink"), ".2f"), _fmt(a.get("direction_accuracy")),
                      _fmt(r.get("direction_accuracy")), _fmt(r.get("majority_rate")),
                      _fmt(a.get("consistent_candles"), ".1%"), _fmt(r.get("consistent_candles"), ".1%"))
    console.print(table)
    summary = {framing: overall(list(rows[framing].values())) for framing in FRAMINGS}
    for framing, figures in summary.items():
        if figures["jobs"]:
            console.print(f"{framing:>9}: {figures['jobs']} series, median skill {figures['median_skill']:+.4f} "
                          f"(unshrunk {figures['median_skill_unshrunk']:+.4f}; shrunk to no change: "
                          f"{figures['shrunk_to_no_change']}), "
                          f"worst {figures['worst_skill']:+.4f}, best {figures['best_skill']:+.4f}, "
                          f"{figures['at_least_0']} >= 0, {figures['below_-0.05']} below -0.05; direction "
                          f"{figures['median_direction_accuracy']:.3f} vs majority "
                          f"{figures['median_majority_rate']:.3f}; consistent candles "
                          f"{figures['consistent_candles']:.1%}; {seconds[framing]:.0f} s")
        else:
            console.print(f"{framing:>9}: no job finished")
    rel = summary["relative"]
    met = bool(rel["jobs"]) and rel["jobs"] == len(series) and rel["median_skill"] >= TARGETS["median_skill"] \
        and rel["worst_skill"] >= TARGETS["worst_skill"] and rel["consistent_candles"] >= TARGETS["consistent_candles"]
    console.print(f"targets (relative): median skill >= {TARGETS['median_skill']:.2f}, none below "
                  f"{TARGETS['worst_skill']:.2f}, 100 % consistent candles: {'MET' if met else 'NOT MET'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus", "epochs": args.epochs, "series": series, "seconds": seconds,
        "targets": TARGETS, "targets_met": met, "overall": summary, "per_series": rows,
    }, indent=1))
    console.print(f"written: {RESULTS}")
    return 0


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
