"""Training throughput of each family's model shape on this machine: samples/s, GFLOP/s, share of peak.

  make bench-throughput
  python benchmarks/bench_throughput.py --families v7 --batch-sizes 16 64 --budget 0.5
  python benchmarks/bench_throughput.py --families --repeats 10      # only the V7 settings, more rounds

For each family (configs/v7.yaml, v8_aligned.yaml, v8_stable.yaml) the real model (trainer.model.models.build_model,
float32) trains on synthetic random windows: one batch repeated from memory, so the input pipeline costs
nothing and only the train step is timed. Each figure is the best of --repeats timed `fit` calls of about
--budget seconds, after an untimed warm-up call (tracing, first steps). The rounds go over all batch sizes
(or settings) in turn, so that a burst of load from other processes does not favour one of them.

  GFLOP/s = samples/s x 3 x forward FLOPs per sample (trainer.model.flops: layer sizes, multiply-add = 2 FLOPs).
  Peak, measured:    best of 40 float32 2048x2048 tf.linalg.matmul, taken before and after the training runs
                     in a fresh process with TensorFlow's default threads (every CPU on the one op), i.e. what
                     TensorFlow's own kernels reach on this machine; on the GPU when there is one. TF32 is
                     off throughout (Ampere and later GPUs would otherwise run "float32" matmuls in TF32).
  Peak, theoretical: (CPU only) physical cores x clock (lscpu "CPU max MHz", else the nominal "cpu MHz") x float32
                     FLOPs per cycle per core from the SIMD flags, assuming two FMA pipes: AVX2+FMA 32,
                     AVX-512 64 (32 on AMD Zen 2-4, which run AVX-512 on 256-bit pipes). A clock that boosts
                     above the nominal MHz lets the measured peak exceed this one.

Then, for V7 at batch 16 and 128, whether XLA (jit_compile=True), steps_per_execution=8 or mixed_bfloat16
beat the default (float32, no XLA, one step per execution). Prints tables and writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.pool
import os
import subprocess
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
import keras
import numpy as np
import tensorflow as tf
from rich.console import Console
from rich.table import Table

from trainer.config import RunConfig, load_config
from trainer.heads import HAR_INPUTS
from trainer.model import device, machine
from trainer.model.flops import TRAINING_MULTIPLIER, flops_per_sample
from trainer.model.models import build_model

FAMILIES = ("v7", "v8_aligned", "v8_stable")
BATCH_SIZES = (16, 32, 64, 128, 256, 512)  # V7 and V8-aligned peak at 512 here (+10 % over 256)
VARIANT_BATCH_SIZES = (16, 128)  # V7's own, and one where the train step is compute-bound
MATMUL_SIZE = 2048
PEAK_REPEATS = 40  # ~2 s: the best of many, as a neighbour's burst of load can hide the peak from a few
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "throughput.json"
# Settings compared on V7: (label, train overrides, XLA); the first is the default.
VARIANTS = (
    ("float32 (default)", {}, False),
    ("jit_compile=True (XLA)", {}, True),
    ("steps_per_execution=8", {"steps_per_execution": 8}, False),
    ("mixed_bfloat16", {"precision": "mixed_bfloat16"}, False),
)
progress = Console(stderr=True, log_path=False)


# ----------------------------------------------------------------------------- peaks
def measured_peak_gflops(pool: multiprocessing.pool.Pool, repeats: int = PEAK_REPEATS) -> float:
    """Measured in a fresh process (`pool`'s one, started once: it imports TensorFlow once, before and after the
    training runs): this one's thread pools are sized for training (trainer.model.device gives each op half the
    CPUs), while the peak is what one matmul reaches on all of them."""
    return pool.apply(_matmul_gflops, (repeats,))


def _matmul_gflops(repeats: int) -> float:
    tf.config.experimental.enable_tensor_float_32_execution(False)
    a = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    b = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    matmul = tf.function(tf.linalg.matmul)
    matmul(a, b).numpy()
    best = min(_timed(lambda: matmul(a, b).numpy()) for _ in range(repeats))
    return 2 * MATMUL_SIZE**3 / best / 1e9


def theoretical_peak(cpus: int) -> dict | None:
    """cores x GHz x FLOPs/cycle from lscpu; None where lscpu or a clock figure is missing."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return None
    info = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    mhz = info.get("CPU max MHz") or info.get("CPU MHz") or _proc_cpuinfo_mhz()
    if not mhz:
        return None
    flops_per_cycle = _fp32_flops_per_cycle(set(info.get("Flags", "").split()), info)
    cores = max(1, cpus // int(info.get("Thread(s) per core", "1")))  # SMT siblings share the FMA pipes
    return {"gflops": cores * float(mhz) / 1e3 * flops_per_cycle, "cores": cores, "mhz": float(mhz),
            "flops_per_cycle": flops_per_cycle}


def _fp32_flops_per_cycle(flags: set[str], info: dict) -> int:
    if "avx512f" in flags:
        narrow = info.get("Vendor ID") == "AuthenticAMD" and int(info.get("CPU family", "0")) < 26  # before Zen 5
        return 32 if narrow else 64
    if {"avx2", "fma"} <= flags:
        return 32
    return 16 if "avx" in flags else 8


def _proc_cpuinfo_mhz() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return line.partition(":")[2].strip()
    return None


# ----------------------------------------------------------------------------- training throughput
@dataclass(frozen=True)
class Timing:
    budget_s: float  # length of one timed fit
    repeats: int  # timed fits per case; the best counts


def samples_per_second(cases: dict[Hashable, tuple[keras.Model, int]], timing: Timing) -> dict[Hashable, float]:
    """For each case (model, batch size): the best of timing.repeats timed fits, rounds interleaved."""
    fits: dict[Hashable, tuple[Callable[[int], None], int]] = {}
    best_step_s: dict[Hashable, float] = {}
    for key, (model, batch_size) in cases.items():
        fit, per_call = _fitter(model, batch_size), model.steps_per_execution
        fit(per_call)  # warm-up: traces the train step for this batch shape
        first = _timed(fit, per_call)
        fits[key] = fit, per_call * max(1, round(timing.budget_s / first))
        best_step_s[key] = first / per_call
    for _ in range(timing.repeats - 1):
        for key, (fit, steps) in fits.items():
            best_step_s[key] = min(best_step_s[key], _timed(fit, steps) / steps)
    return {key: batch_size / best_step_s[key] for key, (_, batch_size) in cases.items()}


def _fitter(model: keras.Model, batch_size: int) -> Callable[[int], None]:
    rng = np.random.default_rng(0)
    # The windows; with a HAR head, also HAR's forecasts of each step, positive scales as HAR's are
    inputs = model.input if isinstance(model.input, dict) else {"inputs": model.input}
    x = {name: rng.standard_normal((batch_size, *tensor.shape[1:]), dtype=np.float32)
         for name, tensor in inputs.items()}
    x = {name: np.abs(batch) + 0.1 if name in HAR_INPUTS else batch for name, batch in x.items()}
    y = {name: rng.standard_normal((batch_size, *tensor.shape[1:]), dtype=np.float32)
         for name, tensor in model.output.items()}
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    return lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)


def _timed(action: Callable[..., object], *args) -> float:
    start = time.perf_counter()
    action(*args)
    return time.perf_counter() - start


def build(cfg: RunConfig, jit_compile: bool = False) -> keras.Model:
    device.apply_precision(cfg.train.precision)
    keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg.network, cfg.train)
    model.jit_compile = jit_compile
    return model


def with_train(cfg: RunConfig, **train) -> RunConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


def family_throughput(name: str, batch_sizes: tuple[int, ...], timing: Timing) -> dict:
    keras.backend.clear_session()
    cfg = with_train(load_config(name), precision="float32")
    n_features = len(cfg.features.columns)
    model = build(cfg)
    sizes = sorted({cfg.train.batch_size, *batch_sizes})
    rates = samples_per_second({bs: (model, bs) for bs in sizes}, timing)
    progress.log(f"{name}: " + ", ".join(f"batch {bs} {rate:.0f}/s" for bs, rate in rates.items()))
    return {"family": name, "params": model.count_params(), "n_features": n_features,
            "forward_flops_per_sample": flops_per_sample(cfg.network), "family_batch_size": cfg.train.batch_size,
            "best_batch_size": max(rates, key=rates.get),
            "by_batch_size": [{"batch_size": bs, "samples_per_s": rate} for bs, rate in rates.items()]}


def add_achieved(family: dict, peaks: dict[str, float]) -> None:
    """GFLOP/s and fraction of each peak, per batch size."""
    for row in family["by_batch_size"]:
        row["gflops"] = row["samples_per_s"] * TRAINING_MULTIPLIER * family["forward_flops_per_sample"] / 1e9
        row.update({f"fraction_of_{kind}_peak": row["gflops"] / peak for kind, peak in peaks.items()})


def variant_throughput(batch_sizes: tuple[int, ...], timing: Timing) -> list[dict]:
    keras.backend.clear_session()
    cfg = load_config("v7")
    models = {label: build(with_train(cfg, **{"precision": "float32", **train}), jit_compile)
              for label, train, jit_compile in VARIANTS}
    device.apply_precision("float32")
    rates = samples_per_second({(label, bs): (model, bs) for label, model in models.items() for bs in batch_sizes},
                               timing)
    progress.log("v7 settings: " + ", ".join(f"{label} batch {bs} {rate:.0f}/s" for (label, bs), rate in rates.items()))
    default = {bs: rates[VARIANTS[0][0], bs] for bs in batch_sizes}
    return [{"setting": label, "batch_size": bs, "samples_per_s": rate, "speedup": rate / default[bs]}
            for (label, bs), rate in rates.items()]


# ----------------------------------------------------------------------------- report
def print_report(result: dict, console: Console) -> None:
    machine = result["machine"]
    theory = machine["theoretical_peak"]
    gpus = f", GPU: {', '.join(machine['gpus'])}" if machine["gpus"] else ""
    console.print(f"[bold]{machine['cpu']}[/], {machine['usable_cpus']} usable CPUs{gpus}, TensorFlow "
                  f"{machine['tensorflow']}; load average {machine['load_average_before']:.1f} before, "
                  f"{machine['load_average_after']:.1f} after (this run adds up to {machine['usable_cpus']})")
    no_theory = "n/a (a GPU's is not estimated here)" if machine["gpus"] else "n/a (lscpu gives no clock)"
    console.print(f"fp32 peak, measured ({MATMUL_SIZE}x{MATMUL_SIZE} matmul{' on the GPU' if gpus else ''}): "
                  f"{machine['measured_peak_gflops']:.0f} GFLOP/s; theoretical: "
                  + (f"{theory['cores']} cores x {theory['mhz'] / 1e3:.2f} GHz x {theory['flops_per_cycle']} "
                     f"FLOPs/cycle = {theory['gflops']:.0f} GFLOP/s" if theory else no_theory))

    table = Table(title="training, float32 (GFLOP/s = samples/s x 3 x forward FLOPs)", box=None,
                  pad_edge=False)
    for column in ("family", "params", "MFLOP", "batch", "samples/s", "GFLOP/s", "% meas.", "% theor."):
        table.add_column(column, justify="right")
    for family in result["families"]:
        own, best = family["family_batch_size"], family["best_batch_size"]
        shown = {own: "family", best: "best"} if own != best else {own: "family, best"}
        rows = [row for row in family["by_batch_size"] if row["batch_size"] in shown]
        for i, row in enumerate(rows):
            theoretical = row.get("fraction_of_theoretical_peak")
            table.add_row(*([family["family"], f"{family['params'] / 1e6:.2f} M",
                             f"{family['forward_flops_per_sample'] / 1e6:.1f}"] if i == 0 else ["", "", ""]),
                          f"{row['batch_size']} {shown[row['batch_size']]}", f"{row['samples_per_s']:.0f}",
                          f"{row['gflops']:.1f}", f"{100 * row['fraction_of_measured_peak']:.0f} %",
                          f"{100 * theoretical:.0f} %" if theoretical else "n/a")
    if result["families"]:
        console.print(table)
        console.print("MFLOP: forward, per sample; all batch sizes are in the JSON.")

    if not result["variants"]:
        return
    variants = Table(title="V7: settings against the default")
    for column in ("setting", "batch", "samples/s", "speed-up"):
        variants.add_column(column, justify="right")
    for row in result["variants"]:
        variants.add_row(row["setting"], str(row["batch_size"]), f"{row['samples_per_s']:.0f}",
                         f"x{row['speedup']:.2f}")
    console.print(variants)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES))
    parser.add_argument("--budget", type=float, default=0.6, help="seconds per timed fit (default 0.6)")
    parser.add_argument("--repeats", type=int, default=5, help="timed fits per figure, the best counts (default 5)")
    parser.add_argument("--variants", action=argparse.BooleanOptionalAction, default=True,
                        help="also compare V7's settings (XLA, steps_per_execution, bfloat16) (default: yes)")
    parser.add_argument("--peak-repeats", type=int, default=PEAK_REPEATS,
                        help=f"timed matmuls for the measured peak, the best counts (default {PEAK_REPEATS})")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"JSON output (default {DEFAULT_JSON})")
    args = parser.parse_args(argv)

    configured = device.setup(load_config("v7").train)
    tf.config.experimental.enable_tensor_float_32_execution(False)  # float32 means float32, on a GPU too
    load_before = os.getloadavg()[0]
    cpus = machine.usable_cpus()
    timing = Timing(args.budget, args.repeats)
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # idle while the models train
        peak_before = measured_peak_gflops(pool, args.peak_repeats)
        families = [family_throughput(name, tuple(args.batch_sizes), timing) for name in args.families]
        variants = variant_throughput(VARIANT_BATCH_SIZES, timing) if args.variants else []
        peak_after = measured_peak_gflops(pool, args.peak_repeats)
    theoretical = None if configured["gpus"] else theoretical_peak(cpus)  # no table of GPU peaks here
    peaks = {"measured": max(peak_before, peak_after),
             **({"theoretical": theoretical["gflops"]} if theoretical else {})}
    for family in families:
        add_achieved(family, peaks)
    result = {
        "machine": {"cpu": machine.cpu_model(), "gpus": configured["gpus"], "usable_cpus": cpus,
                    "tensorflow": tf.__version__,
                    "keras": keras.__version__, "measured_peak_gflops": peaks["measured"],
                    "theoretical_peak": theoretical, "load_average_before": load_before,
                    "load_average_after": os.getloadavg()[0]},
        "families": families,
        "variants": variants,
    }
    print_report(result, Console())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
