"""A job directory has one owner, trainer/run/jobdir.py: the only module of trainer/ that spells its files' names,
and the one that refuses, in one line, directories of another format than its own (an earlier one is trained
again by `run`)."""
from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import CANDLES_DIR
from trainer.cli import main
from trainer.errors import UserError
from trainer.run import jobdir
from trainer.run.jobdir import FORMAT, JobDir

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
JOB_FILES = ("model.keras", "preprocessing.json", "metrics.json", "history.csv", "config.yaml", "predictions.npz",
             "har.json", "serving.json", "manifest.json")
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


@pytest.mark.parametrize("found, why", [
    (FORMAT + 1, f"newer than this cryptotrain reads (format {FORMAT}); upgrade cryptotrain to use it"),
    (2, f"written by an earlier cryptotrain; this one reads format {FORMAT} only: train the job again "
        "(`cryptotrain run` of its config does)"),
    (None, f"written by an earlier cryptotrain; this one reads format {FORMAT} only: train the job again "
           "(`cryptotrain run` of its config does)"),  # format 1's manifest named none
])
def test_a_job_directory_of_another_format_is_refused_in_one_line(tmp_path, found, why):
    job = tmp_path / "BTCUSDT_1h"
    job.mkdir()
    (job / "preprocessing.json").write_text("{}")
    (job / "manifest.json").write_text(json.dumps({**({} if found is None else {"format": found}), "files": {}}))
    line = f"{job}: a job directory of format {found or 1}, {why}"

    with pytest.raises(UserError) as refused:
        JobDir(job).metrics()
    assert str(refused.value) == line
    result = CliRunner().invoke(main, ["predict", "--model", str(job), "--data",
                                       str(CANDLES_DIR / "BTCUSDT_1h.csv.gz")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"error: {line}"]


@pytest.mark.train
def test_run_trains_a_job_of_an_earlier_format_again(trained_run, tmp_path):
    """A finished job whose directory an earlier cryptotrain wrote (its ledger and manifest agree, as they did
    then): the same command trains it again, saying why, and leaves the other job as it was."""
    run_dir, config, _ = trained_run.copy(tmp_path)
    old, kept = jobdir.JobDir(run_dir / "jobs" / "BTCUSDT_1h"), run_dir / "jobs" / "ETHUSDT_1h" / "manifest.json"
    manifest = json.loads((old.path / "manifest.json").read_text())
    (old.path / "manifest.json").write_text(json.dumps({**manifest, "format": 2}))
    with sqlite3.connect(run_dir / "ledger.sqlite") as ledger:  # as that cryptotrain recorded it
        ledger.execute("UPDATE jobs SET manifest_sha256 = ? WHERE name = 'BTCUSDT_1h'", (old.verify(),))
    before = kept.read_bytes()

    result = CliRunner().invoke(main, ["run", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "BTCUSDT_1h: written by an earlier cryptotrain (job directory format 2); training it again" in result.output
    assert jobdir.JobDir(old.path).format == FORMAT and kept.read_bytes() == before
