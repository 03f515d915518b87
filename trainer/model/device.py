"""TensorFlow set-up, in one place and before anything else touches TensorFlow, and the `doctor` checks.

Measured on the 2-core CPUs this project is developed on (benchmarks/bench_throughput.py):
- XLA (jit_compile=True) trains the LSTM families slower, so it stays off ("jit_compile": False); on a GPU
  Keras cannot use XLA with the fused cuDNN kernel anyway.
- Threads: half the CPUs for each op, all of them across ops (_set_threads). One inter-op thread halves V7's
  throughput, as the two directions of a bidirectional layer no longer run side by side; TensorFlow's
  default of every CPU for each op as well oversubscribes the cores while they do (V7: 7 % slower at batch 16,
  15 % at 256).
- steps_per_execution > 1 saves ~0.7 ms of dispatch per step, under 2 % of a V7 step on the CPU, so
  train.steps_per_execution stays as configured (default 1).
"""
from __future__ import annotations

import logging
import platform
import time

import keras
import tensorflow as tf

from ..errors import UserError
from ..files import native_stderr_silenced
from .machine import (
    CHECK_BATCH,
    CHECK_FEATURES,
    CHECK_REPEATS,
    CHECK_STEPS,
    Diagnosis,
    Finding,
    check_model,
    cpu_device,
    nvidia_driver,
    step_report,
    usable_cpus,
)
from .settings import TrainConfig

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", "auto")
MIXED_FLOAT16_MIN_CAPABILITY = (7, 0)  # tensor cores: float16 is faster from Volta on
GPU_INSTALL = 'make install TF_EXTRA=gpu  (or: pip install "cryptotrain[gpu]")'
FUSED_KERNEL_OP = "CudnnRNNV3"  # what Keras's fused LSTM/GRU path puts in the graph

log = logging.getLogger(__name__)
_configured: dict | None = None  # what setup() did; TensorFlow's process-wide settings can be made only once


# ----------------------------------------------------------------------------- set-up
def setup(train: TrainConfig, cpus: int | None = None) -> dict:
    """Configure TensorFlow for this process; call before any model is built. Idempotent: the device
    settings are made once, the precision policy is (re)applied on every call. `cpus`: the CPUs this process
    may use (a Ray worker's share), default all it can (usable_cpus).

    Returns {"precision", "devices", "gpus", "memory_growth", "threads", "jit_compile"}."""
    global _configured
    if _configured is None:
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            _enable_memory_growth(gpu)
        _configured = {
            "devices": [d.name for d in tf.config.list_physical_devices()],
            "gpus": [gpu_name(gpu) for gpu in gpus],
            "memory_growth": all(tf.config.experimental.get_memory_growth(gpu) for gpu in gpus),
            "threads": _set_threads(cpus or usable_cpus()),
            "jit_compile": False,
        }
        _spend_onednn_notice()
    return {"precision": apply_precision(train.precision), **_configured}


def _spend_onednn_notice() -> None:
    """TensorFlow with oneDNN on a CPU without AVX-512 logs "oneDNN supports DT_INT32 only on platforms with
    AVX-512" once a process, at ERROR level (which TF_CPP_MIN_LOG_LEVEL=2 lets through), the first time a graph
    holds an int32 op oneDNN could have run: at the first train step, under the progress display. It says
    nothing to act on. Set off here (an int32 transpose of unknown shape), with native stderr silenced, it is
    spent, while every later native message still shows. (~0.15 s, so only where oneDNN runs.)"""
    if not onednn_runs():
        return
    with native_stderr_silenced(), tf.device("CPU:0"):
        transpose = tf.function(tf.transpose, input_signature=[tf.TensorSpec([None, None], tf.int32)])
        transpose(tf.zeros((1, 1), tf.int32))


def onednn_runs() -> bool:
    """Whether TensorFlow runs its CPU ops with oneDNN. No public API says: TensorFlow's private module is asked
    here alone (tests/test_public_api.py fails should it move)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def _enable_memory_growth(gpu) -> None:
    """Allocate GPU memory as needed instead of reserving the whole card at start."""
    try:
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # the GPU is initialised already: setup() came too late; doctor flags it too
        log.warning("%s: GPU memory growth could not be enabled: TensorFlow used the GPU before "
                    "trainer.model.device.setup() ran, so it reserves the whole card", gpu.name)


def apply_precision(precision: str) -> str:
    """Set Keras's global dtype policy; again after keras.backend.clear_session(). Returns the resolved
    policy. Under mixed precision the model's heads stay float32 (trainer.model.models) and Keras's compile()
    wraps the optimizer in a LossScaleOptimizer for mixed_float16."""
    if precision not in PRECISIONS:
        raise UserError(f"train.precision: unknown precision '{precision}' (one of {', '.join(PRECISIONS)})")
    resolved = resolve_precision(precision)
    keras.mixed_precision.set_dtype_policy(resolved)
    return resolved


def resolve_precision(precision: str) -> str:
    """'auto': mixed_float16 where every visible GPU has tensor cores (compute capability >= 7.0), else
    float32 (on CPU float16 is emulated and slower)."""
    if precision != "auto":
        return precision
    capabilities = [_compute_capability(gpu) for gpu in tf.config.list_physical_devices("GPU")]
    fast_float16 = bool(capabilities) and all(c >= MIXED_FLOAT16_MIN_CAPABILITY for c in capabilities)
    return "mixed_float16" if fast_float16 else "float32"


def _set_threads(cpus: int) -> dict:
    """Each op gets half the usable CPUs, the ops running side by side all of them. A recurrent step's
    matrix products are too small to gain much from more threads, while the two directions of a
    bidirectional layer, the heads and the gradient branches run concurrently: with pools as wide as the
    machine for both, those ops oversubscribe the cores and TensorFlow's spinning threads slow each other
    down. Also keeps TensorFlow within a cgroup CPU quota, which it does not see."""
    intra_op, inter_op = max(1, cpus // 2), cpus
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:  # TensorFlow ran ops before setup(): its pools are fixed for this process
        log.warning("TensorFlow was used before trainer.model.device.setup() ran: its thread pools keep their sizes")
    return {"usable_cpus": cpus,
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads() or cpus,
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads() or cpus}


def _compute_capability(gpu) -> tuple[int, int]:
    return tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0)))


def gpu_name(gpu) -> str:
    return tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)


# ----------------------------------------------------------------------------- doctor


def diagnose(packing: dict) -> Diagnosis:
    """`cryptotrain doctor`: what TensorFlow uses and how well, beside `packing` (run.probe.pack_report's: what
    `run --pack` would do here). No GPU is a notice, not a problem: the CPU path is still checked. Printing it (and
    the exit code) is the command line's (report.console.print_doctor)."""
    configured = setup(TrainConfig(precision="auto"))
    build = tf.sysconfig.get_build_info()
    driver = nvidia_driver()
    gpus = tf.config.list_physical_devices("GPU")
    devices = [cpu_device(configured["threads"])]
    devices += [{"name": f"GPU:{i}", "kind": gpu_name(gpu),
                 "compute_capability": ".".join(map(str, _compute_capability(gpu))),
                 "memory_growth": tf.config.experimental.get_memory_growth(gpu)} for i, gpu in enumerate(gpus)]
    steps = [time_train_step("CPU:0", "float32")]
    steps += [time_train_step(f"GPU:{i}", configured["precision"]) for i in range(len(gpus))]
    findings = _findings(build, gpus, driver, configured, steps)
    problems = sum(f.severity == "problem" for f in findings)
    return Diagnosis(
        versions={"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
                  "cuda_build": bool(build.get("is_cuda_build")), "cuda": build.get("cuda_version"),
                  "cudnn": build.get("cudnn_version")},
        devices=devices,
        driver=driver,
        precision_auto=configured["precision"],
        train_steps=steps,
        packing=packing,
        findings=findings,
        verdict=f"{problems} problem(s) found" if problems else "no problems found",
    )


def time_train_step(device: str, precision: str) -> dict:
    """Time Keras's own train step (forward, loss scaling, gradients, Adam) of a small LSTM on one device;
    on a GPU also its peak memory and whether the graph holds the fused cuDNN kernel."""
    on_gpu = device.startswith("GPU")
    apply_precision(precision)
    with tf.device(device):
        # On the CPU the fused path must be off explicitly, or a GPU would quietly run the "CPU" step.
        model = check_model(use_cudnn="auto" if on_gpu else False)
        data = (tf.random.normal((CHECK_BATCH, CHECK_STEPS, CHECK_FEATURES)), tf.random.normal((CHECK_BATCH, 1)))
        step = tf.function(model.train_step)
        graph = step.get_concrete_function(data).graph
        step(data)  # warm-up
        if on_gpu:
            tf.config.experimental.reset_memory_stats(device)
        started = time.perf_counter()
        for _ in range(CHECK_REPEATS):
            logs = step(data)
        loss = float(logs["loss"])  # waits for the device to finish
        seconds = (time.perf_counter() - started) / CHECK_REPEATS
    keras.backend.clear_session()
    return step_report(device, precision, seconds, loss,
                       tf.config.experimental.get_memory_info(device)["peak"] if on_gpu else None,
                       FUSED_KERNEL_OP in _op_types(graph) if on_gpu else None)


def _op_types(graph: tf.Graph) -> set[str]:
    graph_def = graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:  # ops inside while loops and other nested functions
        types.update(node.op for node in function.node_def)
    return types


def _findings(build: dict, gpus: list, driver: dict, configured: dict, steps: list[dict]) -> list[Finding]:
    """Each problem or notice, with its fix."""
    findings = []

    def add(severity: str, message: str, fix: str) -> None:
        findings.append(Finding(severity=severity, message=message, fix=fix))

    if driver["error"]:
        add("problem", f"the NVIDIA driver does not answer: {driver['error']}",
            "reinstall the NVIDIA driver; after a driver update, reboot (driver/library version mismatch)")
    elif not gpus and not driver["gpus"]:
        add("notice", "no GPU visible: training runs on the CPU",
            f"on a machine with an NVIDIA GPU and driver: {GPU_INSTALL}")
    elif not gpus and not build.get("is_cuda_build"):
        add("problem", "nvidia-smi lists a GPU, but this TensorFlow is the CPU-only build", GPU_INSTALL)
    elif not gpus:
        add("problem", f"TensorFlow (CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}) "
                       "cannot use the GPU that nvidia-smi lists",
            f'pip install --force-reinstall "tensorflow[and-cuda]=={tf.__version__}" (the CUDA libraries it was '
            "built with), check that the driver supports that CUDA version (nvidia-smi), and rerun with "
            "TF_CPP_MIN_LOG_LEVEL=0 to see TensorFlow's reason")
    if gpus and not configured["memory_growth"]:
        add("problem", "GPU memory growth is off: TensorFlow reserves the whole GPU at start",
            "call trainer.model.device.setup() before anything else initialises TensorFlow")
    if gpus and configured["precision"] == "float32":
        add("notice", "precision auto stays float32: a GPU has no tensor cores (compute capability < 7.0)",
            "nothing to fix; train.precision: mixed_float16 forces float16 (usually slower on such a GPU)")
    for step in steps:
        if not step["loss_finite"]:
            add("problem", f"the training step on {step['device']} gave a non-finite loss",
                "reinstall TensorFlow (make install), then run doctor again")
        if step["fused_kernel"] is False:
            add("problem", f"the LSTM step on {step['device']} did not use the fused cuDNN kernel",
                f'reinstall the GPU build so that cuDNN loads: pip install --force-reinstall '
                f'"tensorflow[and-cuda]=={tf.__version__}"; the layer settings are not the cause here (the check '
                f"uses Keras's defaults)")
    return findings
