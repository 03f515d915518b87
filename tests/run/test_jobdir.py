"""A job directory has one owner, trainer/run/jobdir.py: the only module of trainer/ that spells its files' names,
and the one that reads directories of an earlier format (upgraded) and refuses those of a newer one."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.conftest import CANDLES_DIR
from trainer.cli import main
from trainer.data.scalers import Scaler
from trainer.errors import UserError
from trainer.run import jobdir
from trainer.run.jobdir import FORMAT, JobDir, JobFileError

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
JOB_FILES = ("model.keras", "preprocessing.json", "metrics.json", "history.csv", "config.yaml", "plot.png",
             "predictions.npz", "har.json", "manifest.json")
# config.yaml is also the run directory's own file (the config its run saved), named by run/rundir.py.
ALSO = {"config.yaml": {"trainer/run/rundir.py"}}


def spelled(root: Path = TRAINER) -> dict[str, set[str]]:
    """Job file name -> the modules of trainer/ whose code spells it in a string (docstrings and comments, which
    only talk about the files, aside)."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for name in JOB_FILES:
                    if name in node.value:
                        found.setdefault(name, set()).add(str(path.relative_to(root.parent)))
    return found


def test_each_job_file_name_is_spelled_in_jobdir_alone():
    found = spelled()
    assert set(found) == set(JOB_FILES)  # the scan sees them: jobdir.py names every one
    strays = {name: modules - {"trainer/run/jobdir.py"} - ALSO.get(name, set()) for name, modules in found.items()}
    assert not any(strays.values()), f"job file names spelled outside trainer/run/jobdir.py: {strays}"


def test_the_scan_finds_a_name_in_code_but_not_in_a_docstring(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "a.py").write_text('"""reads metrics.json"""\nNAME = f"{1}/history.csv"\n')
    assert spelled(tmp_path / "trainer") == {"history.csv": {"trainer/a.py"}}


def format_1(tmp_path: Path, **files: dict) -> JobDir:
    """A job directory of format 1 (its manifest has no format) holding these JSON files (name: content)."""
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {}}))
    return JobDir(tmp_path)


def test_a_preprocessing_file_of_format_1_reads_as_absolute_levels(tmp_path):
    """Run directories made before framing existed: one scaler for inputs and targets, no relative_to.
    (Formerly test_windows.py's test_a_preprocessing_file_of_an_earlier_version_reads_as_absolute_levels.)"""
    frame = pd.read_csv(CANDLES_DIR / "BTCUSDT_1h.csv.gz", nrows=100)
    scaler = Scaler.of("standard").fit(["open", "high", "low", "close"], frame[["open", "high", "low", "close"]]
                                       .to_numpy())
    old = {"input_columns": list(scaler.columns), "scaler": scaler.to_dict(), "lookback": 16, "horizon": 3,
           "heads": [{"name": "close", "columns": ["close"], "target_shape": [3, 1]}], "splits": {},
           "symbol": "BTCUSDT", "timeframe": "1h"}
    prep = format_1(tmp_path, preprocessing=old).preprocessing()
    assert prep.relative_to is None and not prep.heads[0].candle and prep.heads[0].shrink == 1.0
    outputs = np.random.default_rng(0).normal(size=(5, 3, 1))
    np.testing.assert_allclose(prep.to_prices({"close": outputs}, np.ones(5))["close"],
                               scaler.inverse(outputs, ["close"]), rtol=1e-15)


METRICS_1 = {
    "job": "BTCUSDT_1h", "symbol": "BTCUSDT", "timeframe": "1h", "run": "tiny", "fingerprint": "f" * 64,
    "data": {"source": "local", "synthetic": False, "first": "2024-01-01T00:00:00+00:00",
             "last": "2024-01-26T00:00:00+00:00", "rows": 600, "gaps": 0},
    "epochs_run": 2, "best_epoch": 2, "best_val_loss": 0.7, "seconds": 3.5, "n_test": 20,
    "test_range": ["2024-01-22T00:00:00", "2024-01-26T00:00:00"],
    "heads": {"ohlc": {"model": {"mae": 101.5, "rmse": 150.25, "mape": 0.31, "direction_accuracy": 0.52},
                       "persistence": {"mae": 120.0, "rmse": 150.25, "mape": 0.31, "direction_accuracy": 0.52},
                       "skill": 0.154}}}


def test_a_metrics_file_of_format_1_gets_its_headline_and_one_of_format_2_must_hold_it(tmp_path):
    """Before headlines: the first head's skill over its columns. The upgrade is format 1's only: a file of this
    format without a headline is no metrics.json."""
    line = format_1(tmp_path, metrics=METRICS_1).metrics().headline
    assert (line.head, line.skill, line.mae, line.persistence_mae) == ("ohlc", 0.154, 101.5, 120.0)

    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "files": {}}))
    with pytest.raises(JobFileError, match=r"metrics.json: cannot be read \(ValidationError: headline: Field "
                                           r"required\); train the job again"):
        JobDir(tmp_path).metrics()


def test_every_upgrade_is_of_an_earlier_format_and_of_a_file_of_the_job():
    assert all(1 <= version < FORMAT for version in jobdir.UPGRADES)
    assert {name for steps in jobdir.UPGRADES.values() for name in steps} <= set(JOB_FILES)


def test_a_job_directory_of_a_newer_format_is_refused_in_one_line(tmp_path):
    job = tmp_path / "BTCUSDT_1h"
    job.mkdir()
    (job / "preprocessing.json").write_text("{}")
    (job / "manifest.json").write_text(json.dumps({"format": FORMAT + 1, "files": {}}))
    line = (f"{job}: a job directory of format {FORMAT + 1}, newer than this cryptotrain reads (format {FORMAT} "
            "and earlier); upgrade cryptotrain to use it")

    with pytest.raises(UserError) as refused:
        JobDir(job).metrics()
    assert str(refused.value) == line
    result = CliRunner().invoke(main, ["predict", "--model", str(job), "--data",
                                       str(CANDLES_DIR / "BTCUSDT_1h.csv.gz")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"error: {line}"]
