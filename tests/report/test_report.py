"""`report.write_report`: the HTML page of a real run (two jobs done, two failed, two pending), checked as
HTML: every job present, heatmap cells equal to metrics.json, nothing fetched from elsewhere, errors and
missing files shown, charts drawn from the run's own files; and the per-job plot.png a push draws."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from html import escape
from html.parser import HTMLParser
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import REPO, tiny_config_dict
from trainer.cli import main
from trainer.config import load_config
from trainer.data.sources import Source
from trainer.errors import UserError
from trainer.evaluation.results import Headline
from trainer.publish.plots import draw_plot
from trainer.report.console import print_summary_table
from trainer.report.html import write_report
from trainer.run.jobdir import CloseSeries, JobDir
from trainer.run.ledger import Ledger
from trainer.run.rundir import RunDir

pytestmark = pytest.mark.train  # a run trained once for the module (test_the_job_plot alone needs none)

DONE = ["BTCUSDT_15m", "BTCUSDT_1h"]
FAILED = ["NOSUCHUSDT_15m", "NOSUCHUSDT_1h"]
PENDING = ["ETHUSDT_15m", "ETHUSDT_1h"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run of the tiny config: BTC's two jobs trained, NOSUCHUSDT's failed (no candle file), ETH's left
    pending (not selected by --only)."""
    tmp = tmp_path_factory.mktemp("report")
    config = tmp / "tiny.yaml"
    cfg = tiny_config_dict(tmp)
    cfg["data"] = {**cfg["data"], "symbols": ["BTCUSDT", "ETHUSDT", "NOSUCHUSDT"], "timeframes": ["15m", "1h"]}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = CliRunner().invoke(main, ["run", "--config", str(config), "--only", "BTC*", "--only", "NOSUCH*",
                                       "--retries", "0"])
    assert result.exit_code == 1, result.output[-3000:]  # the failed jobs make it 1
    ledger = tmp / "run" / "ledger.sqlite"
    statuses = {r.name: r.status for r in Ledger(tmp / "run").jobs()} if ledger.exists() else {}
    expected = {**dict.fromkeys(DONE, "done"), **dict.fromkeys(FAILED, "failed"), **dict.fromkeys(PENDING, "pending")}
    assert statuses == expected, result.output[-3000:]
    return tmp / "run"


@pytest.fixture
def run_copy(run_dir, tmp_path) -> Path:
    """A copy of the run to damage."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


class Page(HTMLParser):
    """What the tests look at: every tag with its attributes, heatmap cells, and the text of each job's
    <details>, of each table row, and of the whole page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.maps: dict[str, dict[str, dict]] = {}  # heatmap (its measure) -> job -> the cell's attributes
        self.rows: dict[str, str] = {}  # jobs table: job -> the row's text
        self.details: dict[str, str] = {}  # job -> its <details>' text
        self.svgs: dict[str, int] = {}  # job -> <svg> elements in its details
        self.polylines: dict[str, int] = {}
        self.text: list[str] = []
        self._open: list[tuple[str, str, dict]] = []  # (tag, job, kind) for the details and rows being read
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        job = attrs.get("data-job")
        if tag == "td" and job and "data-value" in attrs:
            self.maps.setdefault(attrs["data-measure"], {})[job] = attrs
        if tag in ("details", "tr") and job:
            self._open.append((tag, job, self.details if tag == "details" else self.rows))
        inside = [j for t, j, _ in self._open if t == "details"]
        if inside and tag in ("svg", "polyline"):
            counts = self.svgs if tag == "svg" else self.polylines
            counts[inside[-1]] = counts.get(inside[-1], 0) + 1

    @property
    def cells(self) -> dict[str, dict]:
        """The close's skill heatmap."""
        return self.maps.get("skill", {})

    def handle_endtag(self, tag):
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data):
        self.text.append(data)
        for _, job, into in self._open:
            into[job] = into.get(job, "") + data


def report_of(run_dir: Path, out: Path | None = None) -> Path:
    """write_report of the run directory, opened as `cryptotrain report` opens it."""
    with RunDir.open(run_dir) as run:
        return write_report(run, out)


def _page(run: Path, **kwargs) -> Page:
    return Page(report_of(run, **kwargs).read_text(encoding="utf-8"))


def _metrics(run: Path, job: str) -> dict:
    return json.loads((run / "jobs" / job / "metrics.json").read_text())


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def test_every_job_is_in_the_heatmap_the_table_and_the_details(run_dir):
    out = report_of(run_dir)
    assert out == run_dir / "report.html" and not list(run_dir.glob("tmp*"))  # written atomically, in place
    page = Page(out.read_text(encoding="utf-8"))
    jobs = [r.name for r in Ledger(run_dir).jobs()]
    assert sorted(jobs) == sorted(DONE + FAILED + PENDING)
    assert set(page.cells) == set(page.rows) == set(page.details) == set(jobs)
    for job in jobs:
        assert page.cells[job]["data-status"] == ("done" if job in DONE else "failed" if job in FAILED else "pending")
    text = _squeezed(" ".join(page.text))
    assert "6: 2 done, 2 failed, 2 pending" in text
    records = [r for r in Ledger(run_dir).jobs() if r.started_at is not None and r.finished_at is not None]
    summed = sum(r.seconds or 0 for r in Ledger(run_dir).jobs())
    wall = max(r.finished_at for r in records) - min(r.started_at for r in records)
    assert f"job time {summed:.1f} s, the sum of the jobs' seconds" in text or " min " in text, text
    assert f"wall time {wall:.1f} s from the first job's start to the last one's end" in text or " min " in text
    assert "SYNTHETIC" not in text  # real candles


def test_heatmap_cells_carry_the_headline_skill_of_metrics_json(run_dir):
    page = _page(run_dir)
    for job in DONE:
        skill = _metrics(run_dir, job)["headline"]["skill"]
        assert float(page.cells[job]["data-value"]) == pytest.approx(skill, abs=1e-12)
        assert f"{skill:+.3f}" in " ".join(page.text)
        assert page.cells[job].get("style", "").startswith("background:")  # coloured by its skill
    for job in FAILED + PENDING:  # marked, with no skill
        assert page.cells[job]["data-value"] == ""


def test_heatmaps_of_the_next_candle_vs_har_and_of_the_interval_carry_metrics_json(run_dir):
    page = _page(run_dir)
    assert set(page.maps) == {"skill", "high vs HAR", "low vs HAR", "range vs HAR", "80 % interval"}
    for job in DONE:
        candles = _metrics(run_dir, job)["candles"]
        for quantity in ("high", "low", "range"):
            cell = page.maps[f"{quantity} vs HAR"][job]
            assert float(cell["data-value"]) == pytest.approx(candles[quantity]["skill"]["har_tod_level"], abs=1e-12)
        assert float(page.maps["80 % interval"][job]["data-value"]) == pytest.approx(candles["interval"]["coverage"])
    for measure in page.maps.values():
        assert all(measure[job]["data-value"] == "" for job in FAILED + PENDING)


def test_the_page_fetches_nothing_from_elsewhere(run_dir):
    page = _page(run_dir)
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "data", "poster"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "ftp:")), (tag, name, value)
        assert not (tag == "link" and "stylesheet" in (attrs.get("rel") or "")), "an external style sheet"
        assert not (tag == "script" and attrs.get("src")), "an external script"
        assert not (tag == "img" and attrs.get("src")), "charts are inline SVG, not images"
    html = (run_dir / "report.html").read_text()
    assert "@import" not in html and "url(http" not in html


def test_failed_jobs_show_their_error_in_the_table_and_their_details(run_dir):
    page = _page(run_dir)
    errors = {r.name: r.error for r in Ledger(run_dir).jobs() if r.status == "failed"}
    assert set(errors) == set(FAILED)
    for job, error in errors.items():
        assert "NOSUCHUSDT" in error and error in page.details[job] and error in page.rows[job]
        assert "failed" in page.rows[job]
    assert "Not trained yet" in page.details["ETHUSDT_1h"]


def test_each_done_job_has_its_loss_curves_and_its_test_close_against_persistence(run_dir):
    page = _page(run_dir)
    for job in DONE:
        details = _squeezed(page.details[job])
        assert page.svgs[job] >= 2 and page.polylines[job] >= 5  # 2 loss curves; actual, predicted, persistence
        for words in ("train loss", "validation loss", "actual close", "predicted close", "persistence (last close)",
                      "epoch", "target time (UTC)"):
            assert words in details, (job, words)
        assert "from predictions.npz" in details
        assert "is missing" not in details and "unreadable" not in details and "no price chart" not in details


def test_the_actual_and_persistence_closes_agree_with_the_jobs_own_metrics(run_dir):
    """The chart's series give back the first step's skill of metrics.json: they are the test split's closes."""
    for job in DONE:
        job_dir = JobDir(run_dir / "jobs" / job)
        metrics = _metrics(run_dir, job)
        [head] = [h for h in job_dir.preprocessing().heads if h.name == metrics["headline"]["head"]]
        prices = job_dir.test_closes(head.name, list(head.columns))
        first_step = 1 - np.mean(np.abs(prices.predicted - prices.actual)) / np.mean(
            np.abs(prices.persistence - prices.actual))
        assert first_step == pytest.approx(metrics["heads"]["ohlc"]["close"]["skill_by_step"][0], abs=1e-9)
        np.testing.assert_array_equal(prices.persistence[1:], prices.actual[:-1])  # consecutive bars


def test_missing_or_damaged_job_files_are_noted_not_fatal(run_copy):
    (run_copy / "jobs" / "BTCUSDT_1h" / "history.csv").unlink()
    (run_copy / "jobs" / "BTCUSDT_1h" / "predictions.npz").write_bytes(b"not a zip")
    (run_copy / "jobs" / "BTCUSDT_15m" / "metrics.json").unlink()
    page = _page(run_copy)
    one_h, fifteen = _squeezed(page.details["BTCUSDT_1h"]), _squeezed(page.details["BTCUSDT_15m"])
    assert "history.csv is missing" in one_h and "predictions.npz is unreadable" in one_h
    assert "manifest does not verify" in one_h
    assert "metrics.json is missing" in fifteen and "from the run ledger" in fifteen
    # metrics.json gone: the heatmap falls back on the ledger's summary of the job
    summary = next(r.summary for r in Ledger(run_copy).jobs() if r.name == "BTCUSDT_15m")
    assert float(page.cells["BTCUSDT_15m"]["data-value"]) == pytest.approx(summary.skill)

    shutil.rmtree(run_copy / "jobs" / "BTCUSDT_1h")
    page = _page(run_copy)
    assert "directory" in page.details["BTCUSDT_1h"] and "is missing" in page.details["BTCUSDT_1h"]


def test_a_run_of_an_earlier_version_without_closes_gets_a_note_instead_of_a_chart(run_copy):
    job_dir = run_copy / "jobs" / "BTCUSDT_1h"
    with np.load(job_dir / "predictions.npz") as saved:
        arrays = {key: saved[key] for key in saved.files if key not in ("actual_close", "persistence_close")}
    np.savez(job_dir / "predictions.npz", **arrays)
    details = _squeezed(_page(run_copy).details["BTCUSDT_1h"])
    assert "no price chart: predictions.npz holds no actual close" in details
    assert "train loss" in details  # the rest of the job is still shown


def test_a_close_shrunk_to_no_change_shows_no_direction_accuracy(run_copy, capsys, monkeypatch):
    """A close shrunk to exactly no change (shrink 0) is always the last close: no direction, so "—" where its
    direction accuracy would be (the report's table and details, the console's summary), said why in the legend;
    a close shrunk by 0.5 shows its number."""
    shown = {"BTCUSDT_15m": (0.0, 0.123), "BTCUSDT_1h": (0.5, 0.517)}  # job -> (shrink, direction accuracy)
    for job, (shrink, accuracy) in shown.items():
        metrics = _metrics(run_copy, job)
        head = metrics["headline"]["head"]
        metrics["headline"] |= {"shrink": shrink, "direction_accuracy": accuracy}
        metrics["heads"][head]["shrink"] = shrink
        metrics["heads"][head]["model"]["direction_accuracy"] = accuracy
        (run_copy / "jobs" / job / "metrics.json").write_text(json.dumps(metrics))
    page = _page(run_copy)
    hidden, kept = (_squeezed(page.rows[job]) for job in shown)
    assert hidden.count("—") == 2 and "0.123" not in hidden  # the headline's and the head's column
    assert "—" not in kept and kept.count("0.517") == 2
    assert "direction — vs majority" in _squeezed(page.details["BTCUSDT_15m"])
    assert "direction 0.517 vs majority" in _squeezed(page.details["BTCUSDT_1h"])
    assert "—: the close was shrunk to exactly no change" in _squeezed(" ".join(page.text))

    monkeypatch.setenv("COLUMNS", "200")  # rich's width off a terminal
    records = [dataclasses.replace(r, summary=r.summary.model_copy(update=dict(zip(
        ("shrink", "direction_accuracy"), shown[r.name])))) if r.name in shown else r for r in Ledger(run_copy).jobs()]
    print_summary_table(records)
    out = capsys.readouterr().out
    lines = {job: next(line for line in out.splitlines() if line.strip().startswith(job)) for job in shown}
    assert "—" in lines["BTCUSDT_15m"] and "0.123" not in lines["BTCUSDT_15m"]
    assert "0.517" in lines["BTCUSDT_1h"] and "—" not in lines["BTCUSDT_1h"]
    assert "dir: direction accuracy of the close (—: shrunk to exactly no change" in _squeezed(out)


def test_a_synthetic_job_labels_the_whole_page(run_copy):
    metrics = _metrics(run_copy, "BTCUSDT_1h")
    metrics["data"]["synthetic"] = True
    (run_copy / "jobs" / "BTCUSDT_1h" / "metrics.json").write_text(json.dumps(metrics))
    assert "SYNTHETIC" in " ".join(_page(run_copy).text)


@pytest.mark.parametrize("source", list(Source.kinds))
def test_the_header_says_where_each_source_takes_its_candles_from(run_copy, source):
    """Each source describes itself; the page says what the run's source says, and a synthetic source labels
    the page even where no job's metrics say so."""
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["data"]["source"] = source
    (run_copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    chosen = load_config(run_copy / "config.yaml").data.chosen
    html = report_of(run_copy).read_text()
    assert f"<dt>data</dt><dd>{escape(chosen.describe())}</dd>" in html
    assert ("SYNTHETIC candles: these jobs were trained on generated data" in html) is chosen.synthetic


def test_the_style_and_script_are_the_package_files_inline(run_dir):
    html = report_of(run_dir).read_text()
    for name, tag in (("report.css", "style"), ("report.js", "script")):
        text = (files("trainer.report") / "static" / name).read_text(encoding="utf-8")
        assert len(text) > 500 and f"<{tag}>\n{text}</{tag}>" in html


def test_the_table_sorts_on_numbers_each_cell_carries(run_dir):
    page = _page(run_dir)
    sortable = [attrs for tag, attrs in page.tags if tag == "th" and "data-col" in attrs]
    assert [int(a["data-col"]) for a in sortable] == list(range(len(sortable)))
    html = (run_dir / "report.html").read_text()
    assert "addEventListener('click'" in html and "data-v=" in html


def test_another_output_path_and_a_directory_that_is_not_a_run(run_dir, tmp_path):
    out = report_of(run_dir, tmp_path / "elsewhere" / "page.html")
    assert out == tmp_path / "elsewhere" / "page.html" and out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(UserError, match="not a run directory") as caught:
        report_of(tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "ledger.sqlite").exists()  # nothing created there
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="cannot write the report"):
        report_of(run_dir, tmp_path / "a_file" / "page.html")  # its folder is a file


def test_the_report_loads_neither_tensorflow_nor_keras_and_prints_nothing(run_dir, tmp_path):
    script = ("import sys; from pathlib import Path; from trainer.report.html import write_report; "
              "from trainer.run.rundir import RunDir\n"
              "with RunDir.open(Path(sys.argv[1])) as run: write_report(run, Path(sys.argv[2]))\n"
              "sys.stderr.write(' '.join(m for m in ('tensorflow', 'keras', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script, str(run_dir), str(tmp_path / "r.html")], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert (tmp_path / "r.html").is_file()


def test_the_job_plot_states_its_scores_persistence_and_synthetic_data(tmp_path):
    history = pd.DataFrame({"epoch": [1, 2, 3], "loss": [1.0, 0.5, 0.4], "val_loss": [1.2, 0.9, 0.8]})
    times = np.arange("2024-01-01T00", "2024-01-03T00", dtype="datetime64[h]").astype("datetime64[ns]")
    actual = 100 + np.cumsum(np.random.default_rng(0).normal(size=len(times)))
    scores = Headline(head="ohlc", column="close", mae=1.5, persistence_mae=1.4, skill=-0.0714)
    closes = CloseSeries(times, actual + 0.1, actual, np.roll(actual, 1))
    both = draw_plot(history, closes, "BTCUSDT_1h", scores=scores, synthetic=True)
    losses = draw_plot(history, None, "BTCUSDT_1h")  # a job whose head forecasts no close: its losses alone
    for png, height in ((both, 468), (losses, 252)):
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[20:24], "big") == height
