"""Device set-up, precision policies, cuDNN eligibility and `cryptotrain doctor`, on the CPU: each precision
builds and trains the tiny model with float32 heads; the eligibility report names each blocking setting and
agrees with Keras's own rule; doctor exits 0 without a GPU and 1 when the driver has a GPU this TensorFlow
cannot use. The GPU-only parts of doctor (findings, report) are checked on a GPU machine's diagnosis."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from rich.console import Console

from tests.conftest import tiny_config_dict
from trainer.cli import main
from trainer.config import RunConfig, TrainConfig
from trainer.errors import UserError
from trainer.model import cudnn, device, machine
from trainer.model.models import build_model
from trainer.report import console as reporting
from trainer.run import probe


@pytest.fixture
def float32_after():
    """For tests that set a dtype policy or build models: the next test starts clean."""
    yield
    keras.backend.clear_session(free_memory=False)  # as fresh_keras_session (conftest.py)
    keras.mixed_precision.set_dtype_policy("float32")


def tiny(tmp_path, **sections) -> RunConfig:
    return RunConfig.model_validate(tiny_config_dict(tmp_path, **sections))


# ----------------------------------------------------------------------------- set-up and precision
@pytest.mark.usefixtures("float32_after")
def test_setup_on_cpu_resolves_auto_to_float32_and_is_idempotent():
    first = device.setup(TrainConfig(precision="auto"))
    assert first["precision"] == "float32"
    assert first["gpus"] == [] and any("CPU" in d for d in first["devices"])
    assert first["jit_compile"] is False
    assert 1 <= first["threads"]["usable_cpus"] == machine.usable_cpus()

    again = device.setup(TrainConfig(precision="mixed_bfloat16"))
    assert again["precision"] == "mixed_bfloat16"
    assert keras.mixed_precision.dtype_policy().name == "mixed_bfloat16"
    assert {k: v for k, v in again.items() if k != "precision"} == {k: v for k, v in first.items() if k != "precision"}


@pytest.mark.processes
def test_setup_gives_each_op_half_the_cpus_and_the_ops_all_of_them(monkeypatch):
    # in a fresh process: TensorFlow's thread pools can be sized only before its first op; every CPU it may run on
    monkeypatch.delenv(machine.CPUS_ENV, raising=False)  # (the suite gives each of its workers a share)
    script = ("import json; from trainer.run.engine import import_tensorflow; import_tensorflow(); "
              "import tensorflow as tf; from trainer.model import device; "
              "from trainer.config import TrainConfig; threads = device.setup(TrainConfig())['threads']; "
              "print(json.dumps([threads, tf.config.threading.get_intra_op_parallelism_threads(), "
              "tf.config.threading.get_inter_op_parallelism_threads()]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    threads, intra_op, inter_op = json.loads(out.splitlines()[-1])
    cpus = machine.usable_cpus()
    assert (intra_op, inter_op) == (max(1, cpus // 2), cpus)
    assert threads == {"usable_cpus": cpus, "intra_op": intra_op, "inter_op": inter_op}


def test_cryptotrain_cpus_gives_a_process_fewer_cpus_than_it_may_run_on(monkeypatch):
    """Several processes sharing a machine (one per GPU, a suite's workers) each take a share of its CPUs."""
    monkeypatch.delenv(machine.CPUS_ENV, raising=False)
    every = machine.usable_cpus()
    monkeypatch.setenv(machine.CPUS_ENV, "1")
    assert machine.usable_cpus() == 1
    monkeypatch.setenv(machine.CPUS_ENV, "999")
    assert machine.usable_cpus() == every  # never more than it may run on
    monkeypatch.setenv(machine.CPUS_ENV, "two")
    with pytest.raises(UserError, match=r"^CRYPTOTRAIN_CPUS='two': expected a whole number of CPUs, at least 1"):
        machine.usable_cpus()


def test_unknown_precision_is_a_user_error():
    with pytest.raises(UserError, match="train.precision: unknown precision 'float64'"):
        device.apply_precision("float64")


@pytest.mark.train
@pytest.mark.usefixtures("float32_after")
@pytest.mark.parametrize("precision, compute_dtype", [
    ("float32", "float32"), ("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")])
def test_precision_builds_and_trains_with_float32_heads(tmp_path, precision, compute_dtype):
    cfg = tiny(tmp_path, train={"precision": precision, "batch_size": 16, "learning_rate": 0.01})
    keras.backend.clear_session()
    assert device.apply_precision(precision) == precision
    model = build_model(cfg.network, cfg.train)

    trunk = [layer for layer in model.layers if layer.name.startswith("trunk_")]
    assert {layer.compute_dtype for layer in trunk} == {compute_dtype}
    assert {w.dtype for w in model.weights} == {"float32"}  # variables stay float32
    assert all(model.get_layer(head.name).compute_dtype == "float32" for head in cfg.heads)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "mixed_float16")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16, 8), dtype=np.float32)
    y = {name: rng.standard_normal((32, *tensor.shape[1:]), dtype=np.float32) for name, tensor in model.output.items()}
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    predictions = model.predict(x[:4], verbose=0)

    assert np.isfinite(history.history["loss"][0])
    assert all(p.dtype == np.float32 for p in predictions.values())
    assert any(not np.array_equal(b, a) for b, a in zip(before, model.get_weights()))


@pytest.mark.parametrize("cpu_max, v1_quota, expected", [
    ("200000 100000\n", None, 2.0),
    ("max 100000\n", None, None),
    (None, ("150000", "100000"), 1.5),
    (None, ("-1", "100000"), None),
    (None, None, None),
])
def test_cgroup_cpu_quota(tmp_path, cpu_max, v1_quota, expected):
    if cpu_max is not None:
        (tmp_path / "cpu.max").write_text(cpu_max)
    if v1_quota is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1_quota[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1_quota[1])
    assert machine._cgroup_cpu_quota(tmp_path) == expected


# ----------------------------------------------------------------------------- cuDNN eligibility
def test_default_recurrent_layers_are_eligible(tmp_path):
    report = cudnn.cudnn_report(tiny(tmp_path).model)
    assert [(r.index, r.kind) for r in report] == [(0, "lstm"), (3, "lstm")]  # layernorm, repeat_vector skipped
    assert all(r.eligible and r.blockers == [] for r in report)


@pytest.mark.parametrize("setting, value, blocker", [
    ("activation", "relu", "activation=relu (needs tanh)"),
    ("recurrent_activation", "hard_sigmoid", "recurrent_activation=hard_sigmoid (needs sigmoid)"),
    ("recurrent_dropout", 0.2, "recurrent_dropout=0.2 (needs 0)"),
    ("unroll", True, "unroll=True (needs False)"),
    ("use_bias", False, "use_bias=False (needs True)"),
])
@pytest.mark.parametrize("kind", ["lstm", "gru", "bilstm", "bigru"])
def test_each_blocking_setting_is_named(tmp_path, kind, setting, value, blocker):
    layers = [{"kind": kind, "units": 4, "return_sequences": True, "dropout": 0.3, setting: value},
              {"kind": "lstm", "units": 4}]
    report = cudnn.cudnn_report(tiny(tmp_path, model={"layers": layers}, window={"lookback": 8, "horizon": 1}).model)
    assert report[0] == cudnn.LayerEligibility(0, kind, False, [blocker])
    assert report[1].eligible  # input dropout alone does not block the fused kernel


@pytest.mark.parametrize("setting, value", [
    (None, None), ("activation", "relu"), ("recurrent_activation", "hard_sigmoid"), ("recurrent_dropout", 0.2),
    ("unroll", True), ("use_bias", False)])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_report_agrees_with_keras_own_rule(tmp_path, kind, setting, value):
    """Keras's own test for the fused path (minus its "is a GPU visible" part), on the layer it builds."""
    from keras.src.backend.tensorflow.rnn import _do_gru_arguments_support_cudnn, _do_lstm_arguments_support_cudnn

    spec = {"kind": kind, "units": 4, **({setting: value} if setting else {})}
    cfg = tiny(tmp_path, model={"layers": [spec]}, window={"lookback": 8, "horizon": 1})
    layer = build_model(cfg.network, cfg.train).get_layer(f"trunk_0_{kind}")
    cell = layer.cell
    args = dict(activation=cell.activation, recurrent_activation=cell.recurrent_activation, unroll=layer.unroll,
                use_bias=cell.use_bias)
    keras_rule = (_do_lstm_arguments_support_cudnn(**args) if kind == "lstm"
                  else _do_gru_arguments_support_cudnn(**args, reset_after=cell.reset_after))
    [report] = cudnn.cudnn_report(cfg.model)
    assert report.eligible == (keras_rule and not cell.recurrent_dropout)


def test_all_blockers_of_a_layer_are_listed(tmp_path):
    layers = [{"kind": "lstm", "units": 4, "recurrent_dropout": 0.1, "unroll": True}]
    report = cudnn.cudnn_report(tiny(tmp_path, model={"layers": layers}, window={"lookback": 8, "horizon": 1}).model)
    assert report[0].blockers == ["recurrent_dropout=0.1 (needs 0)", "unroll=True (needs False)"]


# ----------------------------------------------------------------------------- doctor
@pytest.mark.train
@pytest.mark.usefixtures("float32_after")
def test_doctor_without_gpu_says_so_times_the_cpu_step_and_exits_0(monkeypatch):
    """`doctor --json`, then `doctor` (its probe's packing report, a process of its own, taken once for both)."""
    result = CliRunner().invoke(main, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # the default install is TensorFlow's CUDA build on Linux, tensorflow-cpu elsewhere: either way it is said
    assert report["versions"]["tensorflow"]
    assert report["versions"]["cuda_build"] is bool(tf.sysconfig.get_build_info().get("is_cuda_build"))
    assert report["precision_auto"] == "float32"
    [cpu_step] = report["train_steps"]
    assert cpu_step["device"] == "CPU:0" and cpu_step["loss_finite"]
    assert cpu_step["step_ms"] > 0 and cpu_step["fused_kernel"] is None
    assert [f["severity"] for f in report["findings"]] == ["notice"]
    assert report["packing"]["available"] and report["packing"]["auto_k_v7"] == 1

    monkeypatch.setattr(probe, "pack_report", lambda: report["packing"])
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal width
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "no GPU visible" in result.output
    assert "make install TF_EXTRA=gpu" in result.output
    assert re.search(r"CPU:0\W+float32", result.output) and re.search(r"JAX cpu\W+float32", result.output)
    assert "packing (run --pack, JAX " in result.output and "on cpu; --pack auto for V7's 40 jobs: auto: one job " \
        "at a time on a CPU" in result.output
    assert "verdict: no problems found" in result.output


H100 = {"index": 0, "name": "NVIDIA H100", "memory_total_bytes": 80 * 2**30, "memory_used_bytes": 0,
        "driver": "550.54"}


CPU_ONLY_BUILD = {"is_cuda_build": False}
CUDA_12_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}


@pytest.mark.train
@pytest.mark.usefixtures("float32_after")
@pytest.mark.parametrize("build, driver, message, fix", [
    (CPU_ONLY_BUILD, {"found": True, "gpus": [H100], "error": None},
     "this TensorFlow is the CPU-only build", "TF_EXTRA=gpu"),
    (CUDA_12_BUILD, {"found": True, "gpus": [H100], "error": None},
     "TensorFlow (CUDA 12.5.1, cuDNN 9) cannot use the GPU that nvidia-smi lists", "tensorflow[and-cuda]=="),
    (CUDA_12_BUILD, {"found": True, "gpus": [], "error": "Failed to initialize NVML: Driver/library version mismatch"},
     "the NVIDIA driver does not answer: Failed to initialize NVML", "reboot"),
], ids=["cpu-only build", "cuda build", "driver mismatch"])
def test_doctor_fails_when_the_driver_has_a_gpu_tensorflow_cannot_use(monkeypatch, build, driver, message, fix):
    monkeypatch.setattr(device, "nvidia_driver", lambda: driver)
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: build)
    monkeypatch.setattr(probe, "pack_report", lambda: {"available": False, "why": "not asked"})  # tested above
    result = CliRunner().invoke(main, ["doctor", "--json"])
    assert result.exit_code == 1
    [finding] = json.loads(result.output)["findings"]
    assert finding["severity"] == "problem" and message in finding["message"]
    assert fix in finding["fix"]


# A GPU machine's diagnosis, for the parts of doctor that only a GPU reaches.
GPU_STEP = {"device": "GPU:0", "precision": "mixed_float16", "model": "LSTM 64", "step_ms": 1.5,
            "samples_per_s": 42000, "loss_finite": True, "peak_memory_bytes": 24 * 2**20, "fused_kernel": True}
CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5", "cudnn_version": "9"}
GROWTH_ON = {"memory_growth": True, "precision": "mixed_float16"}


@pytest.mark.parametrize("configured, step, expected", [
    (GROWTH_ON, GPU_STEP, []),
    (GROWTH_ON, {**GPU_STEP, "fused_kernel": False}, [("problem", "did not use the fused cuDNN kernel")]),
    ({**GROWTH_ON, "memory_growth": False}, GPU_STEP, [("problem", "GPU memory growth is off")]),
    ({**GROWTH_ON, "precision": "float32"}, GPU_STEP, [("notice", "precision auto stays float32")]),
])
def test_gpu_findings(configured, step, expected):
    findings = device._findings(CUDA_BUILD, ["GPU:0"], {"found": True, "gpus": [H100], "error": None},
                                configured, [step])
    assert len(findings) == len(expected)
    for finding, (severity, message) in zip(findings, expected):
        assert finding.severity == severity and message in finding.message


def test_gpu_report_shows_memory_growth_peak_memory_and_fused_kernel():
    report = {
        "versions": {"python": "3.11", "tensorflow": "2.21.0", "keras": "3.15.1", "cuda_build": True,
                     "cuda": "12.5", "cudnn": "9"},
        "devices": [{"name": "CPU", "kind": "EPYC", "memory_bytes": 64 * 2**30,
                     "threads": {"usable_cpus": 16, "intra_op": 16, "inter_op": 16}},
                    {"name": "GPU:0", "kind": "NVIDIA H100", "compute_capability": "9.0", "memory_growth": True}],
        "driver": {"found": True, "gpus": [H100], "error": None},
        "precision_auto": "mixed_float16",
        "train_steps": [{**GPU_STEP, "device": "CPU:0", "precision": "float32", "peak_memory_bytes": None,
                         "fused_kernel": None}, GPU_STEP],
        "packing": {"available": True, "device": "gpu: NVIDIA H100 80GB HBM3", "jax": "0.10.2", "auto_k_v7": 40,
                    "why": "auto: 40 of 40 jobs (95 MiB a job estimated, 50% of 79.1 GiB)"},
        "findings": [], "verdict": "no problems found",
    }
    console = Console(width=200, record=True)
    reporting.print_doctor(device.Diagnosis.model_validate(report), console)
    text = console.export_text()
    assert "CUDA 12.5, cuDNN 9" in text and "GPU 0 NVIDIA H100, 80.0 GiB" in text
    gpu_row = next(line for line in text.splitlines() if "GPU:0" in line and "mixed_float16" in line)
    assert "24.0 MiB" in gpu_row and "yes" in gpu_row
    assert "packing (run --pack, JAX 0.10.2): on gpu: NVIDIA H100 80GB HBM3; --pack auto for V7's 40 jobs: auto: 40 " \
        "of 40 jobs" in text
    assert "verdict: no problems found" in text


def test_doctor_says_packing_is_not_available_where_jax_is_not_installed(tmp_path, monkeypatch):
    """What a user without the jax extra sees: doctor's probe (a process of its own) finds no JAX and says how to
    install it; the rest of the report is as usual."""
    stub = tmp_path / "site" / "jax"
    stub.mkdir(parents=True)  # ahead of site-packages on the probe's path: `import jax` fails as if not installed
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jax'\", name='jax')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")]))
    packing = probe.pack_report()
    assert packing == {"available": False, "why": "JAX is not installed: pip install 'cryptotrain[jax]'"}

    report = {"versions": {"python": "3.11", "tensorflow": "2.21.0", "keras": "3.15.1", "cuda_build": False},
              "devices": [{"name": "CPU", "kind": "EPYC", "memory_bytes": 2**34,
                           "threads": {"usable_cpus": 2, "intra_op": 2, "inter_op": 2}}],
              "driver": {"found": False, "gpus": [], "error": None}, "precision_auto": "float32",
              "train_steps": [{**GPU_STEP, "device": "CPU:0", "precision": "float32", "peak_memory_bytes": None,
                               "fused_kernel": None}],
              "packing": packing, "findings": [], "verdict": "no problems found"}
    console = Console(width=200, record=True)
    reporting.print_doctor(device.Diagnosis.model_validate(report), console)
    assert "packing (run --pack): not available (JAX is not installed: pip install 'cryptotrain[jax]')" in \
        console.export_text()
