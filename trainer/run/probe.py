"""What `run --pack` would do on this machine, asked of a process of its own (`doctor`'s packing line): packing runs
on Keras's JAX backend, and a process's Keras has one backend (`doctor`'s is TensorFlow). JAX there takes device
memory as it needs it, not most of it at once, as it would by default.

    python -m trainer.run.probe     (pack_report starts it; prints one JSON line)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def pack_report() -> dict:
    """Whether `run --pack` can run here, on what device, and the K `--pack auto` chooses for the V7 family's 40
    jobs: {"available", "device", "jax", "auto_k_v7", "why"}, or {"available": False, "why"}."""
    result = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return {"available": False, "why": f"JAX failed to start: {last}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    try:
        import jax
    except ImportError:
        print(json.dumps({"available": False, "why": "JAX is not installed: pip install 'cryptotrain[jax]'"}))
        return
    from ..config import load_config
    from .jobs import make_jobs
    from .packing import plan_pack

    cfg = load_config("v7")
    plan = plan_pack("auto", len(make_jobs(cfg)), cfg.network, cfg.train, cfg.data.max_rows)
    print(json.dumps({"available": True, "device": plan.device, "jax": jax.__version__, "auto_k_v7": plan.k,
                      "why": plan.why}))


if __name__ == "__main__":
    main()
