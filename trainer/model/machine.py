"""What the machine has, asked without TensorFlow or JAX: its CPUs (those this process may use), its CPU's name,
the NVIDIA driver's view of its GPUs; and what `cryptotrain doctor` reports (Diagnosis). device.py's checks fill it
where TensorFlow is installed; `diagnose_on_jax` where it is not (every command then runs on Keras's JAX backend)."""
from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..errors import UserError

# CPUs this process's TensorFlow may use, at most those it may run on: for several processes sharing a machine (one
# `cryptotrain run` per GPU, a test suite's workers), which would otherwise each size its thread pools to all of them
CPUS_ENV = "CRYPTOTRAIN_CPUS"


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, lowered by a cgroup CPU quota (docker --cpus,
    Kubernetes limits), which TensorFlow does not see, and by CRYPTOTRAIN_CPUS."""
    cpus = len(os.sched_getaffinity(0))
    quota = _cgroup_cpu_quota()
    if quota:
        cpus = max(1, min(cpus, math.ceil(quota)))
    given = os.environ.get(CPUS_ENV)
    if given is None:
        return cpus
    if not given.isdigit() or int(given) < 1:
        raise UserError(f"{CPUS_ENV}={given!r}: expected a whole number of CPUs, at least 1 (e.g. {CPUS_ENV}=2)")
    return min(cpus, int(given))


def _cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time per period this cgroup may use (cgroup v2, else v1); None when unlimited."""
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period)
    v1 = root / "cpu" / "cpu.cfs_quota_us"
    if v1.is_file():
        quota = int(v1.read_text())
        return None if quota < 0 else quota / int((v1.parent / "cpu.cfs_period_us").read_text())
    return None


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'AMD EPYC 9654'."""
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def nvidia_driver() -> dict:
    """The driver's view of the GPUs, whatever TensorFlow or JAX sees: {"found", "gpus", "error"}."""
    if shutil.which("nvidia-smi") is None:
        return {"found": False, "gpus": [], "error": None}
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,driver_version",
             "--format=csv,noheader,nounits"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {"found": True, "gpus": [], "error": "nvidia-smi did not answer within 30 s"}
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        return {"found": True, "gpus": [], "error": said[0] if said else f"nvidia-smi exited {result.returncode}"}
    gpus = []
    for line in result.stdout.strip().splitlines():
        index, name, total, used, version = (field.strip() for field in line.split(","))
        gpus.append({"index": int(index), "name": name, "memory_total_bytes": int(total) * 2**20,
                     "memory_used_bytes": int(used) * 2**20, "driver": version})
    return {"found": True, "gpus": gpus, "error": None}


# ----------------------------------------------------------------------------- doctor's report
# The timed check: one small LSTM model's training step, per device (device.time_train_step on TensorFlow,
# run.probe.time_jax_step on Keras's JAX backend).
CHECK_BATCH, CHECK_STEPS, CHECK_FEATURES, CHECK_UNITS, CHECK_REPEATS = 64, 30, 8, 64, 10
CHECK_MODEL = f"LSTM {CHECK_UNITS}, batch {CHECK_BATCH} x {CHECK_STEPS} steps x {CHECK_FEATURES} features"


def check_model(use_cudnn: bool | str = "auto", **compile_options):
    """doctor's small LSTM, compiled, on whichever backend this process's Keras runs."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((CHECK_STEPS, CHECK_FEATURES)),
                              keras.layers.LSTM(CHECK_UNITS, use_cudnn=use_cudnn),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer="adam", loss="mse", **compile_options)
    return model


def step_report(device: str, precision: str, seconds: float, loss: float, peak_memory_bytes: int | None = None,
                fused_kernel: bool | None = None) -> dict:
    """One of Diagnosis.train_steps: check_model's train step timed on `device` (`seconds` a step)."""
    return {"device": device, "precision": precision, "model": CHECK_MODEL, "step_ms": 1e3 * seconds,
            "samples_per_s": CHECK_BATCH / seconds, "loss_finite": math.isfinite(loss),
            "peak_memory_bytes": peak_memory_bytes, "fused_kernel": fused_kernel}


def cpu_device(threads: dict) -> dict:
    """The CPU's entry in Diagnosis.devices: its name, the machine's memory, the threads that train on it."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"name": "CPU", "kind": cpu_model(), "memory_bytes": memory, "threads": threads}

class Finding(BaseModel):
    """One thing doctor found: a problem (doctor exits 1) or a notice, and its fix."""
    model_config = ConfigDict(frozen=True)
    severity: Literal["problem", "notice"]
    message: str
    fix: str


class Diagnosis(BaseModel):
    """What `cryptotrain doctor` found; `--json` prints its model_dump."""
    model_config = ConfigDict(frozen=True)
    versions: dict  # python, tensorflow, keras, cuda_build, cuda, cudnn
    devices: list[dict]  # the CPU (kind, memory_bytes, threads), then each GPU (kind, compute_capability, ...)
    driver: dict  # nvidia_driver()
    precision_auto: str
    train_steps: list[dict]  # device.time_train_step() on the CPU, then on each GPU (none without TensorFlow)
    packing: dict  # run.probe.pack_report(): run --pack's device, the K auto chooses and a step timed on JAX, or why
    # it is not available
    findings: list[Finding]
    verdict: str

    @property
    def problems(self) -> int:
        """How many findings are problems (notices are not)."""
        return sum(f.severity == "problem" for f in self.findings)


def diagnose_on_jax(packing: dict, tensorflow_missing: str) -> Diagnosis:
    """`cryptotrain doctor` where TensorFlow is not installed: the machine, and what Keras on JAX does with it
    (`packing`: run.probe.pack_report's, which times a step of doctor's small model there). Every command trains on
    that backend, a job alone as a pack of one; `tensorflow_missing` says how to install TensorFlow's path."""
    import keras  # on JAX: the command line chose the backend before (run.engine.keras_on_jax)

    driver = nvidia_driver()
    findings = [Finding(severity="notice", message="TensorFlow is not installed: every command runs on Keras's JAX "
                        "backend (a job alone trains as a pack of one)", fix=tensorflow_missing)]
    if not packing["available"]:
        findings.append(Finding(severity="problem", message=f"Keras's JAX backend cannot start: {packing['why']}",
                                fix="pip install 'cryptotrain[jax]' (JAX with CUDA for NVIDIA GPUs: "
                                    "pip install 'jax[cuda12]')"))
    elif driver["gpus"] and not packing["device"].startswith("gpu"):
        findings.append(Finding(severity="problem", message=f"nvidia-smi lists a GPU, but JAX runs on "
                                f"{packing['device']}", fix="pip install 'jax[cuda12]' (JAX's CUDA build), then "
                                                            "run doctor again"))
    elif not driver["gpus"]:
        findings.append(Finding(severity="notice", message="no GPU visible: training runs on the CPU",
                                fix="on a machine with an NVIDIA GPU and driver: pip install 'jax[cuda12]'"))
    step = packing.get("train_step")
    if step is not None and not step["loss_finite"]:
        findings.append(Finding(severity="problem", message=f"the training step on {step['device']} gave a "
                                "non-finite loss", fix="reinstall JAX (pip install --force-reinstall jax jaxlib), "
                                                       "then run doctor again"))
    problems = sum(f.severity == "problem" for f in findings)
    return Diagnosis(
        versions={"python": platform.python_version(), "tensorflow": None, "keras": keras.__version__,
                  "jax": packing.get("jax"), "cuda_build": False},
        devices=[cpu_device({"usable_cpus": usable_cpus()})],
        driver=driver, precision_auto=packing.get("precision", "float32"), train_steps=[],
        packing=packing, findings=findings,
        verdict=f"{problems} problem(s) found" if problems else "no problems found")
