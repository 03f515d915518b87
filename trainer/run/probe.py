"""What `run --pack` would do on this machine, and how fast Keras's JAX backend trains doctor's small model there
(`doctor`'s packing line): packing runs on that backend, and a process's Keras has one backend. Where TensorFlow is
installed, `doctor`'s Keras runs on it, and a process of its own is asked (pack_report); where it is not, `doctor`'s
runs on JAX and answers itself (packing_on_jax). JAX there takes device memory as it needs it, not most of it at
once, as it would by default.

    python -m trainer.run.probe     (pack_report starts it; prints one JSON line)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..model.machine import CHECK_BATCH, CHECK_FEATURES, CHECK_REPEATS, CHECK_STEPS, check_model, step_report
from .engine import keras_on_jax


def pack_report() -> dict:
    """Whether `run --pack` can run here, on what device, the K `--pack auto` chooses for the V7 family's 40 jobs
    and a step of doctor's small model on JAX: {"available", "device", "jax", "precision", "auto_k_v7", "why",
    "train_step"}, or {"available": False, "why"}."""
    result = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return {"available": False, "why": f"JAX failed to start: {last}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def packing_on_jax() -> dict:
    """pack_report's answer, from this process, whose Keras runs on JAX (run.engine.keras_on_jax)."""
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # read when JAX first uses a device: not yet
    try:
        import jax
    except ImportError:
        return {"available": False, "why": "JAX is not installed: pip install 'cryptotrain[jax]'"}
    from ..config import load_config
    from .jobs import make_jobs
    from .packing import pack_precision, plan_pack

    cfg = load_config("v7")
    plan = plan_pack("auto", len(make_jobs(cfg)), cfg.network, cfg.train, cfg.data.max_rows)
    precision = pack_precision(cfg.train.precision)
    return {"available": True, "device": plan.device, "jax": jax.__version__, "precision": precision,
            "auto_k_v7": plan.k, "why": plan.why, "train_step": time_jax_step(precision)}


def main() -> None:
    keras_on_jax()
    print(json.dumps(packing_on_jax()))


def time_jax_step(precision: str) -> dict:
    """Keras's train step of doctor's small model (model.machine.check_model) on JAX's first device, compiled, as
    device.time_train_step times it on TensorFlow."""
    import jax
    import keras
    import numpy as np

    keras.mixed_precision.set_dtype_policy(precision)
    model = check_model(jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CHECK_BATCH, CHECK_STEPS, CHECK_FEATURES), dtype=np.float32)
    y = rng.standard_normal((CHECK_BATCH, 1), dtype=np.float32)
    model.train_on_batch(x, y)  # compiles
    started = time.perf_counter()
    for _ in range(CHECK_REPEATS):
        loss = model.train_on_batch(x, y)  # a float: each waits for the device
    return step_report(f"JAX {jax.devices()[0].platform}", precision, (time.perf_counter() - started) / CHECK_REPEATS,
                       float(loss))


if __name__ == "__main__":
    main()
