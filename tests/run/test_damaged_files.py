"""Nothing the tool reads back from a job's backup directory or from the caches can fail a job: garbage in place of
a checkpoint (the latest, both), a truncated one, one whose weights, best weights or epoch rows are not the model's,
garbage in place of a cache entry; and the same command still finishes the job, with one warning naming the file
and what the job does instead (the checkpoint before, a fresh start, the entry recomputed)."""
from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import tiny_config_dict
from trainer.cli import main

pytestmark = pytest.mark.train  # a trained run, its files damaged, trained again

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


def _checkpoint(tmp: Path, name: str = "checkpoint.npz") -> Path:
    return tmp / "run" / ".backup" / JOB / name


def _garbage(path: Path) -> None:
    path.write_bytes(GARBAGE)


def _truncated(path: Path) -> None:
    """As a write cut short by a crash without an atomic rename would leave it."""
    content = path.read_bytes()
    path.write_bytes(content[:len(content) // 2])


def _replaced(**replacements):
    """A whole checkpoint with some of its entries replaced (arrays of the wrong shape, rows that do not parse)."""
    def damage(path: Path) -> None:
        with np.load(path) as saved:
            arrays = {name: saved[name] for name in saved.files}
        np.savez(path, **{**arrays, **replacements})
    return damage


def _of_an_earlier_version(path: Path) -> None:
    """A checkpoint as cryptotrain wrote it before 2026-11-26: weights, optimizer state and epoch only (the epochs'
    rows were in state.json beside it, early stopping's best weights in files of their own)."""
    with np.load(path) as saved:
        arrays = {name: saved[name] for name in saved.files if name != "rows" and not name.startswith("b")}
    np.savez(path, **arrays)
    (path.parent / "state.json").write_text("[]")


def _forget_the_job(run_dir: Path) -> None:
    """As if the process had been killed after training, before the job's files were committed."""
    shutil.rmtree(run_dir / "jobs" / JOB)
    with sqlite3.connect(run_dir / "ledger.sqlite") as db:
        db.execute("UPDATE jobs SET status = 'pending', manifest_sha256 = NULL WHERE name = ?", (JOB,))


EXTEND = ("--set", "train.epochs=3")  # a finished job goes on from its latest checkpoint
WRONG_SHAPE = np.zeros((2, 3), np.float32)
PREVIOUS = "going on after epoch 1 (checkpoint.previous.npz)"  # the latest is epoch 2's


class Damage(NamedTuple):
    files: Callable[[Path], list[Path]]  # in the copied directories
    damage: Callable[[Path], None]  # done to each
    trigger: str  # how the rerun comes to read them: extend (a longer budget) or forget (the job's files lost)
    epochs: list[int]  # the job's, after the rerun
    said: str  # in the one warning
    fallback: str  # what the warning ends with: what the job does instead


def _latest(tmp: Path) -> list[Path]:
    return [_checkpoint(tmp)]


KINDS = {
    "latest checkpoint": Damage(_latest, _garbage, "extend", [1, 2, 3], "checkpoint.npz unusable (", PREVIOUS),
    "latest checkpoint of a finished job": Damage(_latest, _garbage, "forget", [1, 2], "checkpoint.npz unusable (",
                                                  PREVIOUS),
    "both checkpoints": Damage(lambda tmp: [_checkpoint(tmp), _checkpoint(tmp, "checkpoint.previous.npz")], _garbage,
                               "extend", [1, 2, 3], "checkpoint.npz unusable (",
                               "training this job from its first epoch"),
    "truncated checkpoint": Damage(_latest, _truncated, "extend", [1, 2, 3], "checkpoint.npz unusable (", PREVIOUS),
    "weights of the wrong shape": Damage(_latest, _replaced(w0=WRONG_SHAPE), "extend", [1, 2, 3],
                                         "checkpoint.npz unusable (ValueError: weight ", PREVIOUS),
    "best weights of the wrong shape": Damage(_latest, _replaced(b0=WRONG_SHAPE), "extend", [1, 2, 3],
                                              "checkpoint.npz unusable (ValueError: best weight ", PREVIOUS),
    "epoch rows": Damage(_latest, _replaced(rows=np.asarray("[{")), "extend", [1, 2, 3],
                         "checkpoint.npz unusable (ValidationError: ", PREVIOUS),
    "a backup of an earlier version": Damage(
        lambda tmp: [_checkpoint(tmp), _checkpoint(tmp, "checkpoint.previous.npz")], _of_an_earlier_version,
        "extend", [1, 2, 3], "checkpoint.npz unusable (ValueError: written by a cryptotrain before 2026-11-26",
        "training this job from its first epoch"),
    "feature cache entry": Damage(lambda tmp: [next((tmp / "cache" / "features").iterdir())], _garbage, "forget",
                                  [1, 2], "is damaged", "recomputing it"),
    "parsed candles cache entry": Damage(lambda tmp: [next((tmp / "cache" / "candles" / "parsed").iterdir())],
                                         _garbage, "forget", [1, 2], "is damaged", "recomputing it"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_damage_to_a_file_the_tool_reads_back_never_fails_the_job(finished, tmp_path, caplog, kind):
    case = KINDS[kind]
    for part in ("run", "cache"):
        shutil.copytree(finished / part, tmp_path / part)
    config = _config(tmp_path)
    damaged = case.files(tmp_path)
    for path in damaged:
        assert path.is_file()
        case.damage(path)
    if case.trigger == "forget":
        _forget_the_job(tmp_path / "run")

    for attempt in range(2):  # and the run after it has nothing left to warn about
        with caplog.at_level(logging.WARNING, logger="trainer"):
            caplog.clear()
            result = _run(config, *(EXTEND if case.trigger == "extend" else ()))
        assert result.exit_code == 0, result.output
        warnings = [r.getMessage() for r in caplog.records
                    if r.name.startswith("trainer.") and r.levelno >= logging.WARNING]
        if attempt == 0:
            assert len(warnings) == 1 and case.said in warnings[0], warnings
            assert all(path.name in warnings[0] for path in damaged), warnings
            assert warnings[0].endswith(case.fallback), warnings
        else:
            assert warnings == []
    with sqlite3.connect(tmp_path / "run" / "ledger.sqlite") as db:
        assert db.execute("SELECT status FROM jobs WHERE name = ?", (JOB,)).fetchone() == ("done",)
    assert pd.read_csv(tmp_path / "run" / "jobs" / JOB / "history.csv")["epoch"].tolist() == case.epochs
    if case.trigger == "forget" and not any(".backup" in path.parts for path in damaged):
        # its checkpoint says that training had ended: trained no further, the same model as before the damage
        before, after = (json.loads((root / "run" / "jobs" / JOB / "metrics.json").read_text())
                         for root in (finished, tmp_path))
        assert after["heads"] == before["heads"]
