"""What a user gets from a plain install, and without a package an option needs: one line naming what to
install, exit 2, before any work; and what pip does with the jax extra where JAX is installed already. (`make
check-install` installs this checkout into a fresh venv, no extras, and runs the quickstart from another directory;
.ci/run's Python 3.13 leg installs the newest JAX first, as Colab preinstalls it, then the checkout, and checks that
JAX stayed: CI runs both.)"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_without


def _cryptotrain_without(packages: tuple[str, ...], *args: str, cwd) -> subprocess.CompletedProcess:
    """`cryptotrain ARGS` in `cwd`, as a user without `packages` gets it (this test's own cache directory)."""
    return subprocess.run([*cli_without(*packages), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.train
def test_tensorboard_missing_is_one_line_before_any_job(forked, tiny_config, tmp_path):
    config = tiny_config()
    result = forked.run("run", "--config", str(config), "--tensorboard", cwd=tmp_path, without=["tensorboard"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: train.tensorboard (--tensorboard) needs the tensorboard package, which is not installed: "
        "pip install 'tensorboard>=2.16'"]
    assert not (tmp_path / "run").exists()  # nothing trained, no run directory made

    # The same config without the option trains: only the option needs the package.
    plain = forked.run("run", "--config", str(config), "--only", "BTCUSDT", "--set", "train.epochs=1", cwd=tmp_path,
                       without=["tensorboard"])
    assert plain.returncode == 0, plain.stderr[-3000:]


@pytest.mark.parametrize("command", [["run", "--config", "quickstart"], ["plan", "--config", "quickstart"], ["doctor"],
                                     ["predict", "--model", "runs/quickstart/jobs/BTCUSDT_15m"]],
                         ids=["run", "plan", "doctor", "predict"])
def test_without_tensorflow_and_jax_every_command_that_needs_them_says_how_to_install_them(command, tmp_path):
    """`run`, `plan`, `predict` and `doctor` run on Keras's JAX backend where TensorFlow is not installed
    (tests/run/test_pack.py): without either, they say how to install them."""
    result = _cryptotrain_without(("tensorflow", "jax"), *command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    tensorflow = ("error: TensorFlow is not installed: pip install 'tensorflow>=2.18,<2.22' (cryptotrain installs it "
                  "unless installed with --no-deps; for NVIDIA GPUs pip install 'cryptotrain[gpu]')")
    assert result.stderr.strip().splitlines() == [
        tensorflow + "; or train on Keras's JAX backend: pip install 'cryptotrain[jax]' (JAX with CUDA for NVIDIA "
                     "GPUs: pip install 'jax[cuda12]')"]
    assert not (tmp_path / "runs").exists()


def test_the_default_candles_are_found_outside_a_checkout(tmp_path):
    """`-c quickstart` from any directory reads the bundled candles (installed with the package)."""
    args = ("features", "--config", "quickstart", "--only", "BTCUSDT", "--timeframes", "1h")
    result = _cryptotrain_without((), *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"computed, 1967 rows x 11 columns <- local:{REPO / 'data' / 'ohlcv' / 'BTCUSDT_1h.csv.gz'}" in result.stdout

    # A data/ohlcv directory of the user's own, in the working directory, is read instead.
    (tmp_path / "data" / "ohlcv").mkdir(parents=True)
    own = _cryptotrain_without((), *args, cwd=tmp_path)
    assert own.returncode == 1
    assert f"local:{tmp_path / 'data' / 'ohlcv' / 'BTCUSDT_1h.csv.gz'}: no such file" in own.stdout


@pytest.mark.processes
def test_installing_the_jax_extra_leaves_the_installed_jax_as_it_is(tmp_path):
    """`pip install ".[jax]"` (a dry run, offline: what is installed here is all it may use) would install the
    checkout and nothing else: the JAX and jaxlib installed here satisfy the extra, whatever their version (Colab's
    newer one, with its CUDA plugin, is not replaced)."""
    pytest.importorskip("hatchling", reason="the build backend, in the dev extra")
    installed = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib")}
    report = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                             "--quiet", "--report", str(report), f"{REPO}[jax]"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    would = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert would == ["cryptotrain"], would
    assert {name: importlib.metadata.version(name) for name in installed} == installed
