"""Every benchmark runs in the suite, on the bundled candles and the least work that still goes through all of its
code: a benchmark that breaks fails here, in the commit that broke it (those that train are marked `bench`: `make
test-all` and CI run them, `make test` leaves them out). The figures mean nothing at this size
(benchmarks/RESULTS.md holds the measured ones); what is checked is that each runs, finishes and writes figures that
are numbers."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import CANDLES_DIR, REPO


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py, loaded as a module (as `python benchmarks/NAME.py` runs it)."""
    sys.path.insert(0, str(REPO / "benchmarks"))  # a benchmark may import another, as run from its folder
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # as a script is (dataclasses look it up)
    spec.loader.exec_module(module)
    return module


def numbers(data: object) -> list[float]:
    """Every float in a JSON value."""
    if isinstance(data, float):
        return [data]
    values = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    return [number for value in values for number in numbers(value)]


def written(path: Path) -> dict:
    results = json.loads(path.read_text())
    assert numbers(results), path
    return results


def test_bench_features(tmp_path):
    out = tmp_path / "features.json"
    benchmark("bench_features").main(["--data", str(CANDLES_DIR), "--only", "BTCUSDT_1h", "--repeats", "1",
                                      "--json", str(out)])
    summary = written(out)["summary"]
    assert summary["speedup_median"]["cold"] > 0 and summary["speedup_median"]["cached"] > 0


def test_bench_baselines(tmp_path):
    out = tmp_path / "baselines.json"
    assert benchmark("bench_baselines").main(["--data", str(CANDLES_DIR), "--only", "BTCUSDT_1h",
                                              "--json", str(out)]) == 0
    results = written(out)
    figures = results["per_series"]["BTCUSDT_1h"]["figures"]
    assert figures["range_har_vs_persistence"] > 0
    # the normaliser's check on validation alone: a coverage per method and normaliser, summarised over the series
    assert 0.5 < figures["val_cover_adaptive_har_ewma"] < 1 and "terciles_within_5" in \
        results["overall"]["val_cover_conformal_ewma"]
    assert figures["val_cover_adaptive_har_ewma_alpha0.06"] == figures["val_cover_adaptive_har_ewma"]  # jobs' alpha


@pytest.mark.train
@pytest.mark.bench
def test_bench_skill(tmp_path):
    out = tmp_path / "skill.json"
    assert benchmark("bench_skill").main([
        "--data", str(CANDLES_DIR), "--only", "BTCUSDT_1h", "--epochs", "1", "--set", "features.market=null",
        "--set", "data.max_rows=1200", "--seeds", "2", "--keep", str(tmp_path / "run"), "--json", str(out)]) == 0
    results = written(out)
    row = results["per_series"]["BTCUSDT_1h"]
    assert row is not None and row["interval_method"] == "adaptive"
    assert {f"{figure}_{who}" for figure in ("range_qlike", "range_mae", "high_low_mae")
            for who in ("network", "served", "fitted", "validation")} <= row.keys()
    assert 0 < row["range_qlike_p_bar"] < 1 and 0 < row["range_mae_p_harx"] < 1
    assert results["overall"]["targets"]  # checked against the bar (the figures at this size mean nothing)
    assert results["overall"]["significant"]["range_qlike_bar"]["n"] == 1
    # each seed trained its own network: the figures differ, and their spread is said
    assert results["seeds"] == [42, 43] and [run["seed"] for run in results["by_seed"]] == [42, 43]
    seeds = results["across_seeds"]["range_qlike_network"]
    assert len(set(seeds["medians"])) == 2 and seeds["spread"] > 0
    # the shrink's significance rule checked on validation alone, from a kept run's models
    rule = tmp_path / "shrink-rule.json"
    assert benchmark("bench_shrink_rule").main([str(tmp_path / "run" / "seed-42" / "run"), "--json", str(rule)]) == 0
    shrink = written(rule)
    assert [job["job"] for job in shrink["jobs"]] == ["BTCUSDT_1h"]
    assert all(rules.keys() == {"each half", "mean only", "none"} for rules in shrink["summary"].values())


@pytest.mark.train
@pytest.mark.bench
def test_bench_throughput(tmp_path):
    out = tmp_path / "throughput.json"
    benchmark("bench_throughput").main(["--families", "v7", "--batch-sizes", "16", "--budget", "0.05",
                                        "--repeats", "1", "--no-variants", "--peak-repeats", "1", "--json", str(out)])
    [family] = written(out)["families"]
    assert family["family"] == "v7" and [row["batch_size"] for row in family["by_batch_size"]] == [16]
    assert family["by_batch_size"][0]["samples_per_s"] > 0


@pytest.mark.train
@pytest.mark.bench
def test_bench_run(tmp_path):
    out = tmp_path / "run.json"
    benchmark("bench_run").main(["--data", str(CANDLES_DIR), "--jobs", "1", "--epochs", "1", "--rows", "600",
                                 "--json", str(out)])
    results = written(out)
    assert [row["job"] for row in results["ours"]] == [row["job"] for row in results["old"]] == ["BTCUSDT_1h"]
    assert results["speedup"] > 0


def test_bench_family_config_of_one_coin_keeps_its_market_references(tmp_path):
    """A subset of the family's jobs (BTCUSDT's two) is trained with the config's market input over the other series
    of --data, as the family's run has it: not narrowed to the subset's symbols, where BTCUSDT has no reference."""
    from trainer.config import validate_config

    bench = benchmark("bench_family")
    jobs = bench.family_jobs("v7", CANDLES_DIR, 2)
    assert jobs == ["BTCUSDT_15m", "BTCUSDT_1h"]
    cfg = validate_config(bench.family_config("v7", CANDLES_DIR, 3, tmp_path / "run", tmp_path / "cache"),
                          tmp_path / "v7.yaml")
    assert cfg.features.market.references(cfg.data.symbols, "BTCUSDT") == ["ETHUSDT", "DOGEUSDT", "SOLUSDT"]
    assert cfg.train.epochs == 3 and cfg.train.early_stopping is None


@pytest.mark.train
@pytest.mark.bench
def test_bench_family(tmp_path):
    out = tmp_path / "family.json"
    benchmark("bench_family").main(["--family", "quickstart", "--max-jobs", "1", "--epochs", "2", "--host-compare",
                                    "--json", str(out)])
    results = written(out)
    assert results["jobs"] == ["BTCUSDT_15m"] and results["engine"]["name"] == "tensorflow"
    assert len(results["epoch_seconds"]) == 2 and results["train_seconds"] > 0 and results["prepare_seconds"] > 0
    names = ("prepare", "compile", "train", "build_forecast", "evaluate", "write", "rest")
    assert sum(results[f"{name}_seconds"] for name in names) == pytest.approx(results["total_seconds"], abs=0.05)
    assert 0 < results["overhead_share"] < 1 and results["one_job_windows_per_s"] > 0
    compared = results["host_compare"]  # a run of one job: host work one at a time either way, the same figures
    assert compared["differences"] == [] and compared["speedup"] > 0 and results["host_workers"] == 1
