"""Pushing to and downloading from the Hub: the real huggingface_hub client against tests/hub_server.py.

Job directories are fabricated with trainer.run.artifacts (the same writer the runner uses), holding small
files of the real kinds: a binary model file (stored in LFS), JSON, CSV, YAML and an .npz (a push adds a PNG).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from conftest import CANDLES_DIR, tiny_config_dict
from hub_server import record_sleeps, serve_hub
from huggingface_hub import constants

import trainer.publish.hub as hub_module
from trainer.cli import main
from trainer.config import HubConfig
from trainer.errors import JobError, UserError
from trainer.files import write_json
from trainer.publish.hub import download_job, push_jobs, push_run
from trainer.publish.plots import job_plot
from trainer.run import runner
from trainer.run.artifacts import commit, jobs_dir, seal, staging_dir
from trainer.run.jobdir import JobDir
from trainer.run.ledger import Ledger
from trainer.run.rundir import RunDir

TOKEN = "hf_SeCrEtTeStToKeN0123456789abcdef"
REPO = "tester/cpb-tiny"
JOBS = ["BTCUSDT_1h", "ETHUSDT_1h"]


def push_run_at(run_dir: Path, **options) -> dict:
    """push_run of the run directory, opened as `cryptotrain push` opens it."""
    with RunDir.open(run_dir, config_required=True) as run:
        return push_run(run, **options)


def push_jobs_at(run_dir: Path, *args, **options) -> dict:
    with RunDir.open(run_dir, config_required=True) as run:
        return push_jobs(run, *args, **options)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A local Hub, and the client pointed at it with a valid token."""
    monkeypatch.setattr(hub_module, "BACKOFF_SECONDS", 0.01)
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as server:
        yield server


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with two finished jobs, laid out as the runner writes them."""
    cfg = tiny_config_dict(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    Ledger(run).add_jobs(JOBS)
    for i, name in enumerate(JOBS):
        make_job(run, name, cfg, seed=i)
    return run


@functools.cache
def model_file(seed: int) -> bytes:
    """A small real model.keras (a Keras zip: config.json, metadata.json, model.weights.h5)."""
    import io

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16, 5)), keras.layers.LSTM(4), keras.layers.Dense(3)])
    with tempfile.TemporaryDirectory() as tmp:
        model.save(Path(tmp) / "model.keras")
        return io.BytesIO((Path(tmp) / "model.keras").read_bytes()).getvalue()


def make_job(run, name, cfg, seed, headline=None):
    """A finished job's files, laid out as the runner writes them (the current format): a real model.keras, made-up
    scores and forecasts of the real shapes; `headline`: metrics.json's (default: ohlc.close, skill 0.154)."""
    symbol, timeframe = name.split("_")
    rng = np.random.default_rng(seed)
    stage = staging_dir(run, name)
    (stage / "model.keras").write_bytes(model_file(seed))
    n = 20
    times = np.datetime64("2024-01-22T00:00", "ns") + np.arange(n) * np.timedelta64(1, "h")
    close = 40_000 + rng.normal(0, 100, n).cumsum()
    np.savez(stage / "predictions.npz", target_times=times, ohlc=close[:, None, None] + rng.normal(size=(n, 3, 4)),
             bb=rng.normal(size=(n, 3, 2)), actual_close=close[:, None] + rng.normal(size=(n, 3)),
             persistence_close=close)
    (stage / "history.csv").write_text("epoch,loss,val_loss\n1,0.9,1.0\n2,0.5,0.7\n")
    (stage / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    columns = ["open", "high", "low", "close", "rsi"]

    def scaler(names: list[str]) -> dict:
        return {"kind": "standard", "columns": names, "offset": [0.0] * len(names), "scale": [2.0] * len(names)}

    write_json(stage / "preprocessing.json", {
        "input_columns": columns, "lookback": 16, "horizon": 3, "relative_to": "last_close", "scaler": scaler(columns),
        "heads": [{"kind": "candle", "name": "ohlc", "columns": columns[:4], "loss": "mse", "weight": 1.0,
                   "target_shape": [3, 4], "shrink": 1.0, "scaler": scaler(columns[:4])}],
        "splits": {}, "symbol": symbol, "timeframe": timeframe, "indicators": [], "market": []})
    scores = {"mae": 101.5 + seed, "rmse": 150.25, "mape": 0.31, "direction_accuracy": 0.52}
    write_json(stage / "metrics.json", {
        "job": name, "symbol": symbol, "timeframe": timeframe, "run": "tiny", "fingerprint": "f" * 64,
        "data": {"source": f"local:/home/me/private/{name}.csv.gz", "synthetic": False,
                 "first": "2024-01-01T00:00:00+00:00", "last": "2024-01-26T00:00:00+00:00", "rows": 600, "gaps": 0},
        "epochs_run": 2, "best_epoch": 2, "best_val_loss": 0.7, "seconds": 3.5, "n_test": n,
        "test_range": ["2024-01-22T00:00:00.000000000", "2024-01-26T00:00:00.000000000"],
        "heads": {"ohlc": {"model": scores, "persistence": {**scores, "mae": 120.0}, "skill": 0.154}},
        "headline": headline or {"head": "ohlc", "column": "close", "skill": 0.154, "mae": scores["mae"],
                                 "persistence_mae": 120.0}})
    seal(stage)
    commit(stage, jobs_dir(run) / name)


def local_files(run, name):
    job_dir = jobs_dir(run) / name
    return {p.name: p.read_bytes() for p in job_dir.iterdir()}


def test_push_run_commits_every_job_once_and_a_second_push_changes_nothing(hub, run_dir):
    pushed = push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())

    assert hub.repos[REPO].private
    assert len(hub.commits(REPO)) == 1
    remote = hub.files(REPO)
    for name in JOBS:
        folder = name.replace("_", "/")
        for file, content in local_files(run_dir, name).items():
            assert remote[f"{folder}/{file}"] == content, file
        assert f"{folder}/README.md" in remote
        assert hub.repos[REPO].head.files[f"{folder}/model.keras"].lfs  # binary: through LFS, not inline
    head = hub.repos[REPO].head.oid
    records = {job.name: job for job in Ledger(run_dir).jobs()}
    assert {(records[n].pushed_repo, records[n].pushed_commit) for n in JOBS} == {(REPO, head)}
    assert sorted(pushed) == JOBS and all(head in p["url"] and p["commit"] == head for p in pushed.values())

    calls_before = dict(hub.calls)
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert len(hub.commits(REPO)) == 1  # nothing changed: no commit, nothing uploaded
    assert hub.calls["commit"] == calls_before["commit"]
    assert hub.calls["lfs_upload"] == calls_before["lfs_upload"]


def test_a_job_whose_files_changed_is_pushed_with_its_plot_drawn_again(hub, run_dir):
    # a push draws a job's plot once a process for the same files (plots.job_plot): not for changed ones
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    before = hub.files(REPO)["BTCUSDT/1h/plot.png"]
    job = JobDir(jobs_dir(run_dir) / "BTCUSDT_1h")
    (job.path / "history.csv").write_text("epoch,loss,val_loss\n1,0.9,1.0\n2,0.5,0.7\n3,0.3,0.6\n")
    job.write_manifest()
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert hub.files(REPO)["BTCUSDT/1h/plot.png"] != before
    assert hub.files(REPO)["ETHUSDT/1h/plot.png"] == job_plot(JobDir(jobs_dir(run_dir) / "ETHUSDT_1h"))


def test_cards_hold_metadata_metrics_and_usage(hub, run_dir):
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    files = hub.files(REPO)

    card = files["BTCUSDT/1h/README.md"].decode()
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["library_name"] == "keras"
    assert metadata["pipeline_tag"] == "time-series-forecasting"
    assert {"BTCUSDT", "1h"} <= set(metadata["tags"])
    assert metadata["cryptotrain"]["data"]["first"] == "2024-01-01T00:00:00+00:00"
    assert metadata["cryptotrain"]["data"]["last"] == "2024-01-26T00:00:00+00:00"
    assert "| ohlc | model | 101.5 |" in card and "| ohlc | persistence | 120 |" in card
    assert "0.154" in card  # skill
    assert f"--model hf://{REPO}/BTCUSDT/1h" in card
    assert "max_rows: 600" in card  # the config
    assert "/home/me/private" not in card and "output_dir" not in card  # nothing about the training machine
    assert str(CANDLES_DIR) not in card and "path: ohlcv" in card  # the candles' directory by its own name only
    assert metadata["cryptotrain"]["data"]["source"] == "local:BTCUSDT_1h.csv.gz"
    assert metadata["cryptotrain"]["test_range"] == ["2024-01-22T00:00:00+00:00", "2024-01-26T00:00:00+00:00"]

    assert metadata["license"] == "mit" and "datasets" not in metadata  # local candles: no Hub dataset
    [index] = metadata["model-index"]
    assert index["name"] == "tiny-BTCUSDT_1h"
    results = {(m["name"], m["value"]) for r in index["results"] for m in r["metrics"]}
    assert ("MAE of ohlc.close (price units)", 101.5) in results
    assert ("skill vs persistence (1 - MAE / persistence MAE)", 0.154) in results
    assert {r["dataset"]["split"] for r in index["results"]} == {"test"}
    assert "pip install" in card and "pypi" not in card

    run_card = files["README.md"].decode()
    assert yaml.safe_load(run_card.split("---\n")[1])["library_name"] == "keras"
    assert "| BTCUSDT_1h | [BTCUSDT/1h](./BTCUSDT/1h) |" in run_card
    assert "| ETHUSDT_1h | [ETHUSDT/1h](./ETHUSDT/1h) |" in run_card


def test_a_card_names_the_hub_dataset_its_candles_came_from_and_the_configured_license(hub, run_dir):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["data"] = {**cfg["data"], "source": "hf", "hf": {"repo_id": "someone/candles"}}
    make_job(run_dir, "BTCUSDT_1h", cfg, seed=0)
    push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO, license="apache-2.0", install="pip install mine"))
    card = hub.files(REPO)["BTCUSDT/1h/README.md"].decode()
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["datasets"] == ["someone/candles"] and metadata["license"] == "apache-2.0"
    assert {r["dataset"]["type"] for r in metadata["model-index"][0]["results"]} == {"someone/candles"}
    assert "pip install mine\ncryptotrain predict" in card


def test_a_card_says_plainly_when_the_model_is_worse_than_persistence(hub, run_dir):
    make_job(run_dir, "BTCUSDT_1h", tiny_config_dict(run_dir.parent), seed=0, headline={
        "head": "ohlc", "column": "close", "shrink": 0.35, "skill": -0.0817, "mae": 130.0, "persistence_mae": 120.2,
        "direction_accuracy": 0.481, "majority_rate": 0.523})
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    files = hub.files(REPO)
    card = files["BTCUSDT/1h/README.md"].decode()
    assert "**Test skill vs persistence: -0.0817** for `ohlc` close (every step of the horizon)" in card
    assert "**This model is worse than persistence**" in card
    assert "deviation from \"no change\" is weighted 0.35, a factor chosen on the validation split" in card
    assert "Direction of the close: 0.481 correct, against 0.523 for always answering the most frequent move" in card
    assert "worse than persistence" not in files["ETHUSDT/1h/README.md"].decode()  # skill 0.154
    assert "| BTCUSDT_1h | [BTCUSDT/1h](./BTCUSDT/1h) | 2 | ohlc.close | 130 | 120.2 | -0.0817 |" in \
        files["README.md"].decode()


def test_push_jobs_one_commit_per_call_and_the_run_card_accumulates(hub, run_dir):
    hub_cfg = HubConfig(repo_id=REPO)
    first = push_jobs_at(run_dir, ["BTCUSDT_1h"], hub_cfg)
    second = push_jobs_at(run_dir, ["ETHUSDT_1h"], hub_cfg)

    assert len(hub.commits(REPO)) == 2
    assert first["BTCUSDT_1h"]["commit"] != second["ETHUSDT_1h"]["commit"]
    assert second["ETHUSDT_1h"]["url"].endswith(f"{REPO}/tree/{second['ETHUSDT_1h']['commit']}/ETHUSDT/1h")
    run_card = hub.files(REPO)["README.md"].decode()
    assert "BTCUSDT_1h" in run_card and "ETHUSDT_1h" in run_card


def test_repo_per_job_template(hub, run_dir):
    pushed = push_jobs_at(run_dir, JOBS, HubConfig(repo_id="tester/cpb-{symbol}-{timeframe}", path_template=""))

    for name in JOBS:
        repo = f"tester/cpb-{name.replace('_', '-')}"
        assert pushed[name]["repo_id"] == repo
        files = hub.files(repo)
        assert files["model.keras"] == local_files(run_dir, name)["model.keras"]
        assert {"config.json", "metadata.json", "model.weights.h5"} <= files.keys()  # hf:// loadable by Keras
        assert b"library_name: keras" in files["README.md"]  # the job's card is the repo's card
        assert f'keras.saving.load_model("hf://{repo}", compile=False)'.encode() in files["README.md"]
        assert len(hub.commits(repo)) == 1


def _card_snippet(card: str) -> str:
    """The Python block of a card's "How to use" section, as a reader would copy it."""
    return re.search(r"```python\n(.*?)```", card, flags=re.DOTALL).group(1)


@pytest.mark.train
def test_the_cards_load_one_liner_works_as_written(hub, run_dir, tmp_path):
    """The card's own snippet, run as it is by a reader whose client points at the Hub, gives the job's model with
    its trained weights: pushed as a folder per job (the snippet downloads it) and as a repo per job (it loads the
    repo). Both snippets run in one reader's process, one after the other (each process imports Keras and its
    backend: seconds of CPU)."""
    push_run_at(run_dir, repo_id=REPO, private=False, overwrite_cards=False, only=())
    push_jobs_at(run_dir, ["ETHUSDT_1h"], HubConfig(repo_id="tester/cpb-{symbol}-{timeframe}", path_template=""))
    cards = {"a folder per job": hub.files(REPO)["ETHUSDT/1h/README.md"].decode(),
             "a repo per job": hub.files("tester/cpb-ETHUSDT-1h")["README.md"].decode()}
    snippets = {layout: _card_snippet(card) for layout, card in cards.items()}
    assert ["hf_hub_download(" in snippet for snippet in snippets.values()] == [True, False]

    weights = {layout: tmp_path / f"loaded-{i}.npz" for i, layout in enumerate(snippets)}
    reader = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "0",
              "HF_HUB_DISABLE_XET": "1", "HF_HUB_CACHE": str(tmp_path / "reader-cache"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = "".join(f"{snippet}\nimport numpy\nnumpy.savez({str(weights[layout])!r}, *model.get_weights())\n"
                     for layout, snippet in snippets.items())
    result = subprocess.run([sys.executable, "-c", script], env=reader, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    local = keras.saving.load_model(jobs_dir(run_dir) / "ETHUSDT_1h" / "model.keras", compile=False).get_weights()
    for layout, path in weights.items():
        with np.load(path) as loaded:
            assert len(loaded.files) == len(local) > 0, layout
            for i, want in enumerate(local):
                np.testing.assert_array_equal(loaded[f"arr_{i}"], want)


@pytest.mark.parametrize("origin, line", [
    ("https://me:hf_NotForCards@github.com/me/cryptotrain.git",
     'pip install "cryptotrain @ git+https://github.com/me/cryptotrain.git"'),
    ("git@github.com:me/cryptotrain.git", 'pip install "cryptotrain @ git+ssh://git@github.com/me/cryptotrain.git"'),
    ("/home/me/src/cryptotrain", "pip install -e .  # in a clone of the cryptotrain repository"),
    ("", "pip install -e .  # in a clone of the cryptotrain repository"),
])
def test_the_cards_install_line_is_the_public_origin_without_credentials(monkeypatch, origin, line):
    """The git remote cryptotrain runs from becomes the card's install line only as anyone can clone it."""
    monkeypatch.setattr(hub_module.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, origin, ""))
    hub_module._public_origin.cache_clear()
    try:
        assert hub_module.install_line(HubConfig()) == line
    finally:
        hub_module._public_origin.cache_clear()


def test_colliding_paths_are_refused(hub, run_dir):
    with pytest.raises(UserError, match="would both be written"):
        push_jobs_at(run_dir, JOBS, HubConfig(repo_id=REPO, path_template="{timeframe}"))


def test_transient_failures_are_retried_without_duplicate_commits(hub, run_dir, monkeypatch, caplog):
    waits = record_sleeps(monkeypatch)  # the client's own backoff sleeps too
    hub.fail("create", 429, retry_after="7")
    hub.fail("paths_info", 503, retry_after=None)
    hub.fail("preupload", 500)  # retried by the client itself
    hub.fail("lfs_batch", 429)
    hub.fail("commit", 500, retry_after=None)
    hub.drop("commit")  # the commit lands but its answer is lost: the retry must not commit again

    with caplog.at_level(logging.WARNING, logger="trainer"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())

    assert hub.pending_failures() == 0
    assert len(hub.commits(REPO)) == 1
    assert 7.0 in waits  # Retry-After honoured
    assert hub_module.BACKOFF_SECONDS in waits  # no Retry-After: backoff
    said = [m for m in caplog.messages if m.startswith("Hub: ")]  # each retry, said on stderr by the CLI
    assert any(re.fullmatch(r"Hub: HTTP 429 from \S+; retrying in 7 s \(1/4\)", m) for m in said), said
    assert any(re.fullmatch(r"Hub: HTTP 503 from \S+; retrying in 0 s \(1/4\)", m) for m in said), said
    # the commit that landed without an answer, sent again, is refused on the moved head, then found landed
    assert f"Hub: {REPO} changed during the commit; preparing it again on its new head" in said
    head = hub.repos[REPO].head.oid
    assert {job.pushed_commit for job in Ledger(run_dir).jobs()} == {head}
    assert hub.files(REPO)["ETHUSDT/1h/metrics.json"] == local_files(run_dir, "ETHUSDT_1h")["metrics.json"]


def test_retry_after_zero_retries_at_once_and_a_long_one_is_reported_not_waited(hub, run_dir, monkeypatch):
    waits = record_sleeps(monkeypatch)
    hub.fail("create", 429, retry_after="0")
    hub.fail("commit", 429, retry_after="3600")  # the hourly commit limit
    with pytest.raises(JobError, match=rf"^{REPO}: could not push to the Hub: .*429"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert waits == [0.0]


def test_persistent_failure_is_a_one_line_job_error(hub, run_dir, monkeypatch):
    record_sleeps(monkeypatch)
    hub.fail("commit", 500, times=hub_module.MAX_ATTEMPTS)
    with pytest.raises(JobError) as err:
        push_jobs_at(run_dir, JOBS, HubConfig(repo_id=REPO))
    assert "\n" not in str(err.value) and REPO in str(err.value) and "500" in str(err.value)
    assert hub.commits(REPO) == []
    assert all(job.pushed_commit is None for job in Ledger(run_dir).jobs())


def test_lfs_uploads_failing_past_the_clients_retries_end_in_one_line_and_the_same_push_lands_them_later(
        hub, run_dir, monkeypatch):
    """huggingface_hub retries an LFS upload itself, then its upload threads raise ("Error while uploading 'PATH' to
    the Hub."): one line naming the file and what to do, exit 1, nothing committed; once the Hub works again the same
    push lands every file in one commit."""
    record_sleeps(monkeypatch)
    hub.fail("lfs_upload", 500, times=1000)  # every LFS upload, past the client's retries
    failed = CliRunner().invoke(main, ["push", str(run_dir), "--repo-id", REPO])
    assert failed.exit_code == 1 and isinstance(failed.exception, SystemExit), failed.exception  # no traceback
    [said] = [line for line in failed.output.splitlines() if line.startswith("error: ")]
    assert re.fullmatch(rf"error: {REPO}: could not upload \S+/(model\.keras|predictions\.npz|[\w./]+) to the Hub "
                        r"\(.*\); nothing was committed: run the same push again", said), said
    assert hub.commits(REPO) == []

    hub.recover()
    again = CliRunner().invoke(main, ["push", str(run_dir), "--repo-id", REPO])
    assert again.exit_code == 0, again.output
    assert len(hub.commits(REPO)) == 1
    for job in JOBS:
        symbol, timeframe = job.split("_")
        for name, content in local_files(run_dir, job).items():
            assert hub.files(REPO)[f"{symbol}/{timeframe}/{name}"] == content, name


def test_card_edited_on_the_hub_is_kept_unless_overwrite_cards(hub, run_dir, caplog):
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    pushed_card = hub.files(REPO)["BTCUSDT/1h/README.md"]
    hub.edit(REPO, "BTCUSDT/1h/README.md", b"# my own notes\n")

    with caplog.at_level(logging.WARNING, logger="trainer"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert hub.files(REPO)["BTCUSDT/1h/README.md"] == b"# my own notes\n"
    assert (f"{REPO}: BTCUSDT/1h/README.md was edited on the Hub; kept (--overwrite-cards replaces it)"
            in caplog.messages)
    commits = len(hub.commits(REPO))

    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=True, only=())
    assert hub.files(REPO)["BTCUSDT/1h/README.md"] == pushed_card
    assert len(hub.commits(REPO)) == commits + 1


def test_a_regenerated_card_replaces_the_one_we_pushed(hub, run_dir):
    push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO))
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    make_job(run_dir, "BTCUSDT_1h", cfg, seed=5)  # the job was trained again: new metrics

    push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO))
    assert b"| ohlc | model | 106.5 |" in hub.files(REPO)["BTCUSDT/1h/README.md"]
    assert hub.files(REPO)["BTCUSDT/1h/model.keras"] == local_files(run_dir, "BTCUSDT_1h")["model.keras"]


def test_a_card_pushed_from_another_run_directory_is_replaced_not_taken_for_an_edit(hub, run_dir, caplog):
    push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO))
    for path in run_dir.glob("ledger.sqlite*"):  # a ledger that knows nothing of that push, as another run's
        path.unlink()
    Ledger(run_dir).add_jobs(JOBS)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    make_job(run_dir, "BTCUSDT_1h", cfg, seed=5)  # trained again: new metrics

    with caplog.at_level(logging.WARNING, logger="trainer"):
        push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO))
    assert b"| ohlc | model | 106.5 |" in hub.files(REPO)["BTCUSDT/1h/README.md"]
    assert "edited on the Hub" not in caplog.text


def test_corrupt_job_is_not_pushed(hub, run_dir):
    (jobs_dir(run_dir) / "BTCUSDT_1h" / "metrics.json").write_text("{}")
    with pytest.raises(JobError, match="BTCUSDT_1h.*manifest.json"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert REPO not in hub.repos


def test_only_filters_jobs(hub, run_dir):
    push_run_at(run_dir, repo_id=REPO, private=False, overwrite_cards=False, only=("ETH*",))
    assert not hub.repos[REPO].private
    assert not any(path.startswith("BTCUSDT/") for path in hub.files(REPO))
    assert "ETHUSDT/1h/model.keras" in hub.files(REPO)


def test_push_creates_the_repo_as_the_config_says_unless_told_otherwise(hub, run_dir):
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "hub": {"private": False}}))
    result = CliRunner().invoke(main, ["push", str(run_dir), "--repo-id", REPO])
    assert result.exit_code == 0, result.output
    assert not hub.repos[REPO].private
    head = hub.repos[REPO].head.oid
    assert result.stdout.splitlines() == [f"{name}: {hub.url}/{REPO}/tree/{head}/"
                                          f"{name.replace('_', '/')}" for name in JOBS]
    result = CliRunner().invoke(main, ["push", str(run_dir), "--repo-id", "tester/cpb-hidden", "--private"])
    assert result.exit_code == 0, result.output
    assert hub.repos["tester/cpb-hidden"].private


def test_missing_token_is_a_one_line_user_error(hub, run_dir, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(UserError, match=r"^no Hugging Face token: set HF_TOKEN or run `hf auth login`$"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())


def test_rejected_token_names_the_repo_not_the_token(hub, run_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_WrongTokenWrongToken0000000000")
    with pytest.raises(UserError) as err:
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert REPO in str(err.value) and "401" in str(err.value)
    assert "hf_WrongToken" not in str(err.value)


def test_token_never_leaks(hub, run_dir, capsys, caplog):
    """Into error messages (even when the server echoes it), output, logs, artifacts, ledger or the Hub."""
    caplog.set_level(logging.DEBUG)
    hub.fail("commit", 400, body="bad request: {auth}")  # a server that echoes the Authorization header
    with pytest.raises(JobError) as err:
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    assert "bad request: Bearer ***" in str(err.value)

    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    download_job(f"hf://{REPO}/BTCUSDT/1h")
    out = capsys.readouterr()
    texts = [str(err.value), out.out, out.err, caplog.text]
    texts += [p.read_bytes().decode("latin-1") for p in run_dir.rglob("*") if p.is_file()]
    texts += [content.decode("latin-1") for content in hub.files(REPO).values()]
    assert not [text for text in texts if TOKEN in text]


def test_download_job_round_trip(hub, run_dir):
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())

    job_dir = download_job(f"hf://{REPO}/ETHUSDT/1h")
    local = local_files(run_dir, "ETHUSDT_1h")
    unzipped = {"config.json", "metadata.json", "model.weights.h5"}  # model.keras as a folder, for Keras's hf://
    added = {"README.md", "plot.png", *unzipped}  # what a push adds: the card, the plot, model.keras unzipped
    assert {p.name: p.read_bytes() for p in job_dir.iterdir() if p.name not in added} == local
    assert json.loads((job_dir / "metrics.json").read_text())["job"] == "ETHUSDT_1h"


@pytest.mark.parametrize("uri, message", [
    ("hf://tester", "expected hf://NS/NAME/SYMBOL/TIMEFRAME"),
    ("hf://tester/nope/BTCUSDT/1h", "no such repo"),
    (f"hf://{REPO}/SOLUSDT/1h", "no job there"),
])
def test_download_job_bad_references(hub, run_dir, uri, message):
    push_jobs_at(run_dir, ["BTCUSDT_1h"], HubConfig(repo_id=REPO))
    with pytest.raises(UserError, match=message):
        download_job(uri)


def test_push_needs_a_repo(hub, run_dir):
    with pytest.raises(UserError, match="pass --repo-id"):
        push_run_at(run_dir, repo_id=None, private=True, overwrite_cards=False, only=())
    with pytest.raises(UserError, match="--repo-id not-a-repo: .not-a-repo.: expected NS/NAME"):
        push_run_at(run_dir, repo_id="not-a-repo", private=True, overwrite_cards=False, only=())


def test_offline_mode_downloads_from_the_cache_and_refuses_to_push(hub, run_dir, monkeypatch):
    push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())
    online = download_job(f"hf://{REPO}/BTCUSDT/1h")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    assert download_job(f"hf://{REPO}/BTCUSDT/1h") == online
    with pytest.raises(UserError, match=f"^{REPO}: HF_HUB_OFFLINE is set"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())


def test_unreachable_hub_is_a_job_error(hub, run_dir, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(JobError, match=f"^{REPO}: could not push to the Hub: .*"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())


def run_with_push(tmp_path, symbols: list[str], repo_id: str = REPO):
    """`cryptotrain run --push` of real one-epoch jobs; returns the click result."""
    cfg = tiny_config_dict(tmp_path)
    cfg["data"]["symbols"] = symbols
    cfg["train"]["epochs"] = 1
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**cfg, "hub": {"repo_id": repo_id}}))
    return CliRunner().invoke(main, ["run", "--config", str(config), "--push"], catch_exceptions=False)


def refused_card(*args) -> str:
    return "---\ntags: [unclosed\n---\n\n# a run card whose metadata the Hub refuses\n"


def test_a_card_the_hub_refuses_is_a_one_line_job_error(hub, run_dir, monkeypatch):
    monkeypatch.setattr(hub_module, "run_card", refused_card)
    with pytest.raises(JobError, match=rf"^{REPO}: the Hub refused the push: Invalid metadata in README.md.; "
                                       r"while parsing a flow sequence"):
        push_run_at(run_dir, repo_id=REPO, private=True, overwrite_cards=False, only=())


@pytest.mark.train
def test_a_refused_push_does_not_end_the_training_run(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_module, "run_card", refused_card)
    result = run_with_push(tmp_path, ["BTCUSDT", "ETHUSDT"])
    assert result.exit_code == 1, result.output
    assert "push failed for BTCUSDT_1h: " in result.output and "2/2 jobs done, 0 failed, 2 not pushed" in result.output


@pytest.mark.train
def test_run_push_to_another_repo_pushes_the_done_jobs_there(hub, tmp_path):
    assert run_with_push(tmp_path, ["BTCUSDT"]).exit_code == 0
    moved = run_with_push(tmp_path, ["BTCUSDT"], repo_id="tester/cpb-elsewhere")  # hub is not in the fingerprint
    assert moved.exit_code == 0, moved.output
    [record] = Ledger(tmp_path / "run").jobs()
    assert record.pushed_repo == "tester/cpb-elsewhere"
    assert "BTCUSDT/1h/model.keras" in hub.files("tester/cpb-elsewhere")


@pytest.mark.train
def test_run_push_publishes_jobs_as_they_finish_within_the_commit_budget(hub, tmp_path, monkeypatch):
    """Three real jobs with `run --push`: the first is committed as soon as it is done; the two that finish
    within the next PUSH_EVERY_S go together at the end. The ledger and `status` show every job's commit."""
    monkeypatch.setattr(runner, "PUSH_EVERY_S", 3600.0)
    result = run_with_push(tmp_path, ["BTCUSDT", "ETHUSDT", "SOLUSDT"])

    assert result.exit_code == 0, result.output
    first, last = hub.commits(REPO)
    symbols = [{path.split("/")[0] for path in c.files if path.endswith("/model.keras")} for c in (first, last)]
    assert symbols == [{"BTCUSDT"}, {"BTCUSDT", "ETHUSDT", "SOLUSDT"}]  # snapshots: the first commit held BTC alone
    records = Ledger(tmp_path / "run").jobs()
    assert {(r.name, r.pushed_commit) for r in records} == {
        ("BTCUSDT_1h", first.oid), ("ETHUSDT_1h", last.oid), ("SOLUSDT_1h", last.oid)}
    status = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert status.exit_code == 0, status.output
    rows = {line.split()[0]: line for line in status.output.splitlines() if "USDT_1h" in line}
    for job, pushed in (("BTCUSDT_1h", first), ("ETHUSDT_1h", last), ("SOLUSDT_1h", last)):
        assert pushed.oid[:7] in rows[job]
    assert f"pushed to {REPO}" in status.output
    assert TOKEN not in result.output + status.output


@pytest.mark.train
def test_a_failed_push_keeps_the_job_exits_1_and_the_same_command_pushes_it_later(hub, tmp_path, monkeypatch):
    record_sleeps(monkeypatch)
    hub.fail("commit", 500, times=2 * hub_module.MAX_ATTEMPTS)  # the push after the job, and the one at the end

    failed = run_with_push(tmp_path, ["BTCUSDT"])

    assert failed.exit_code == 1
    assert re.search(rf"^push failed for BTCUSDT_1h: {REPO}: .*500.* \(retry with: cryptotrain push "
                     rf"{tmp_path / 'run'}\)$", failed.output, re.MULTILINE)
    assert "1/1 jobs done, 0 failed, 1 not pushed to the Hub" in failed.output
    [record] = Ledger(tmp_path / "run").jobs()
    assert record.status == "done" and record.pushed_commit is None and hub.commits(REPO) == []

    again = run_with_push(tmp_path, ["BTCUSDT"])  # nothing to train: only the push is left

    assert again.exit_code == 0, again.output
    [record] = Ledger(tmp_path / "run").jobs()
    assert record.attempts == 1 and record.pushed_commit == hub.repos[REPO].head.oid
