"""A run directory (trainer/run/rundir.py) owns its ledger and the config its run recorded: a run opened with another
config is refused naming what changed, or moved aside with --new-run."""
from __future__ import annotations

import pytest

from trainer.config import load_config
from trainer.errors import UserError
from trainer.run.rundir import RunDir


def test_a_changed_config_is_refused_naming_the_changed_keys(tiny_config):
    path = tiny_config()
    original = load_config(path)
    with RunDir.create(original):
        pass
    with RunDir.create(original):  # the same config: fine
        pass

    changed = load_config(path, ["train.epochs=5", "data.symbols=[BTCUSDT]", "window.lookback=8"])
    with pytest.raises(UserError) as refused:
        RunDir.create(changed)
    message = str(refused.value)
    assert message.startswith(f"{original.run_dir}: made with a different config (changed: ")
    assert "window.lookback 16 -> 8" in message and "data.symbols" in message
    assert "train.epochs" not in message  # the training budget may change: the run is extended, not replaced
    assert "train.seed" not in message and "--new-run" in message and "\n" not in message
    with RunDir.create(original):  # the recorded config is unchanged
        pass


def test_long_change_lists_are_cut_short(tiny_config):
    path = tiny_config()
    with RunDir.create(load_config(path)):
        pass
    many = load_config(path, ["model.layers.0.units=4", "model.layers.3.units=6", "train.learning_rate=0.1",
                              "train.seed=2", "train.batch_size=8", "window.lookback=12", "window.horizon=2"])
    with pytest.raises(UserError) as refused:
        RunDir.create(many)
    message = str(refused.value)
    assert "model.layers[0].units 8 -> 4" in message
    assert message.count(" -> ") == 5 and message.endswith("+2 more); run with --new-run to start over")


def test_new_run_moves_a_run_of_another_config_aside_and_says_where(tiny_config):
    path = tiny_config()
    original = load_config(path)
    with RunDir.create(original) as run:
        run.ledger.add_jobs(["BTCUSDT_1h"])
    notes = []
    with RunDir.create(load_config(path, ["window.lookback=8"]), new_run=True, note=notes.append) as run:
        assert run.ledger.jobs() == []
    [kept] = [p for p in original.run_dir.parent.iterdir() if p.name.startswith(f"{original.run_dir.name}-")]
    assert notes == [f"Config changed: the previous run was moved to {kept}"]
    with RunDir.open(kept) as old:
        assert [r.name for r in old.ledger.jobs()] == ["BTCUSDT_1h"]  # kept, nothing lost
