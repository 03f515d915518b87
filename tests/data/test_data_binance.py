"""Binance klines against a local server that answers like the exchange (real bundled candles):
paging, storage for offline reuse, refresh of an open range, rate limits and errors."""
from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.conftest import CANDLES_DIR, tiny_config_dict
from trainer.cli import main
from trainer.config import RunConfig
from trainer.data import binance, load_candles, read_candles_file
from trainer.data.validate import OHLCV
from trainer.errors import JobError

HOUR_MS = 3_600_000
REAL = read_candles_file(CANDLES_DIR / "BTCUSDT_1h.csv.gz", "1h")
START = REAL.index[24]  # 2024-12-30 12:00 UTC


class FakeBinance:
    """GET /api/v3/klines for BTCUSDT 1h, as Binance spot answers it: arrays with numbers as strings,
    at most `limit` klines opening in [startTime, endTime], the X-MBX-USED-WEIGHT-1M header.
    `visible_until` plays the clock; `fail` queues error answers."""

    def __init__(self, weight_per_request: int = 2):
        self.requests: list[dict[str, str]] = []
        self.failures: deque[tuple[int, dict[str, str]]] = deque()
        self.fail_each: tuple[int, int] | None = None
        self.weight, self.weight_per_request = 0, weight_per_request
        self.visible_until = REAL.index[-1]
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True).start()

    def fail(self, status: int, retry_after: str | None = None, times: int = 1) -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self.failures.extend([(status, headers)] * times)

    def fail_each_request(self, status: int, times: int) -> None:
        """Answer every distinct request (each page) with `status` its first `times` times."""
        self.fail_each = (status, times)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def answer(self, query: dict[str, str]) -> tuple[int, dict[str, str], object]:
        self.requests.append(query)
        self.weight += self.weight_per_request
        headers = {"X-MBX-USED-WEIGHT-1M": str(self.weight)}
        if self.failures:
            status, extra = self.failures.popleft()
            return status, {**headers, **extra}, {"code": -1003, "msg": "Too many requests."}
        if self.fail_each and self.requests.count(query) <= self.fail_each[1]:
            return self.fail_each[0], headers, {"code": -1003, "msg": "Too many requests."}
        if query.get("symbol") != "BTCUSDT" or query.get("interval") != "1h":
            return 400, headers, {"code": -1121, "msg": "Invalid symbol."}
        opens = REAL.index.asi8 // 1_000_000
        start, end, limit = int(query["startTime"]), int(query["endTime"]), int(query["limit"])
        visible = (opens >= start) & (opens <= end) & (REAL.index <= self.visible_until)
        rows = REAL[visible].iloc[:limit]
        klines = [[int(t.value // 1_000_000), *(f"{x:.8f}" for x in row), int(t.value // 1_000_000) + HOUR_MS - 1,
                   "0.0", 100, "0.0", "0.0", "0"] for t, row in zip(rows.index, rows.to_numpy())]
        return 200, headers, klines

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/api/v3/klines":
                    status, headers, body = 404, {}, {"msg": "no such endpoint"}
                else:
                    status, headers, body = fake.answer({k: v[0] for k, v in parse_qs(url.query).items()})
                payload = json.dumps(body).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        return Handler


def exchange_ms(stamp: pd.Timestamp) -> int:
    return stamp.value // 1_000_000


@pytest.fixture
def exchange() -> Iterator[FakeBinance]:
    server = FakeBinance()
    yield server
    server.close()


def binance_cfg(tmp_path, exchange: FakeBinance, end: str | None) -> RunConfig:
    raw = tiny_config_dict(tmp_path)
    raw["data"].update(source="binance", symbols=["BTCUSDT"], max_rows=None,
                       binance={"base_url": exchange.url, "start": START.isoformat(), "end": end})
    return RunConfig.model_validate(raw)


def test_a_date_range_is_paged_stored_and_then_read_without_network(tmp_path, exchange):
    end = START + pd.Timedelta(hours=2500)
    cfg = binance_cfg(tmp_path, exchange, end=end.isoformat())
    candles = load_candles(cfg, "BTCUSDT", "1h")

    expected = REAL[(REAL.index >= START) & (REAL.index < end)]
    assert len(candles) == 2500
    np.testing.assert_allclose(candles.to_numpy(), expected.to_numpy(), rtol=1e-12)
    assert candles.index.equals(expected.index)
    # 1000 + 1000 + 500 klines, each page from just after the last open time of the one before
    first = exchange_ms(START)
    assert [int(r["startTime"]) for r in exchange.requests] == [first, first + 999 * HOUR_MS + 1,
                                                                first + 1999 * HOUR_MS + 1]
    assert {r["limit"] for r in exchange.requests} == {"1000"}
    stored = binance.stored_path(cfg.data.binance, cfg.cache_path, "BTCUSDT", "1h")
    assert candles.attrs == {"source": f"binance:{stored}", "synthetic": False, "gaps": 0}
    assert list(pd.read_csv(stored).columns) == ["timestamp", *OHLCV]

    exchange.close()  # a second run needs no network
    pd.testing.assert_frame_equal(load_candles(cfg, "BTCUSDT", "1h"), candles)
    assert len(exchange.requests) == 3


def test_download_command_refreshes_an_open_range(tmp_path, exchange, tiny_config):
    exchange.visible_until = START + pd.Timedelta(hours=1499)
    raw = binance_cfg(tmp_path, exchange, end=None).model_dump(mode="json")
    config = str(tiny_config(data=raw["data"]))
    runner = CliRunner()

    first = runner.invoke(main, ["data", "download", "--config", config])
    assert first.exit_code == 0, first.output
    assert "BTCUSDT_1h: 1500 candles, 1500 new," in first.output and "0 gaps" in first.output

    exchange.visible_until = START + pd.Timedelta(hours=2299)  # time passes: 800 more candles closed
    second = runner.invoke(main, ["data", "download", "--config", config])
    assert second.exit_code == 0, second.output
    assert "BTCUSDT_1h: 2300 candles, 800 new," in second.output
    assert int(exchange.requests[-1]["startTime"]) == exchange_ms(START + pd.Timedelta(hours=1500))  # the next open

    third = runner.invoke(main, ["data", "download", "--config", config])  # nothing closed since
    assert third.exit_code == 0 and "BTCUSDT_1h: 2300 candles, 0 new," in third.output, third.output

    requests = len(exchange.requests)
    candles = load_candles(RunConfig.model_validate(raw), "BTCUSDT", "1h")  # a run reads what is stored, no network
    assert len(exchange.requests) == requests
    np.testing.assert_allclose(candles.to_numpy(), REAL.loc[START:exchange.visible_until].to_numpy(), rtol=1e-12)


def test_a_range_ending_in_the_future_is_completed_by_later_downloads(tmp_path, exchange, monkeypatch):
    end = START + pd.Timedelta(hours=2000)
    cfg = binance_cfg(tmp_path, exchange, end=end.isoformat())
    source = cfg.data.binance
    monkeypatch.setattr(binance.time, "time", lambda: (START + pd.Timedelta(hours=1200)).timestamp())
    exchange.visible_until = START + pd.Timedelta(hours=1199)
    assert binance.update(source, cfg.cache_path, "BTCUSDT", "1h") == 1200  # closed by "now"

    monkeypatch.setattr(binance.time, "time", lambda: (end + pd.Timedelta(days=30)).timestamp())
    exchange.visible_until = REAL.index[-1]
    assert binance.update(source, cfg.cache_path, "BTCUSDT", "1h") == 800  # the rest, up to the end
    requests = len(exchange.requests)
    assert binance.update(source, cfg.cache_path, "BTCUSDT", "1h") == 0  # complete: not asked again
    assert len(exchange.requests) == requests
    candles = load_candles(cfg, "BTCUSDT", "1h")
    assert candles.index.equals(REAL.loc[START:end - pd.Timedelta(hours=1)].index)


def test_rate_limits_are_waited_out(exchange):
    sleeps: list[float] = []
    exchange.fail(429, retry_after="3")
    exchange.fail(418, retry_after="7")
    start_ms = exchange_ms(START)
    rows = binance.fetch_klines(exchange.url, "BTCUSDT", "1h", start_ms, start_ms + 99 * HOUR_MS, sleep=sleeps.append)
    assert len(rows) == 100 and sleeps == [3.0, 7.0]

    heavy = FakeBinance(weight_per_request=int(binance.WEIGHT_PAUSE_AT))  # the next request would exceed it
    try:
        sleeps.clear()
        binance.fetch_klines(heavy.url, "BTCUSDT", "1h", start_ms, start_ms + 1500 * HOUR_MS, sleep=sleeps.append)
        assert len(heavy.requests) == 2 and len(sleeps) == 2 and all(0 < s <= 61 for s in sleeps)
    finally:
        heavy.close()


def test_retry_after_is_honoured_on_any_answer_that_is_retried(exchange):
    sleeps: list[float] = []
    exchange.fail(503, retry_after="2")
    exchange.fail(429, retry_after="0")  # at once
    exchange.fail(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")  # an HTTP date, passed: at once
    start_ms = exchange_ms(START)
    rows = binance.fetch_klines(exchange.url, "BTCUSDT", "1h", start_ms, start_ms + 99 * HOUR_MS, sleep=sleeps.append)
    assert len(rows) == 100 and sleeps == [2.0, 0.0, 0.0]


def test_each_request_has_its_own_retries(exchange):
    """Three pages, each failing all but its last attempt: every page comes, no budget is shared."""
    sleeps: list[float] = []
    exchange.fail_each_request(500, times=binance.MAX_ATTEMPTS - 1)
    start_ms = exchange_ms(START)
    rows = binance.fetch_klines(exchange.url, "BTCUSDT", "1h", start_ms, start_ms + 2499 * HOUR_MS,
                                sleep=sleeps.append)
    assert len(rows) == 2500 and len(exchange.requests) == 3 * binance.MAX_ATTEMPTS
    assert sleeps == [1, 2, 4, 8] * 3


@pytest.mark.parametrize(("symbol", "failures", "message", "expected_sleeps"), [
    ("BTCUSDT", [(418, "3600")], r"rate limited \(HTTP 418 Too many requests.\) for 3600 s", []),
    ("BTCUSDT", [(503, "Fri, 01 Jan 2100 00:00:00 GMT")], r"unavailable \(HTTP 503 Too many requests.\) for \d+ s",
     []),
    ("BTCUSDT", [(503, None)] * 5, "download failed after 5 attempts: HTTP 503", [1, 2, 4, 8]),
    ("NOPEUSDT", [], "answered HTTP 400 Invalid symbol.", []),
])
def test_download_failures_are_job_errors(exchange, symbol, failures, message, expected_sleeps):
    for status, retry_after in failures:
        exchange.fail(status, retry_after)
    sleeps: list[float] = []
    start_ms = exchange_ms(START)
    with pytest.raises(JobError, match=f"binance {symbol} 1h: .*{message}"):
        binance.fetch_klines(exchange.url, symbol, "1h", start_ms, start_ms + HOUR_MS, sleep=sleeps.append)
    assert sleeps == expected_sleeps


def test_once_the_exchange_cannot_be_reached_later_downloads_fail_at_once(exchange, monkeypatch):
    monkeypatch.setattr(binance, "_unreachable_hosts", set())  # forgotten after the test: ports get reused
    exchange.close()  # the network goes away: connections are refused
    sleeps: list[float] = []
    start_ms = exchange_ms(START)
    with pytest.raises(JobError, match="binance BTCUSDT 1h: download failed after 5 attempts: .*refused"):
        binance.fetch_klines(exchange.url, "BTCUSDT", "1h", start_ms, start_ms + HOUR_MS, sleep=sleeps.append)
    assert sleeps == [1, 2, 4, 8]
    host = exchange.url.split("//")[1]
    with pytest.raises(JobError, match=f"binance ETHUSDT 1h: {host} could not be reached earlier in this process"):
        binance.fetch_klines(exchange.url, "ETHUSDT", "1h", start_ms, start_ms + HOUR_MS, sleep=sleeps.append)
    assert sleeps == [1, 2, 4, 8]  # no second round of waiting


def test_download_command_reports_failed_jobs_and_leaves_nothing_behind(tmp_path, exchange, tiny_config):
    raw = binance_cfg(tmp_path, exchange, end=(START + pd.Timedelta(hours=48)).isoformat()).model_dump(mode="json")
    raw["data"]["symbols"] = ["NOPEUSDT", "BTCUSDT"]
    result = CliRunner().invoke(main, ["data", "download", "--config", str(tiny_config(data=raw["data"]))])
    assert result.exit_code == 1
    assert "NOPEUSDT_1h: FAILED: binance NOPEUSDT 1h:" in result.output and "Invalid symbol." in result.output
    assert "BTCUSDT_1h: 48 candles, 48 new" in result.output
    assert "1 of 2 jobs ready, 1 failed" in result.output
    cfg = RunConfig.model_validate(raw)
    assert not binance.stored_path(cfg.data.binance, cfg.cache_path, "NOPEUSDT", "1h").exists()


def test_a_damaged_stored_file_is_downloaded_again_with_one_warning(tmp_path, exchange, caplog):
    end = START + pd.Timedelta(hours=1200)
    cfg = binance_cfg(tmp_path, exchange, end=end.isoformat())
    candles = load_candles(cfg, "BTCUSDT", "1h")
    stored = binance.stored_path(cfg.data.binance, cfg.cache_path, "BTCUSDT", "1h")
    stored.write_bytes(b"\x00garbage, not gzip")
    requests = len(exchange.requests)

    with caplog.at_level("WARNING", logger="trainer"):
        again = load_candles(cfg, "BTCUSDT", "1h")
    pd.testing.assert_frame_equal(again, candles)
    assert len(exchange.requests) > requests  # downloaded again
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"binance:{stored}" in warnings[0] and "downloading the candles again" in warnings[0]
