"""`cryptotrain push` of a trained run (the session's) against a local Hub (tests/hub_server.py) that fails about 30 %
of all requests at random, with 429 (Retry-After 0 or 1) or 500: each request is retried on its own, so the push
lands everything without starting over, a second push adds nothing, and a job downloads back. A request that keeps
failing ends the push in one line."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_server import record_sleeps, serve_hub

import trainer.publish.hub as hub_module
from trainer.cli import main
from trainer.publish.hub import download_job
from trainer.run.artifacts import jobs_dir

pytestmark = pytest.mark.train  # the session's trained run (conftest.trained_run), pushed from copies

TOKEN = "hf_FaUlTyHuBtOkEn0123456789abcdef"
REPO = "tester/cpb-tiny"
ONCE_A_PUSH = ("create", "paths_info", "validate_yaml", "preupload")  # requests a push makes once


@pytest.fixture
def run_dir(trained_run, tmp_path) -> Path:
    """A copy of the session's trained run: each test pushes from a ledger of its own."""
    return trained_run.copy(tmp_path).run_dir


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as server:
        yield server


def push(run_dir: Path):
    return CliRunner().invoke(main, ["push", str(run_dir), "--repo-id", REPO])


@pytest.mark.parametrize("seed", range(6))
def test_a_push_through_random_failures_lands_everything_and_a_second_push_adds_nothing(hub, run_dir, monkeypatch,
                                                                                         seed):
    waits = record_sleeps(monkeypatch)
    hub.fail_at_random(0.3, seed, most_in_a_row=hub_module.MAX_ATTEMPTS - 1)

    first = push(run_dir)

    assert first.exit_code == 0, first.output
    [commit] = hub.commits(REPO)
    remote = hub.files(REPO)
    jobs = sorted(path.name for path in jobs_dir(run_dir).iterdir())
    assert jobs == ["BTCUSDT_1h", "ETHUSDT_1h"]  # the trained run's
    for job in jobs:
        folder = job.replace("_", "/")
        for path in (jobs_dir(run_dir) / job).iterdir():
            assert remote[f"{folder}/{path.name}"] == path.read_bytes(), path
        assert f"{folder}/README.md" in remote
    assert "README.md" in remote  # the run card
    assert first.stdout.splitlines() == [f"{job}: {hub.url}/{REPO}/tree/{commit.oid}/{job.replace('_', '/')}"
                                         for job in jobs]

    second = push(run_dir)

    assert second.exit_code == 0, second.output
    assert hub.commits(REPO) == [commit]  # nothing new
    assert second.stdout == first.stdout
    failed = hub.failed_at_random
    # About 30 % of the requests failed (a draw per distinct request: how many varies with the bytes pushed, whose
    # paths differ from run to run), and their Retry-After was honoured: as sent by our retries, plus a second by
    # huggingface_hub's own (an LFS upload's; 2026-11-30, a draw whose only Retry-After, 1, went to one: waits 2, 4)
    assert 0.1 * hub.calls.total() < failed.total() < 0.5 * hub.calls.total(), (failed.total(), hub.calls.total())
    honoured = hub.retry_afters_sent | {seconds + 1 for seconds in hub.retry_afters_sent}
    assert set(waits) & honoured, (waits, hub.retry_afters_sent)  # (our backoff alone waits 2, 4, 8 or 16 s)
    # Each failed request was sent again on its own; none started a push over.
    for name in ONCE_A_PUSH:
        assert hub.calls[name] - failed[name] == 2, name
    assert hub.calls["commit"] - failed["commit"] == 1
    lfs_files = {blob.sha256 for blob in hub.repos[REPO].head.files.values() if blob.lfs}
    assert hub.calls["lfs_upload"] - failed["lfs_upload"] == len(lfs_files)  # each uploaded once
    assert TOKEN not in first.output + second.output

    fetched = download_job(f"hf://{REPO}/ETHUSDT/1h")  # and back, through the same failures
    for path in (jobs_dir(run_dir) / "ETHUSDT_1h").iterdir():
        assert (fetched / path.name).read_bytes() == path.read_bytes(), path
    assert failed["resolve"] > 0


def test_a_request_that_keeps_failing_ends_the_push_in_one_line(hub, run_dir, monkeypatch, caplog):
    waits = record_sleeps(monkeypatch)
    hub.fail("paths_info", 503, times=hub_module.MAX_ATTEMPTS, retry_after=None, body="down; you sent {auth}")

    with caplog.at_level(logging.WARNING, logger="trainer"):
        result = push(run_dir)

    assert result.exit_code == 1
    *shown, error = result.stderr.splitlines()  # each retry's warning, then the error in one line
    assert error.startswith(f"error: {REPO}: could not push to the Hub: ")
    assert "503" in error and "/paths-info/" in error and "you sent Bearer ***" in error
    retries = [m for m in caplog.messages if m.startswith("Hub: ")]
    assert shown == retries
    assert len(retries) == hub_module.MAX_ATTEMPTS - 1 and all("Hub: HTTP 503 from " in r for r in retries)
    assert waits == [hub_module.BACKOFF_SECONDS * 2 ** n for n in range(hub_module.MAX_ATTEMPTS - 1)]
    assert hub.calls["paths_info"] == hub_module.MAX_ATTEMPTS and hub.pending_failures() == 0
    assert hub.commits(REPO) == [] and TOKEN not in result.output + caplog.text
