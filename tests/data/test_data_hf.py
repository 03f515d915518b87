"""The hf source with the real huggingface_hub client, against a local server that answers the
dataset `resolve` calls like the Hub, then offline from the client's cache."""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import huggingface_hub.utils._http
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from huggingface_hub import constants

from tests.conftest import CANDLES_DIR, tiny_config_dict
from trainer.cli import main
from trainer.config import RunConfig
from trainer.data import hf as hf_source
from trainer.data import load_candles, read_candles_file
from trainer.data.validate import OHLCV
from trainer.errors import JobError

REPO_ID, TOKEN, COMMIT = "someone/cpb-models", "hf_test_token", "c0ffee" * 6 + "c0ff"
PATTERN = "klines_binance_us/{symbol}/{symbol}_{timeframe}_binance_us.csv"


def old_layout_csv(symbol: str, timeframe: str) -> bytes:
    """A file as the old dataset has it: open_time / close_time in epoch milliseconds."""
    table = pd.read_csv(CANDLES_DIR / f"{symbol}_{timeframe}.csv.gz", nrows=700)
    open_ms = pd.to_datetime(table.pop("timestamp"), utc=True).astype("int64") // 1_000_000
    step_ms = pd.Timedelta(timeframe.replace("m", "min")).value // 1_000_000
    return pd.DataFrame({"open_time": open_ms, **table, "close_time": open_ms + step_ms - 1}).to_csv(
        index=False).encode()


class FakeHub:
    """HEAD / GET /datasets/{repo}/resolve/{revision}/{path} for one private dataset repo, with the
    headers and error codes huggingface_hub interprets."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.authorizations = files, []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def answer(self, path: str, authorization: str) -> tuple[int, dict[str, str], bytes]:
        self.authorizations.append(authorization)
        prefix = f"/datasets/{REPO_ID}/resolve/"
        if not path.startswith(prefix) or authorization != f"Bearer {TOKEN}":
            return 401, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, b""
        revision, _, name = unquote(path[len(prefix):]).partition("/")
        if revision not in ("main", COMMIT):
            return 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}, b""
        if name not in self.files:
            return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found",
                         "X-Repo-Commit": COMMIT}, b""
        content = self.files[name]
        return 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(content).hexdigest()}"'}, content

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._reply(send_body=False)

            def do_GET(self) -> None:
                self._reply(send_body=True)

            def _reply(self, send_body: bool) -> None:
                status, headers, body = hub.answer(self.path, self.headers.get("authorization", ""))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        return Handler


@pytest.fixture
def hub(monkeypatch, tmp_path) -> Iterator[FakeHub]:
    """A running FakeHub with the client pointed at it, online, with its own cache. huggingface_hub
    reads its settings when first imported, so the cache and offline switch are set on its constants."""
    server = FakeHub({PATTERN.format(symbol=symbol, timeframe="1h"): old_layout_csv(symbol, "1h")
                      for symbol in ("BTCUSDT", "ETHUSDT")})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield server
    server.close()


def hf_cfg(tmp_path, **hf) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["data"].update(source="hf", hf={"repo_id": REPO_ID, "pattern": PATTERN, **hf}, max_rows=None)
    return RunConfig.model_validate(raw)


def test_download_then_offline_from_the_cache(tmp_path, hub, monkeypatch):
    cfg = hf_cfg(tmp_path)
    candles = load_candles(cfg, "BTCUSDT", "1h")
    expected = read_candles_file(CANDLES_DIR / "BTCUSDT_1h.csv.gz", "1h").iloc[:700]
    np.testing.assert_array_equal(candles.to_numpy(), expected.to_numpy())
    assert candles.index.equals(expected.index) and list(candles.columns) == list(OHLCV)
    source = f"hf:{REPO_ID}@main/klines_binance_us/BTCUSDT/BTCUSDT_1h_binance_us.csv"
    assert candles.attrs == {"source": source, "synthetic": False, "gaps": 0}
    assert set(hub.authorizations) == {f"Bearer {TOKEN}"}  # HF_TOKEN was sent

    calls = len(hub.authorizations)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # only the variable: the source reads it at each call
    pd.testing.assert_frame_equal(load_candles(cfg, "BTCUSDT", "1h"), candles)
    assert len(hub.authorizations) == calls  # HF_HUB_OFFLINE=1: not even a metadata request
    with pytest.raises(JobError, match=rf"^hf:{REPO_ID}@main/.*ETHUSDT_1h.*: not in the local Hugging Face cache"):
        load_candles(cfg, "ETHUSDT", "1h")
    assert len(hub.authorizations) == calls


def test_once_the_hub_cannot_be_reached_the_process_uses_only_the_cache(tmp_path, hub, monkeypatch):
    cfg = hf_cfg(tmp_path)
    cached = load_candles(cfg, "BTCUSDT", "1h")
    monkeypatch.setattr(hf_source, "_unreachable_endpoints", set())  # forgotten after the test: ports get reused
    hub.close()  # the network goes away: connections to the endpoint are refused
    waits = []  # the client's own backoff between its retries, recorded instead of slept
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", waits.append)
    with pytest.raises(JobError, match=rf"ETHUSDT_1h.*: not in the local Hugging Face cache and {hub.url} "
                                       "cannot be reached; run the same command again with network access"):
        load_candles(cfg, "ETHUSDT", "1h")
    assert len(waits) >= 3  # the client retried before giving up
    retries = len(waits)
    pd.testing.assert_frame_equal(load_candles(cfg, "BTCUSDT", "1h"), cached)  # from the cache, at once
    with pytest.raises(JobError, match=f"ETHUSDT_1h.*: not in the local Hugging Face cache and {hub.url} "
                                       "could not be reached earlier in this process"):
        load_candles(cfg, "ETHUSDT", "1h")
    assert len(waits) == retries  # no more waiting for an endpoint known to be unreachable


@pytest.mark.parametrize(("hf", "token", "message"), [
    ({"pattern": "klines/{symbol}_{timeframe}.csv"}, TOKEN, r"no such file in the repository \(data.hf.pattern\)"),
    ({"revision": "v2"}, TOKEN, r"revision not found \(data.hf.revision\)"),
    ({}, "hf_wrong_token", r"repository not found \(a private one needs HF_TOKEN\)"),
])
def test_hub_errors_are_job_errors_naming_the_file(tmp_path, hub, monkeypatch, hf, token, message):
    monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(JobError, match=rf"^hf:{REPO_ID}@.*BTCUSDT.*: {message}"):
        load_candles(hf_cfg(tmp_path, **hf), "BTCUSDT", "1h")


def test_download_command_fetches_every_job(tmp_path, hub, tiny_config):
    data = hf_cfg(tmp_path).model_dump(mode="json")["data"]
    data["symbols"] = ["BTCUSDT", "ETHUSDT", "XRPUSDT"]
    result = CliRunner().invoke(main, ["data", "download", "--config", str(tiny_config(data=data))])
    assert result.exit_code == 1
    assert "BTCUSDT_1h: 700 candles, " in result.output and "ETHUSDT_1h: 700 candles, " in result.output
    assert "XRPUSDT_1h: FAILED: hf:" in result.output and "no such file in the repository" in result.output
    assert "2 of 3 jobs ready, 1 failed" in result.output
