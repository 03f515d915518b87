"""Packed training vs one job at a time, on Keras's JAX backend: samples/s of a family's training step.

  make bench-pack
  python benchmarks/bench_pack.py --family v7 --ks 1 8 40 160 --steps 30
  python benchmarks/bench_pack.py --family quickstart --ks 1 4 --steps 5    # a quick look

The family's own model (configs/FAMILY.yaml, trainer.model.models.build_network, float32) on random windows of its
shapes: (a) one job, Keras's `fit` on JAX (jit), the way one trains one job at a time; (b) K jobs packed
(trainer.model.packed.Pack: one vmapped step, each job its own batch, Adam and callbacks), for each K of --ks.
Each is timed over a whole epoch of --steps batches per job after an untimed one (compilation), the best of
--repeats; samples/s counts every job's samples. Imports no TensorFlow: it runs on a JAX-only GPU machine from a
checkout with its pure-Python dependencies beside it (../shared/docs/gpu.md says how). The device is named in the
output and the JSON. On a CPU packing gains little (../shared/docs/gpu.md); it is for accelerators.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
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
from trainer.heads import HAR_INPUTS
from trainer.model.models import build_network
from trainer.model.packed import Pack, PackedJob

RESULTS = Path(__file__).resolve().parent / "results" / "pack.json"


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="v7", help="a bundled config or a YAML path (default v7)")
    parser.add_argument("--ks", type=int, nargs="+", help="pack sizes (default 1 8 40 160 on an accelerator, "
                        "1 4 on a CPU)")
    parser.add_argument("--batch", type=int, help="batch size per job (default the config's train.batch_size)")
    parser.add_argument("--steps", type=int, default=20, help="batches per job in a timed epoch (default 20)")
    parser.add_argument("--repeats", type=int, default=2, help="timed epochs, the best counts (default 2)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = parser.parse_args(argv)
    accelerator = jax.default_backend() != "cpu"
    ks = args.ks or ([1, 8, 40, 160] if accelerator else [1, 4])
    batch = args.batch or load_config(args.family).train.batch_size
    results = {"date": time.strftime("%Y-%m-%d"), "device": device_name(), "family": args.family, "batch": batch,
               "steps": args.steps, "packed": {}}
    print(f"bench-pack: {args.family}, batch {batch} per job, {args.steps} steps an epoch, on {results['device']}")
    results["one_job_fit_samples_s"] = alone = one_job(args.family, batch, args.steps, args.repeats)
    print(f"  one job, Keras fit on JAX: {alone:,.0f} samples/s", flush=True)
    for k in ks:
        rate = packed(args.family, k, batch, args.steps, args.repeats)
        results["packed"][str(k)] = {"samples_s": rate, "vs_one_job": rate / alone}
        print(f"  K = {k:>3} packed: {rate:,.0f} samples/s ({rate / alone:.2f}x one job)", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))  # as it goes: a run cut short keeps what it measured
    print(f"written: {args.json}")
    return results


if __name__ == "__main__":
    main()
