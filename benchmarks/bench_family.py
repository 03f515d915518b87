"""A family's run end to end, `cryptotrain run -c FAMILY` as a user runs it, and where its time goes.

  make bench-family                                      # V7, 4 jobs of the bundled candles, 3 epochs, --pack auto
  python benchmarks/bench_family.py --family quickstart --epochs 2
  python benchmarks/bench_family.py --family v7 --data ../shared/data/ohlcv --max-jobs 40 --epochs 40 --pack auto

One `cryptotrain run` in a process of its own (a fresh run directory and feature cache: nothing is cached from
before), early stopping off so that every job trains --epochs epochs, then the phases from each job's
metrics.json ("timing": trainer.evaluation.results.Timing) and the process's wall time:

  prepare   candles -> features -> windows, the baselines fitted on the train split (every job)
  compile   what the first epoch of each model (TensorFlow: each shape; packed: each pack) took beyond a later one:
            tracing and compiling its train and validation steps
  train     the epochs, that excepted (per epoch: the sum over the models trained)
  evaluate  the forecasts of the validation and test splits, scores, what is served
  rest      the process's start and imports, writing each job's directory, the ledger, and anything else

`overhead_share` is the share of the total outside the training epochs (1 - train / total). Then the one-job rate on
the same engine: a run of the first job alone at K = 1 (packed runs: `--pack 1`, Keras on JAX; a run of one job at
K = 1 is that run already), its training windows a second against the whole run's; and, where TensorFlow is installed,
that job alone on TensorFlow's. The device, precision and the versions of jax, jaxlib and keras are printed and
written to the JSON (default benchmarks/results/family-FAMILY.json; a dated copy under benchmarks/records/ is how
figures are kept). Imports no TensorFlow: it runs on a JAX-only machine from a checkout with its pure-Python
dependencies beside it.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
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
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HF_HUB_OFFLINE": "1"}


def family_config(family: str, data: Path, jobs: list[str], epochs: int, run_dir: Path, cache: Path) -> dict:
    """The family's config (configs/FAMILY.yaml) on `data`, its jobs narrowed to `jobs`, `epochs` epochs without
    early stopping, its run directory and feature cache fresh."""
    raw = yaml.safe_load((REPO / "configs" / f"{family}.yaml").read_text())
    symbols = list(dict.fromkeys(job.rpartition("_")[0] for job in jobs))
    timeframes = list(dict.fromkeys(job.rpartition("_")[2] for job in jobs))
    raw["data"] |= {"source": "local", "symbols": symbols, "timeframes": timeframes,
                    "local": {**raw["data"].get("local", {}), "path": str(data)}}
    raw["train"] |= {"epochs": epochs, "early_stopping": None}
    return raw | {"output_dir": str(run_dir), "cache_dir": str(cache)}


def family_jobs(family: str, data: Path, max_jobs: int) -> list[str]:
    """The family's first `max_jobs` jobs whose candles are in `data`, in its own order."""
    raw = yaml.safe_load((REPO / "configs" / f"{family}.yaml").read_text())
    pattern = raw["data"].get("local", {}).get("pattern", "{symbol}_{timeframe}.csv.gz")
    jobs = [f"{symbol}_{timeframe}" for symbol in raw["data"]["symbols"] for timeframe in raw["data"]["timeframes"]
            if (data / pattern.format(symbol=symbol, timeframe=timeframe)).is_file()]
    return jobs[:max_jobs]


def timed_run(config: dict, scratch: Path, name: str, jobs: list[str], *options: str) -> tuple[float, list[dict]]:
    """`cryptotrain run` of `config` on `jobs` in a process of its own: its wall time, and each job's metrics."""
    path = scratch / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    only = [arg for job in jobs for arg in ("--only", job)]
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "trainer", "run", "--config", str(path), *only, *options],
                            cwd=REPO, env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"cryptotrain run {' '.join(options)} failed (exit {result.returncode}):\n"
                         f"{result.stderr[-3000:]}")
    jobs_dir = Path(config["output_dir"]) / "jobs"
    return wall, [json.loads((jobs_dir / job / "metrics.json").read_text()) for job in jobs]


def phases(wall: float, metrics: list[dict]) -> dict:
    """The run's phases in seconds (the module's docstring), from its jobs' timing; the models trained are each job
    alone, or each pack (its jobs share its epochs: counted once)."""
    models = {}
    for m in metrics:
        timing = m["timing"]
        key = (m["job"],) if m["engine"]["jobs"] == 1 else tuple(timing["epochs"])  # a pack's jobs: one model
        models.setdefault(key, timing["epochs"])
    compile_s = sum(max(0.0, epochs[0] - statistics.median(epochs[1:])) for epochs in models.values()
                    if len(epochs) > 1)
    longest = max(len(epochs) for epochs in models.values())
    per_epoch = [sum(epochs[i] for epochs in models.values() if i < len(epochs)) for i in range(longest)]
    per_epoch[0] -= compile_s
    prepare = sum(m["timing"]["prepare"] + m["timing"]["windows"] for m in metrics)
    evaluate = sum(m["timing"]["evaluate"] for m in metrics)
    train = sum(per_epoch)
    return {"prepare": prepare, "compile": compile_s, "train": train, "epochs": per_epoch, "evaluate": evaluate,
            "rest": wall - prepare - compile_s - train - evaluate, "total_seconds": wall,
            "overhead_share": 1 - train / wall, "models": len(models)}


def rate(metrics: list[dict], seconds: float) -> float:
    """Training windows a second: every job's windows times its epochs, over `seconds`."""
    return sum(m["timing"]["train_windows"] * len(m["timing"]["epochs"]) for m in metrics) / seconds


def versions() -> dict:
    found = {}
    for package in ("keras", "jax", "jaxlib", "tensorflow"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="v7", help="a config of configs/ (default v7)")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "ohlcv",
                        help="a directory of SYMBOL_TIMEFRAME.csv.gz (default: the bundled candles; "
                             "../shared/data/ohlcv for the 48 series)")
    parser.add_argument("--max-jobs", type=int, default=4, help="the family's first N jobs found in --data")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every job (early stopping off)")
    parser.add_argument("--pack", default="auto", help="auto or K, as `cryptotrain run --pack` takes it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both runs, as `cryptotrain run --set` takes it")
    parser.add_argument("--json", type=Path, help="where to write the figures (default "
                                                  "benchmarks/results/family-FAMILY.json)")
    args = parser.parse_args(argv)
    console = Console()
    data = args.data.resolve()
    jobs = family_jobs(args.family, data, args.max_jobs)
    if not jobs:
        raise SystemExit(f"bench-family: no candles of the {args.family} family's jobs in {data}; nothing measured")
    overrides = [arg for item in args.set for arg in ("--set", item)]
    with tempfile.TemporaryDirectory(prefix="bench-family-") as scratch:
        scratch = Path(scratch)
        config = family_config(args.family, data, jobs, args.epochs, scratch / "run", scratch / "cache")
        console.print(f"{args.family}: {len(jobs)} jobs ({', '.join(jobs)}), {args.epochs} epochs, --pack "
                      f"{args.pack}, candles from {data}")
        wall, metrics = timed_run(config, scratch, "family", jobs, "--pack", args.pack, *overrides)
        engine = metrics[0]["engine"]
        # the one-job rate on the same engine: the first job alone, K = 1 (the same config: its market input reads the
        # other jobs' candles); a run of one job at K = 1 was that run already
        if len(jobs) == 1 and engine["jobs"] == 1:
            [one] = metrics
        else:
            alone = family_config(args.family, data, jobs, args.epochs, scratch / "alone", scratch / "cache")
            _, [one] = timed_run(alone, scratch, "alone", jobs[:1],
                                 *(["--pack", "1"] if engine["name"] == "jax" else []), *overrides)
        on_tensorflow = one if engine["name"] == "tensorflow" else None
        if on_tensorflow is None and importlib.util.find_spec("tensorflow") is not None:
            tensorflow = family_config(args.family, data, jobs, args.epochs, scratch / "tensorflow",
                                       scratch / "cache")
            _, [on_tensorflow] = timed_run(tensorflow, scratch, "tensorflow", jobs[:1], *overrides)

    found = phases(wall, metrics)
    alone = rate([one], phases(sum(one["timing"]["epochs"]), [one])["train"])
    tensorflow_rate = None if on_tensorflow is None else \
        rate([on_tensorflow], phases(sum(on_tensorflow["timing"]["epochs"]), [on_tensorflow])["train"])
    results = {
        "family": args.family, "data": str(data), "jobs": jobs, "epochs": args.epochs, "pack": args.pack,
        "engine": engine, "versions": versions(), "cpus": len(os.sched_getaffinity(0)),
        **{f"{name}_seconds": round(found[name], 2) for name in ("prepare", "compile", "train", "evaluate", "rest")},
        "epoch_seconds": [round(s, 2) for s in found["epochs"]], "total_seconds": round(found["total_seconds"], 2),
        "overhead_share": round(found["overhead_share"], 4), "models_trained": found["models"],
        "windows_per_s": round(rate(metrics, found["train"]), 1),
        "one_job_windows_per_s": round(alone, 1),
        "one_job_tensorflow_windows_per_s": None if tensorflow_rate is None else round(tensorflow_rate, 1),
    }
    table = Table(title=f"{args.family}: {len(jobs)} jobs x {args.epochs} epochs on {engine['name']} "
                        f"({engine['jobs']} at a time, {engine['precision']}, {engine['device']})")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for name in ("prepare", "compile", "train", "evaluate", "rest"):
        table.add_row(name, f"{found[name]:.1f}", f"{found[name] / wall:.0%}")
    table.add_row("total", f"{wall:.1f}", "100%")
    console.print(table)
    console.print("train per epoch (s): " + ", ".join(f"{s:.1f}" for s in found["epochs"]))
    console.print(f"outside the training epochs: {found['overhead_share']:.0%} of the total")
    console.print(f"training windows/s (compilation excepted): the run {results['windows_per_s']:.0f}; one job "
                  f"alone on the same engine {alone:.0f} (the run: x{results['windows_per_s'] / alone:.2f})")
    if tensorflow_rate is not None:
        console.print(f"one job alone on TensorFlow: {tensorflow_rate:.0f} windows/s")
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    out = args.json or BENCH_DIR / "results" / f"family-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"written {out}")


if __name__ == "__main__":
    main()
