"""`cryptotrain plan`: the job matrix, model size and cuDNN eligibility, without training."""
from __future__ import annotations

from click.testing import CliRunner

from trainer.cli import main


def test_plan_of_a_real_family_lists_jobs_and_model_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["plan", "--config", "v8_stable", "--timeframes", "15m"],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "v8_stable: 20 jobs" in result.output
    assert "1,419,029 parameters" in result.output
    assert "BTCUSDT_15m" in result.output and "APEUSDT_15m" in result.output and "BTCUSDT_1h" not in result.output
    assert "heads: ohlc (open, high, low, close)" in result.output
    assert list(tmp_path.iterdir()) == []  # planning writes nothing


def test_plan_names_the_setting_that_keeps_a_layer_off_cudnn(tiny_config):
    path = tiny_config()
    result = CliRunner().invoke(main, ["plan", "--config", str(path), "--set",
                                       "model.layers.0={kind: lstm, units: 8, recurrent_dropout: 0.2}"],
                                 terminal_width=200)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "model.layers[0]" in line)
    assert "no" in row and "recurrent_dropout" in row
    eligible = next(line for line in result.output.splitlines() if "model.layers[3]" in line)
    assert "yes" in eligible
