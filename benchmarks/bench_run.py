"""N tiny real-data jobs, the old scripts' way vs `cryptotrain run`, measured side by side in one run.

  make bench-run
  python benchmarks/bench_run.py --jobs 6 --epochs 2

  (a) old   what the Colab scripts did per model: a fresh Python process (TensorFlow start-up), indicators
            with a Python-loop RSI and windows built by a Python loop (bench_features.old_prepare), a new
            model built and traced, numpy arrays into fit, the model saved.
  (b) ours  one `cryptotrain run` process over the same jobs: one TF context, cached features, one compiled
            model reused across jobs, artifacts, ledger.

Both train the same model (V8-stable's 15 inputs and min-max scaling, tiny layers) for the same epochs
and batch size on the same series. Per job: wall time (old: its whole process; ours: from the previous
job's end to its own, as the ledger recorded them), time inside train steps (a keras callback around
each step), overhead = wall - steps, and RSS after the job. Prints totals and ratios; writes JSON to
benchmarks/results/run.json. Targets: overhead after the first job of a shape <= 0.5 s, total >= 2.5x
faster than (a).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
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
RESULTS = BENCH_DIR / "results" / "run.json"
SERIES = ["BTCUSDT_1h", "ETHUSDT_1h", "SOLUSDT_1h", "XRPUSDT_1h", "BNBUSDT_1h", "ADAUSDT_1h", "DOGEUSDT_1h",
          "LINKUSDT_1h", "BTCUSDT_15m", "ETHUSDT_15m"]
TARGETS = {"overhead_s": 0.5, "speedup": 2.5}


def bench_config(jobs: list[str], epochs: int, rows: int, run_dir: Path, cache_dir: Path, data: Path) -> dict:
    """V8-stable's data path in miniature: its 15 features of the old scripts (not volume_surprise, nor the market
    input, which they never had), lookback 60, horizon 1, tiny layers, the most recent `rows` candles of each
    series; its candle head with free wicks (kind: candle), as the old scripts' model had no HAR forecast to read."""
    family = yaml.safe_load((REPO / "configs" / "v8_stable.yaml").read_text())
    features = {**{k: v for k, v in family["features"].items() if k != "market"},
                "indicators": [i for i in family["features"]["indicators"] if i["name"] != "volume_surprise"]}
    symbols = sorted({job.split("_")[0] for job in jobs})
    timeframes = sorted({job.split("_")[1] for job in jobs})
    return {
        "name": "bench_run", "output_dir": str(run_dir), "cache_dir": str(cache_dir),
        "data": {"source": "local", "local": {"path": str(data), "pattern": "{symbol}_{timeframe}.csv.gz"},
                 "symbols": symbols,
                 "timeframes": timeframes, "max_rows": rows},
        "features": features,
        "window": {"lookback": 60, "horizon": 1, "scaler": "minmax"},
        "heads": [{**head, "kind": "candle"} for head in family["heads"]],
        "model": {"layers": [{"kind": "lstm", "units": 16}, {"kind": "dense", "units": 16, "activation": "relu"}]},
        "train": {"batch_size": 64, "epochs": epochs, "learning_rate": 0.001, "seed": 1,
                  "early_stopping": {"patience": 20}, "reduce_lr": {"patience": 8}},
    }


# ----------------------------------------------------------------------------- (a) one old-style job
def old_job(config_path: Path, job: str, out_dir: Path) -> None:
    """Runs inside its own fresh process, as each old script run did; prints its measurements as JSON."""
    sys.path.insert(0, str(BENCH_DIR))
    sys.path.insert(0, str(REPO))
    import keras
    from bench_features import old_prepare

    from trainer.config import load_config
    from trainer.model.callbacks import StepTimer
    from trainer.model.models import build_model

    cfg = load_config(config_path)
    x_train, y_train, x_val, y_val, _, _ = old_prepare(cfg.data.local.path / f"{job}.csv.gz", cfg.window.lookback,
                                                       cfg.window.horizon, cfg.data.max_rows)
    keras.utils.set_random_seed(cfg.train.seed)
    assert x_train.shape[-1] == cfg.network.n_features  # the old features: as many as the config's
    model = build_model(cfg.network, cfg.train)
    timer = StepTimer()
    callbacks = [keras.callbacks.EarlyStopping(patience=cfg.train.early_stopping.patience, restore_best_weights=True),
                 keras.callbacks.ReduceLROnPlateau(patience=cfg.train.reduce_lr.patience), timer]
    model.fit(x_train, {"ohlc": y_train[:, 0, :]}, validation_data=(x_val, {"ohlc": y_val[:, 0, :]}),
              batch_size=cfg.train.batch_size, epochs=cfg.train.epochs, verbose=0, callbacks=callbacks)
    model.save(out_dir / f"{job}.keras")
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    print(json.dumps({"step_seconds": timer.seconds, "rss_mb": pages * os.sysconf("SC_PAGE_SIZE") / 2**20}))


def run_old(config_path: Path, jobs: list[str], scratch: Path) -> list[dict]:
    rows = []
    for job in jobs:
        started = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--old-job", job, "--config", str(config_path),
                                "--scratch", str(scratch)], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        measured = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append({"job": job, "wall": wall, "steps": measured["step_seconds"], "rss_mb": measured["rss_mb"]})
    return rows


# ----------------------------------------------------------------------------- (b) cryptotrain run
def run_ours(config_path: Path, run_dir: Path, jobs: list[str]) -> tuple[float, list[dict]]:
    only = [arg for job in jobs for arg in ("--only", job)]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer", "run", "--config", str(config_path), *only], cwd=REPO,
                   check=True, capture_output=True)
    total = time.perf_counter() - started
    # A job's wall time: from the previous job's end to its own (claim, ledger and summary writes included);
    # the first job's from its claim.
    with sqlite3.connect(run_dir / "ledger.sqlite") as ledger:
        done = ledger.execute("SELECT name, finished_at, seconds, summary FROM jobs WHERE status = 'done' "
                              "ORDER BY finished_at").fetchall()
    rows, previous_end = [], None
    for name, finished_at, seconds, summary in done:
        summary = json.loads(summary)
        wall = seconds if previous_end is None else finished_at - previous_end
        rows.append({"job": name, "wall": wall, "steps": summary["train_step_seconds"], "rss_mb": summary["rss_mb"]})
        previous_end = finished_at
    return total, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=6, help=f"number of jobs (series), at most {len(SERIES)}")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=3000, help="most recent candles per series")
    parser.add_argument("--data", type=Path, default=SHARED_OHLCV,
                        help="a directory of SYMBOL_TIMEFRAME.csv.gz (default: ../shared/data/ohlcv; data/ohlcv: the "
                             "bundled candles, the series of SERIES it holds)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--old-job", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.old_job:
        return old_job(args.config, args.old_job, args.scratch)
    if not args.data.is_dir():
        sys.exit(f"bench-run trains on series in {args.data} (../shared beside the checkout, or --data); it is not "
                 "there, so nothing was measured")

    jobs = [job for job in SERIES if (args.data / f"{job}.csv.gz").is_file()][:args.jobs]
    with tempfile.TemporaryDirectory(prefix="bench-run-") as scratch:
        scratch = Path(scratch)
        run_dir = scratch / "run"
        config_path = scratch / "bench.yaml"
        config = bench_config(jobs, args.epochs, args.rows, run_dir, scratch / "cache", args.data.resolve())
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        ours_total, ours = run_ours(config_path, run_dir, jobs)
        old = run_old(config_path, [row["job"] for row in ours], scratch)
    report(old, ours, ours_total, args)


def report(old: list[dict], ours: list[dict], ours_total: float, args) -> None:
    old_total = sum(row["wall"] for row in old)
    for row in old + ours:
        row["overhead"] = row["wall"] - row["steps"]
    table = Table(title=f"{len(ours)} jobs, {args.rows} rows, {args.epochs} epochs each: old scripts vs "
                        "cryptotrain run")
    for column in ("job", "old wall s", "old overhead s", "old RSS MB", "ours wall s", "ours overhead s",
                   "ours RSS MB"):
        table.add_column(column, justify="left" if column == "job" else "right", no_wrap=column == "job")
    for o, n in zip(old, ours):
        table.add_row(o["job"], f"{o['wall']:.2f}", f"{o['overhead']:.2f}", f"{o['rss_mb']:.0f}",
                      f"{n['wall']:.2f}", f"{n['overhead']:.2f}", f"{n['rss_mb']:.0f}")
    console = Console()
    console.print(table)
    rss = ", ".join(f"{row['rss_mb']:.0f}" for row in ours)
    later = [row["overhead"] for row in ours[1:]] or [float("nan")]
    later_median, later_max = statistics.median(later), max(later)
    speedup = old_total / ours_total
    console.print(f"total: old {old_total:.1f} s, ours {ours_total:.1f} s (whole process, TF start-up included) "
                  f"-> {speedup:.2f}x faster (target >= {TARGETS['speedup']}x)")
    console.print(f"ours: overhead of the first job {ours[0]['overhead']:.2f} s (build + trace); after it median "
                  f"{later_median:.2f} s, worst {later_max:.2f} s (target <= {TARGETS['overhead_s']} s); RSS after "
                  f"each job {rss} MB")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "epochs": args.epochs, "rows": args.rows, "old": old, "ours": ours,
        "old_total_s": old_total, "ours_total_s": ours_total,
        "speedup": speedup, "ours_later_overhead_median_s": later_median, "ours_later_overhead_max_s": later_max,
        "targets": TARGETS,
    }, indent=1))
    console.print(f"written {args.json}")


if __name__ == "__main__":
    main()
