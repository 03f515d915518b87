"""Nothing the tool reads back from a job's backup directory or from the caches can fail a job: garbage in place of
each kind of file there, and the same command still finishes the job, with one warning naming the file and what
the job does instead (the checkpoint before, a fresh start, the entry recomputed)."""
from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import tiny_config_dict
from trainer.cli import main

JOB = "BTCUSDT_1h"
GARBAGE = b"not what cryptotrain wrote here\n" * 40


def _config(directory: Path) -> Path:
    data = tiny_config_dict(directory)
    data["data"]["symbols"] = ["BTCUSDT"]
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(config: Path, *args: str):
    return CliRunner().invoke(main, ["run", "--config", str(config), *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One real job run to the end (2 epochs): its run directory, backup directory and caches, to copy."""
    directory = tmp_path_factory.mktemp("finished")
    result = _run(_config(directory))
    assert result.exit_code == 0, result.output
    return directory


def _best_weights_named_last(backup: Path) -> Path:
    """The best weights that the last epoch's row of state.json names."""
    last = json.loads((backup / "state.json").read_text())[-1]
    return backup / f"best_weights_epoch{last['early_stopping']['best_epoch'] + 1}.npz"


def _forget_the_job(run_dir: Path) -> None:
    """As if the process had been killed after training, before the job's files were committed."""
    shutil.rmtree(run_dir / "jobs" / JOB)
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        db.execute("UPDATE jobs SET status = 'pending', manifest_sha256 = NULL WHERE name = ?", (JOB,))


EXTEND = ("--set", "train.epochs=3")  # a finished job goes on from its backup: checkpoint, state, best weights
# kind: (the damaged file, how the rerun comes to read it, the epochs the job then has, what the warning says)
KINDS = {
    "finished weights": (lambda tmp: tmp / "run" / ".backup" / JOB / "finished_weights.npz", "forget", [1, 2],
                         "finished_weights.npz unusable (ValueError: "),
    "checkpoint": (lambda tmp: tmp / "run" / ".backup" / JOB / "checkpoint.npz", "extend", [1, 2, 3],
                   "checkpoint.npz unusable ("),
    "best weights": (lambda tmp: _best_weights_named_last(tmp / "run" / ".backup" / JOB), "extend", [1, 2, 3],
                     "checkpoint.npz unusable (ValueError: its best weights best_weights_epoch"),
    "state": (lambda tmp: tmp / "run" / ".backup" / JOB / "state.json", "extend", [1, 2, 3],
              "state.json unusable ("),
    "feature cache entry": (lambda tmp: next((tmp / "cache" / "features").iterdir()), "forget", [1, 2],
                            "is damaged"),
    "parsed candles cache entry": (lambda tmp: next((tmp / "cache" / "candles" / "parsed").iterdir()), "forget",
                                   [1, 2], "is damaged"),
}
FALLBACK = {"finished weights": "going on after epoch 2 (checkpoint.npz)",
            "checkpoint": "going on after epoch 1 (checkpoint.previous.npz)",
            "best weights": "going on after epoch 1 (checkpoint.previous.npz)",
            "state": "training this job from its first epoch",
            "feature cache entry": "recomputing it", "parsed candles cache entry": "recomputing it"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_garbage_in_place_of_a_file_the_tool_reads_back_never_fails_the_job(finished, tmp_path, caplog, kind):
    damaged_path, trigger, epochs, said = KINDS[kind]
    for part in ("run", "cache"):
        shutil.copytree(finished / part, tmp_path / part)
    config = _config(tmp_path)
    damaged = damaged_path(tmp_path)
    assert damaged.is_file()
    damaged.write_bytes(GARBAGE)
    if trigger == "forget":
        _forget_the_job(tmp_path / "run")

    for attempt in range(2):  # and the run after it has nothing left to warn about
        with caplog.at_level(logging.WARNING, logger="trainer"):
            caplog.clear()
            result = _run(config, *(EXTEND if trigger == "extend" else ()))
        assert result.exit_code == 0, result.output
        warnings = [r.getMessage() for r in caplog.records
                    if r.name.startswith("trainer.") and r.levelno >= logging.WARNING]
        if attempt == 0:
            assert len(warnings) == 1 and damaged.name in warnings[0] and said in warnings[0], warnings
            assert warnings[0].endswith(FALLBACK[kind]), warnings
        else:
            assert warnings == []
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        assert db.execute("SELECT status FROM jobs WHERE name = ?", (JOB,)).fetchone() == ("done",)
    assert pd.read_csv(tmp_path / "run" / "jobs" / JOB / "history.csv")["epoch"].tolist() == epochs
    if trigger == "forget":  # trained no further: the same model as before the damage
        before, after = (json.loads((root / "run" / "jobs" / JOB / "metrics.json").read_text())
                         for root in (finished, tmp_path))
        assert after["heads"] == before["heads"]
