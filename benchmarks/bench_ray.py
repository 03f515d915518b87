"""The same N small real-data jobs in one local `cryptotrain run` process vs on Ray with 2 (--workers)
single-threaded workers, measured side by side in one run on this machine.

  make bench-ray
  python benchmarks/bench_ray.py --epochs 3 --rows 3000

  (a) local  `cryptotrain run`: one process, one TensorFlow context (its thread pools sized to the machine).
  (b) ray    `cryptotrain run --executor ray --workers 2 --cpus-per-worker 1`: the same process drives 2 Ray
             workers (one TensorFlow context each, one thread-pool CPU each), Ray started for the run on this
             machine (127.0.0.1) and stopped at its end: the wall time includes that.
  (c) start  Ray's start-up cost within (b), as its run says it: ray.init on this machine, then 2 cryptotrain workers
             up (TensorFlow imported and configured in each), before its first job.

The jobs: the bundled real candles (data/ohlcv: BTC, ETH, SOL, DOGE x 15m, 1h), a V7-shaped model with small
layers, no market input. Prints the wall times, the ratio and the start-up cost; writes JSON to
benchmarks/results/ray.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sqlite3
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
RESULTS = BENCH_DIR / "results" / "ray.json"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}

# What the Ray run says once its workers answer (trainer.run.distributed: RayExecutor)
STARTED = re.compile(r"Ray: (\d+) workers ready ([\d.]+) s after the run asked for Ray \(a Ray of its own on this "
                     r"machine in ([\d.]+) s\)")


SERIES = {"symbols": ["BTCUSDT", "ETHUSDT", "SOLUSDT", "DOGEUSDT"], "timeframes": ["15m", "1h"]}


def bench_config(run_dir: Path, cache_dir: Path, epochs: int, rows: int) -> dict:
    """V7 in miniature, without its market input: the bundled DOGEUSDT 15m candles (2024) share no timestamp with
    the others (2026), so that job would fail at once instead of training."""
    family = yaml.safe_load((REPO / "configs" / "v7.yaml").read_text())
    features = {key: value for key, value in family["features"].items() if key != "market"}
    return {
        "name": "bench_ray", "output_dir": str(run_dir), "cache_dir": str(cache_dir),
        "data": {"source": "local", "local": {"path": str(REPO / "data" / "ohlcv")}, **SERIES, "max_rows": rows},
        "features": features, "window": {**family["window"], "lookback": 30, "horizon": 5},
        "heads": family["heads"],
        # V7's shape, small: an encoder, then a sequence of `horizon` steps for the heads.
        "model": {"layers": [{"kind": "bilstm", "units": 16, "return_sequences": True},
                             {"kind": "lstm", "units": 16}, {"kind": "repeat_vector"},
                             {"kind": "lstm", "units": 16, "return_sequences": True},
                             {"kind": "dropout", "rate": 0.2}]},
        "train": {**family["train"], "batch_size": 64, "epochs": epochs, "early_stopping": None},
    }


def timed_run(config: Path, *extra: str) -> tuple[float, str]:
    """The run's wall time, and what it wrote to stderr (its notes)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "trainer", "run", "--config", str(config), *extra], cwd=REPO,
                            capture_output=True, text=True, env=ENV)
    if result.returncode != 0:
        raise SystemExit(f"cryptotrain run {' '.join(extra)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started, result.stderr


def job_seconds(run_dir: Path) -> float:
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        return db.execute("SELECT SUM(seconds) FROM jobs WHERE status = 'done'").fetchone()[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--only", default="*", help="the jobs to run, a glob as `cryptotrain run --only` takes it "
                                                    "(default: all 8)")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers, one CPU each (default 2)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = parser.parse_args(argv)
    console = Console()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit("bench-ray needs Ray: pip install 'cryptotrain[ray]' (make install includes it)") from None

    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        tmp = Path(tmp)
        configs = {}
        for name in ("local", "ray"):
            configs[name] = tmp / f"{name}.yaml"
            configs[name].write_text(yaml.safe_dump(bench_config(tmp / name, tmp / "cache", args.epochs, args.rows)))
        subprocess.run([sys.executable, "-m", "trainer", "features", "--config", str(configs["local"]), "--only",
                        args.only], cwd=REPO, capture_output=True, env=ENV, check=True)  # both start cached
        console.print(f"jobs {args.only}, {args.epochs} epochs, the last {args.rows} candles each; "
                      f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")
        local, _ = timed_run(configs["local"], "--only", args.only)
        on_ray, said = timed_run(configs["ray"], "--only", args.only, "--executor", "ray", "--workers",
                                 str(args.workers), "--cpus-per-worker", "1")
        if not (started := STARTED.search(said)):
            raise SystemExit(f"the Ray run did not say when its workers were ready:\n{said[-3000:]}")
        workers_ready, ray_init = float(started[2]), float(started[3])
        local_jobs, ray_jobs = job_seconds(tmp / "local"), job_seconds(tmp / "ray")

    table = Table(title=f"the same real-data jobs ({args.only}): one local process vs "
                  f"{args.workers} single-threaded Ray workers")
    for column in ("executor", "wall s", "sum of job s (ledger)"):
        table.add_column(column, justify="right" if column != "executor" else "left")
    table.add_row("local (1 process)", f"{local:.1f}", f"{local_jobs:.1f}")
    table.add_row(f"ray ({args.workers} workers x 1 CPU)", f"{on_ray:.1f}", f"{ray_jobs:.1f}")
    console.print(table)
    console.print(f"ray / local wall time: x{local / on_ray:.2f} faster" if on_ray < local
                  else f"ray / local wall time: x{on_ray / local:.2f} slower")
    console.print(f"Ray start-up: ray.init {ray_init:.1f} s, {args.workers} workers ready (TensorFlow imported) "
                  f"{workers_ready:.1f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "jobs": args.only, "workers": args.workers, "epochs": args.epochs, "rows": args.rows, "cpus": os.cpu_count(),
        "local_wall_s": round(local, 2), "ray_wall_s": round(on_ray, 2), "speedup": round(local / on_ray, 3),
        "local_job_s": round(local_jobs, 2), "ray_job_s": round(ray_jobs, 2),
        "ray_init_s": round(ray_init, 2), "ray_workers_ready_s": round(workers_ready, 2),
    }, indent=1))
    console.print(f"written {args.json}")


if __name__ == "__main__":
    main()
