"""Packed training vs one job at a time, on Keras's JAX backend: samples/s of a family's training step.

  make bench-pack
  python benchmarks/bench_pack.py --family v7 --ks 1 8 40 160 --steps 30 --data ../shared/data/ohlcv
  python benchmarks/bench_pack.py --family quickstart --ks 1 4 --steps 5    # a quick look

The family's own model (configs/FAMILY.yaml, trainer.model.models.build_network, float32) on random windows of its
shapes: (a) one job, Keras's `fit` on JAX (jit), the way one trains one job at a time; (b) K jobs packed
(trainer.model.packed.Pack: one vmapped step, each job its own batch, Adam and callbacks), for each K of --ks.
Each is timed over a whole epoch of --steps batches per job after an untimed one (compilation), the best of
--repeats; samples/s counts every job's samples. (c) With TensorFlow installed, the product's one-job training
step (benchmarks/bench_throughput.py in a process of its own, the same family and batch). (d) With --data, a whole
family's epoch on real candles: every job of the family whose candles are there (its windows, as `run` makes
them), packed together, one epoch timed after an untimed one (early stopping off), and the family's train.epochs
at that rate. Imports no TensorFlow: it runs on a JAX-only GPU machine from a checkout with its pure-Python
dependencies beside it (../shared/docs/gpu.md says how). The device is named in the output and the JSON. On a CPU
packing gains little (../shared/docs/gpu.md); it is for accelerators.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "jax"  # before Keras loads
try:
    import jax
except ImportError:
    sys.exit("bench-pack runs on Keras's JAX backend, and JAX is not installed: pip install 'cryptotrain[jax]'")
import keras
import numpy as np

from trainer.config import load_config
from trainer.errors import JobError
from trainer.heads import HAR_INPUTS
from trainer.model.models import build_network, output_shapes
from trainer.model.packed import Pack, PackedJob, windows_job
from trainer.model.settings import INFERENCE_BATCH_SIZE
from trainer.run.jobs import make_jobs
from trainer.run.pipeline import prepare

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "pack.json"


def device_name() -> str:
    """The accelerator's kind (e.g. "gpu: NVIDIA H100 80GB HBM3"), or the CPU's model and core count."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        return f"{device.platform}: {device.device_kind}"
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return f"cpu: {names[0] if names else platform.machine()}, {len(os.sched_getaffinity(0))} cores"


def build(family: str) -> keras.Model:
    cfg = load_config(family)
    keras.utils.set_random_seed(cfg.train.seed)
    model, _ = build_network(cfg.network, cfg.train)
    model.jit_compile = True  # Keras's fit on JAX runs eagerly without it (~100x slower)
    return model


def random_job(model: keras.Model, samples: int, seed: int) -> tuple[dict, dict]:
    """Windows (and a HAR head's positive forecasts) and targets of the model's shapes."""
    rng = np.random.default_rng(seed)
    inputs = model.input if isinstance(model.input, dict) else {"inputs": model.input}
    x = {name: rng.standard_normal((samples, *t.shape[1:]), dtype=np.float32) for name, t in inputs.items()}
    x = {name: np.abs(v) + 0.1 if name in HAR_INPUTS else v for name, v in x.items()}
    y = {name: rng.standard_normal((samples, *t.shape[1:]), dtype=np.float32) for name, t in model.output.items()}
    return (x if isinstance(model.input, dict) else x["inputs"]), y


def one_job(family: str, batch: int, steps: int, repeats: int) -> float:
    """Samples/s of Keras's fit on JAX, one job: the best epoch of `repeats` after the first."""
    model = build(family)
    x, y = random_job(model, batch * steps, seed=0)
    best = float("inf")
    for _ in range(repeats + 1):  # the first compiles
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=True, verbose=0)
        best = min(best, time.perf_counter() - start)
    return batch * steps / best


def packed(family: str, k: int, batch: int, steps: int, repeats: int) -> float:
    """Samples/s of K jobs packed: the best epoch of `repeats` after the first (validation: one batch each)."""
    model = build(family)
    jobs = [PackedJob(f"job{j}", *random_job(model, batch * steps, seed=j), *random_job(model, batch, seed=10_000 + j),
                      seed=j) for j in range(k)]
    pack = Pack(model, jobs, batch, batch)
    best = float("inf")
    for epoch in range(repeats + 1):  # the first compiles
        start = time.perf_counter()
        pack.train(epoch + 1)
        best = min(best, time.perf_counter() - start)
    return k * batch * steps / best


def tensorflow_step(family: str, batch: int) -> float | None:
    """Samples/s of the product's one-job training step (TensorFlow: bench_throughput.py, in a process of its own),
    or None where TensorFlow is not installed or the family is not one bench_throughput measures."""
    try:
        import importlib.util
        if importlib.util.find_spec("tensorflow") is None:
            return None
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "throughput.json"
        result = subprocess.run([sys.executable, str(BENCH_DIR / "bench_throughput.py"), "--families", family,
                                 "--batch-sizes", str(batch), "--budget", "0.5", "--repeats", "3", "--no-variants",
                                 "--peak-repeats", "1", "--json", str(out)],
                                env={**os.environ, "KERAS_BACKEND": "tensorflow"}, capture_output=True, text=True)
        if result.returncode != 0:
            return None
        [measured] = json.loads(out.read_text())["families"]
        return measured["by_batch_size"][0]["samples_per_s"]


def family_epoch(family: str, data: Path, cache: Path, max_jobs: int | None, epochs: int) -> dict:
    """A whole family's epoch on real candles: its jobs (at most max_jobs) with their windows as `run` makes them,
    packed together; the second epoch timed (the first compiles); and `epochs` of them."""
    cfg = load_config(family, [f"data.local.path={data}", "data.source=local", f"cache_dir={cache}"])
    model = build(family)
    jobs, failed = [], []
    for job in make_jobs(cfg)[:max_jobs]:
        try:
            windows = prepare(cfg, job, output_shapes(model, cfg.heads)).windows
        except (JobError, OSError) as exc:  # e.g. a series without the market input's reference candles
            failed.append(f"{job.name}: {exc}")
            continue
        jobs.append(windows_job(job.name, windows, cfg.train.seed))
    pack = Pack(model, jobs, cfg.train.batch_size, INFERENCE_BATCH_SIZE)
    pack.train(1)  # compiles
    start = time.perf_counter()
    pack.train(2)
    seconds = time.perf_counter() - start
    windows = sum(len(next(iter(job.y_train.values()))) for job in jobs)
    return {"jobs": len(jobs), "failed": failed, "epoch_s": seconds, "train_windows": windows,
            "epochs": epochs, "family_s": seconds * epochs}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="v7", help="a bundled config or a YAML path (default v7)")
    parser.add_argument("--ks", type=int, nargs="+", help="pack sizes (default 1 8 40 160 on an accelerator, "
                        "1 4 on a CPU)")
    parser.add_argument("--batch", type=int, help="batch size per job (default the config's train.batch_size)")
    parser.add_argument("--steps", type=int, default=20, help="batches per job in a timed epoch (default 20)")
    parser.add_argument("--repeats", type=int, default=2, help="timed epochs, the best counts (default 2)")
    parser.add_argument("--tensorflow", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the product's TensorFlow step where TensorFlow is installed (default on)")
    parser.add_argument("--data", type=Path, help="candles (a directory of SYMBOL_TF.csv.gz files, e.g. "
                        "../shared/data/ohlcv): also time a whole family's epoch, packed, on them")
    parser.add_argument("--max-jobs", type=int, help="at most this many of the family's jobs in --data's epoch")
    parser.add_argument("--family-epochs", type=int, default=40, help="the epochs a whole family's time is given "
                        "for, early stopping off (default 40)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = parser.parse_args(argv)
    accelerator = jax.default_backend() != "cpu"
    ks = args.ks or ([1, 8, 40, 160] if accelerator else [1, 4])
    batch = args.batch or load_config(args.family).train.batch_size
    results = {"date": time.strftime("%Y-%m-%d"), "device": device_name(), "family": args.family, "batch": batch,
               "steps": args.steps, "packed": {}}
    print(f"bench-pack: {args.family}, batch {batch} per job, {args.steps} steps an epoch, on {results['device']}")
    results["one_job_tensorflow_samples_s"] = tf_rate = tensorflow_step(args.family, batch) if args.tensorflow \
        else None
    if tf_rate is not None:
        print(f"  one job, the product's TensorFlow step (bench_throughput): {tf_rate:,.0f} samples/s", flush=True)
    results["one_job_fit_samples_s"] = alone = one_job(args.family, batch, args.steps, args.repeats)
    print(f"  one job, Keras fit on JAX: {alone:,.0f} samples/s", flush=True)
    for k in ks:
        rate = packed(args.family, k, batch, args.steps, args.repeats)
        results["packed"][str(k)] = {"samples_s": rate, "vs_one_job": rate / alone,
                                     "vs_tensorflow": None if tf_rate is None else rate / tf_rate}
        vs_tf = "" if tf_rate is None else f", {rate / tf_rate:.2f}x the TensorFlow step"
        print(f"  K = {k:>3} packed: {rate:,.0f} samples/s ({rate / alone:.2f}x one job on JAX{vs_tf})", flush=True)
        write(args.json, results)
    if args.data is not None:
        with tempfile.TemporaryDirectory(prefix="bench-pack-") as cache:
            epoch = results["family_epoch"] = family_epoch(args.family, args.data.resolve(), Path(cache),
                                                           args.max_jobs, args.family_epochs)
        print(f"  a whole family's epoch, {epoch['jobs']} jobs packed ({epoch['train_windows']:,} train windows): "
              f"{epoch['epoch_s']:.1f} s; its {epoch['epochs']} epochs: {epoch['family_s'] / 60:.1f} min"
              + (f" ({len(epoch['failed'])} jobs could not be framed: {epoch['failed'][0]} ...)" if epoch["failed"]
                 else ""), flush=True)
        write(args.json, results)
    print(f"written: {args.json}")
    return results


def write(path: Path, results: dict) -> None:
    """As it goes: a run cut short keeps what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
