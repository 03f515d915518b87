"""`cryptotrain features`: every job's features precomputed into the cache, hits and misses printed,
a failing job reported on its own line and in the exit code."""
from __future__ import annotations

from click.testing import CliRunner

from trainer.cli import main


def test_features_command_computes_then_hits(tiny_config):
    config = str(tiny_config())
    runner = CliRunner()

    first = runner.invoke(main, ["features", "--config", config])
    assert first.exit_code == 0, first.output
    assert "BTCUSDT_1h: computed, 581 rows x 9 columns <- local:" in first.output  # 600 rows - 19 warm-up
    assert "ETHUSDT_1h: computed" in first.output
    assert "features: 0 cache hits, 2 misses, 0 failed" in first.output

    second = runner.invoke(main, ["features", "--config", config, "--only", "ETH*"])
    assert second.exit_code == 0, second.output
    assert "ETHUSDT_1h: cache hit" in second.output and "BTCUSDT" not in second.output
    assert "features: 1 cache hits, 0 misses, 0 failed" in second.output


def test_features_command_reports_a_failing_job_and_goes_on(tiny_config):
    config = str(tiny_config())
    result = CliRunner().invoke(main, ["features", "--config", config, "--set", "data.symbols=[NOPEUSDT, BTCUSDT]"])
    assert result.exit_code == 1
    assert "NOPEUSDT_1h: FAILED: local:" in result.output and "NOPEUSDT_1h.csv.gz: no such file" in result.output
    assert "BTCUSDT_1h: computed" in result.output
    assert "features: 0 cache hits, 1 misses, 1 failed" in result.output


def test_features_command_labels_synthetic_candles(tiny_config):
    config = str(tiny_config())
    result = CliRunner().invoke(main, ["features", "--config", config, "--set", "data.source=synthetic",
                                       "--only", "BTCUSDT"])
    assert result.exit_code == 0, result.output
    assert "BTCUSDT_1h: computed, 581 rows x 9 columns <- synthetic(seed=7)" in result.output
