"""benchmarks/bench_pack.py runs (small), so that it cannot break unnoticed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import keras
import pytest
import yaml
from conftest import CANDLES_DIR, tiny_config_dict

pytestmark = [pytest.mark.bench,
              pytest.mark.skipif(keras.backend.backend() != "jax", reason="on Keras's JAX backend: tests/test_jax.py")]


def test_bench_pack_measures_one_job_and_packs(tmp_path):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pack.py"
    spec = importlib.util.spec_from_file_location("bench_pack", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # the suite's tiny config as the family (a YAML path): XLA compiles its two LSTMs in half the time of
    # quickstart's four
    family = tmp_path / "tiny.yaml"
    family.write_text(yaml.safe_dump(tiny_config_dict(tmp_path), sort_keys=False))
    out = tmp_path / "pack.json"
    bench.main(["--family", str(family), "--ks", "2", "--steps", "2", "--repeats", "1", "--no-tensorflow",
                "--data", str(CANDLES_DIR), "--max-jobs", "2", "--json", str(out)])
    results = json.loads(out.read_text())
    epoch = results["family_epoch"]
    assert epoch["jobs"] == 2 and not epoch["failed"] and epoch["epoch_s"] > 0 and epoch["train_windows"] > 0
    assert results["device"].startswith("cpu: ") and results["one_job_fit_samples_s"] > 0
    assert set(results["packed"]) == {"2"} and all(r["samples_s"] > 0 for r in results["packed"].values())
