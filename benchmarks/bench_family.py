"""A family's run end to end, `cryptotrain run -c FAMILY` as a user runs it, and where its time goes.

  make bench-family                                      # V7, 4 jobs of the bundled candles, 3 epochs, --pack auto
  python benchmarks/bench_family.py --family quickstart --epochs 2
  python benchmarks/bench_family.py --family v7 --data ../shared/data/ohlcv --max-jobs 40 --epochs 40 --pack auto
  python benchmarks/bench_family.py --family v7 --data ../shared/data/ohlcv --max-jobs 8 --epochs 1 --pack 8 \
      --host-compare --no-alone                          # host work on every core against one job at a time

One `cryptotrain run` in a process of its own (a fresh run directory and feature cache: nothing is cached from
before), early stopping off so that every job trains --epochs epochs, then its phases, from the run's timing.json
(trainer.run.runner.DeviceTime: what the device waited for, wall time) and each job's metrics.json ("timing":
trainer.evaluation.results.Timing), and the process's wall time:

  prepare   the device waiting for jobs: candles -> features -> windows, the baselines fitted on the train split
  compile   what the first epoch of each model (TensorFlow: each shape; packed: each pack) took beyond a later one:
            tracing and compiling its train and validation steps
  train     the epochs, that excepted (per epoch: the sum over the models trained)
  build & forecast  the device's other work: a pack's windows put on it and its warm starts, the trained models'
            forecasts of the validation and test splits
  evaluate  the device waiting for trained jobs' scores, what is served, their files made
  write     the device waiting for each job's directory written and committed, the ledger told
  rest      the process's start and imports, the model's build, and anything else

`overhead_share` is the share of the total outside the training epochs (1 - train / total). `--host-compare` runs the
same again with `--host-workers 1` (every job's host work one at a time, in the run's process): prepare + evaluate +
write of both side by side, and whether every job's figures are the same bit for bit (metrics.json but its timings,
predictions.npz, preprocessing.json, history.csv, har.json, harx.json). Then, unless --no-alone, the one-job rate on
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
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HF_HUB_OFFLINE": "1"}


def family_config(family: str, data: Path, epochs: int, run_dir: Path, cache: Path) -> dict:
    """The family's config (configs/FAMILY.yaml) on `data`, `epochs` epochs without early stopping, its run
    directory and feature cache fresh. Its symbols are those of its list with candles in `data` (the runs narrow
    the jobs with --only): a market input over the run's symbols keeps its references whatever the subset trained."""
    raw = yaml.safe_load((REPO / "configs" / f"{family}.yaml").read_text())
    pattern = raw["data"].get("local", {}).get("pattern", "{symbol}_{timeframe}.csv.gz")
    symbols = [symbol for symbol in raw["data"]["symbols"]
               if any((data / pattern.format(symbol=symbol, timeframe=timeframe)).is_file()
                      for timeframe in raw["data"]["timeframes"])]
    raw["data"] |= {"source": "local", "symbols": symbols,
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


def timed_run(config: dict, scratch: Path, name: str, jobs: list[str], *options: str) -> Run:
    """`cryptotrain run` of `config` on `jobs` in a process of its own: its wall time, each job's metrics, and the
    run's timing.json."""
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
    run_dir = Path(config["output_dir"])
    return Run(wall, [json.loads((run_dir / "jobs" / job / "metrics.json").read_text()) for job in jobs],
               json.loads((run_dir / "timing.json").read_text()), run_dir)


@dataclass(frozen=True)
class Run:
    wall: float
    metrics: list[dict]
    timing: dict  # the run's timing.json
    run_dir: Path


def training(metrics: list[dict]) -> dict:
    """The training phases in seconds, from the jobs' timing: the models trained are each job alone, or each pack
    (its jobs share its epochs: counted once)."""
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
    return {"compile": compile_s, "train": sum(per_epoch), "epochs": per_epoch, "models": len(models)}


PHASES = ("prepare", "compile", "train", "build & forecast", "evaluate", "write", "rest")


def phases(run: Run) -> dict:
    """The run's phases in seconds (the module's docstring)."""
    found = training(run.metrics)
    timing = run.timing
    found |= {"prepare": timing["preparing"], "evaluate": timing["evaluating"], "write": timing["writing"],
              "build & forecast": max(0.0, timing["training"] - found["compile"] - found["train"])}
    found["rest"] = run.wall - sum(found[name] for name in PHASES[:-1])
    return found | {"total_seconds": run.wall, "overhead_share": 1 - found["train"] / run.wall}


def host_seconds(found: dict) -> float:
    """What the device waited for the host: prepare + evaluate + write."""
    return found["prepare"] + found["evaluate"] + found["write"]


def rate(metrics: list[dict], seconds: float) -> float:
    """Training windows a second: every job's windows times its epochs, over `seconds`."""
    return sum(m["timing"]["train_windows"] * len(m["timing"]["epochs"]) for m in metrics) / seconds


def one_job_rate(metrics: dict | None) -> float | None:
    """A job trained alone: its training windows a second, its compilation excepted (None: not run, --no-alone)."""
    return None if metrics is None else rate([metrics], training([metrics])["train"])


# A job's files compared bit for bit by --host-compare (model.keras holds the time it was saved; its weights are
# what predictions.npz was forecast with)
COMPARED = ("predictions.npz", "preprocessing.json", "history.csv", "har.json", "harx.json")
TIMINGS = ("seconds", "train_step_seconds", "rss_mb", "timing")


def differences(one: Run, other: Run) -> list[str]:
    """The jobs' figures that differ between two runs of the same jobs: metrics.json but its timings, and COMPARED."""
    found = []
    for a, b in zip(one.metrics, other.metrics, strict=True):
        if {k: v for k, v in a.items() if k not in TIMINGS} != {k: v for k, v in b.items() if k not in TIMINGS}:
            found.append(f"{a['job']}/metrics.json")
        for name in COMPARED:
            this, that = (run.run_dir / "jobs" / a["job"] / name for run in (one, other))
            if this.exists() != that.exists() or this.exists() and this.read_bytes() != that.read_bytes():
                found.append(f"{a['job']}/{name}")
    return found


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
    parser.add_argument("--host-compare", action="store_true",
                        help="run it again with --host-workers 1 (each job's host work one at a time): the host "
                             "phases side by side, and whether the figures are the same bit for bit")
    parser.add_argument("--no-alone", action="store_true",
                        help="skip the one-job reference runs (the first job alone at K = 1, and on TensorFlow): on a "
                             "lent GPU they would double the device time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run, as `cryptotrain run --set` takes it")
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

        def fresh(name: str) -> dict:  # a run directory and caches of its own: nothing computed before is reused
            return family_config(args.family, data, args.epochs, scratch / name / "run", scratch / name / "cache")

        console.print(f"{args.family}: {len(jobs)} jobs ({', '.join(jobs)}), {args.epochs} epochs, --pack "
                      f"{args.pack}, candles from {data}")
        run = timed_run(fresh("family"), scratch, "family", jobs, "--pack", args.pack, *overrides)
        engine = run.metrics[0]["engine"]
        serial = None
        if args.host_compare:
            serial = timed_run(fresh("serial"), scratch, "serial", jobs, "--pack", args.pack, "--host-workers", "1",
                               *overrides)
            changed = differences(run, serial)
        one = on_tensorflow = None
        if not args.no_alone:
            # the one-job rate on the same engine: the first job alone, K = 1 (the same config: its market input
            # reads the other series' candles); a run of one job at K = 1 was that run already
            if len(jobs) == 1 and engine["jobs"] == 1:
                [one] = run.metrics
            else:
                [one] = timed_run(fresh("alone"), scratch, "alone", jobs[:1],
                                  *(["--pack", "1"] if engine["name"] == "jax" else []), *overrides).metrics
            on_tensorflow = one if engine["name"] == "tensorflow" else None
            if on_tensorflow is None and importlib.util.find_spec("tensorflow") is not None:
                [on_tensorflow] = timed_run(fresh("tensorflow"), scratch, "tensorflow", jobs[:1], *overrides).metrics

    found = phases(run)
    wall = run.wall
    alone, tensorflow_rate = one_job_rate(one), one_job_rate(on_tensorflow)
    results = {
        "family": args.family, "data": str(data), "jobs": jobs, "epochs": args.epochs, "pack": args.pack,
        "engine": engine, "versions": versions(), "cpus": len(os.sched_getaffinity(0)),
        "host_workers": run.timing["host_workers"],
        **{f"{name.replace(' & ', '_')}_seconds": round(found[name], 2) for name in PHASES},
        "epoch_seconds": [round(s, 2) for s in found["epochs"]], "total_seconds": round(found["total_seconds"], 2),
        "overhead_share": round(found["overhead_share"], 4), "models_trained": found["models"],
        "windows_per_s": round(rate(run.metrics, found["train"]), 1),
        "one_job_windows_per_s": alone and round(alone, 1),
        "one_job_tensorflow_windows_per_s": tensorflow_rate and round(tensorflow_rate, 1),
    }
    table = Table(title=f"{args.family}: {len(jobs)} jobs x {args.epochs} epochs on {engine['name']} "
                        f"({engine['jobs']} at a time, {engine['precision']}, {engine['device']}; host work on "
                        f"{run.timing['host_workers']} worker{'s' * (run.timing['host_workers'] > 1)})")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    if serial is not None:
        one_at_a_time = phases(serial)
        table.add_column("one at a time (s)", justify="right")
    for name in PHASES:
        table.add_row(name, f"{found[name]:.1f}", f"{found[name] / wall:.0%}",
                      *([f"{one_at_a_time[name]:.1f}"] if serial is not None else []))
    table.add_row("total", f"{wall:.1f}", "100%", *([f"{serial.wall:.1f}"] if serial is not None else []))
    console.print(table)
    console.print("train per epoch (s): " + ", ".join(f"{s:.1f}" for s in found["epochs"]))
    console.print(f"outside the training epochs: {found['overhead_share']:.0%} of the total")
    if serial is not None:
        speedup = host_seconds(one_at_a_time) / host_seconds(found)
        results["host_compare"] = {
            "one_at_a_time": {f"{name.replace(' & ', '_')}_seconds": round(one_at_a_time[name], 2)
                              for name in PHASES} | {"total_seconds": round(serial.wall, 2)},
            "host_seconds": round(host_seconds(found), 2), "one_at_a_time_host_seconds":
                round(host_seconds(one_at_a_time), 2), "speedup": round(speedup, 2), "differences": changed}
        console.print(f"prepare + evaluate + write: {host_seconds(found):.1f} s on {run.timing['host_workers']} host "
                      f"workers, {host_seconds(one_at_a_time):.1f} s one job at a time: x{speedup:.2f}; figures "
                      + ("the same bit for bit" if not changed else f"DIFFERENT: {', '.join(changed)}"))
    console.print(f"training windows/s (compilation excepted): the run {results['windows_per_s']:.0f}" +
                  ("" if alone is None else f"; one job alone on the same engine {alone:.0f} (the run: "
                                            f"x{results['windows_per_s'] / alone:.2f})"))
    if tensorflow_rate is not None:
        console.print(f"one job alone on TensorFlow: {tensorflow_rate:.0f} windows/s")
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    out = args.json or BENCH_DIR / "results" / f"family-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"written {out}")


if __name__ == "__main__":
    main()
