"""Model cards for the Hub: one README.md per job, and one per run with the summary table.

Cards are built only from a job's own files (metrics.json, preprocessing.json, config.yaml), with no
timestamps, so the same job always yields the same bytes and an unchanged card is never re-committed.
The YAML metadata is rendered by huggingface_hub's ModelCardData.

Every card carries, in its metadata, the sha256 of the rest of its text (CARD_DIGEST): a card on the
Hub whose text still matches it was written by cryptotrain and may be replaced by a newer one, from
whichever machine or run directory; any edit by hand breaks the match, and such a card is kept.
"""
from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from huggingface_hub import EvalResult, ModelCardData

from ..data.sources import Source
from ..errors import ConfigError
from ..evaluation.baselines import VOLATILITY_NAMES, Baseline
from ..evaluation.results import BAR, DataInfo, JobMetrics, JobSummary
from ..formatting import direction, number
from ..run.jobdir import HAR, HISTORY, MODEL, PREPROCESSING, JobDir
from .plots import PLOT

PIPELINE_TAG = "time-series-forecasting"
CARD_DIGEST = "cryptotrain_card_sha256"
BASE_TAGS = ["keras", "lstm", "time-series-forecasting", "cryptocurrency", "cryptotrain"]


def hf_uri(repo_id: str, path_in_repo: str) -> str:
    """What `cryptotrain predict --model` takes for a job published at `path_in_repo`."""
    return f"hf://{repo_id}/{path_in_repo}" if path_in_repo else f"hf://{repo_id}"


def job_card(job_dir: Path, repo_id: str, path_in_repo: str, license: str = "mit", install: str = "") -> str:
    """`install`: the line that installs cryptotrain (see hub.install_line)."""
    job = JobDir(job_dir)
    metrics, prep, config = job.metrics(), job.preprocessing(), job.config()
    symbol, timeframe, data = metrics.symbol, metrics.timeframe, _public_data(metrics.data)
    test_range = [_iso(t) for t in metrics.test_range]
    if config.run is None:
        raise ConfigError(config.problem)
    dataset = config.run.data.chosen.dataset
    metadata = ModelCardData(
        library_name="keras",
        pipeline_tag=PIPELINE_TAG,
        license=license,
        datasets=[dataset] if dataset else None,
        tags=[*BASE_TAGS, symbol, timeframe] + (["synthetic-data"] if data["synthetic"] else []),
        model_name=f"{metrics.run}-{metrics.job}",
        eval_results=_eval_results(metrics, dataset),
        cryptotrain={
            "run": metrics.run, "job": metrics.job, "symbol": symbol, "timeframe": timeframe,
            "fingerprint": metrics.fingerprint,
            "data": data,
            "test_range": test_range,
        },
    )
    horizon, lookback = prep.horizon, prep.lookback
    heads = ", ".join(f"`{h.name}` ({', '.join(h.columns)})" for h in prep.heads)
    folder = f"{path_in_repo}/" if path_in_repo else ""
    sections = [
        f"# {symbol} {timeframe} forecaster (run `{metrics.run}`)",
        f"A Keras LSTM that forecasts the next {horizon} {timeframe} candle(s) of {symbol} from the last "
        f"{lookback} candles of {', '.join(prep.input_columns)}. Heads: {heads}. Trained with "
        "cryptotrain.",
        "## Data\n\n" + _data_text(data, metrics.n_test, test_range),
        "## Metrics\n\n" + _headline_text(metrics) + "\n\n" + _metrics_table(metrics) + _candles_text(metrics),
        "## Training\n\n" + _training_text(metrics),
        "## How to use\n\n" + _usage_text(repo_id, folder, hf_uri(repo_id, path_in_repo), install),
        "## Config\n\n```yaml\n" + _public_config(config.saved) + "```",  # as the job's run recorded it
    ]
    return _card(metadata, sections)


@dataclass(frozen=True)
class RunCardRow:
    """One line of the run card's table: the job's summary and its folder in the repo."""
    summary: JobSummary
    path: str


def job_row(job_dir: Path, path_in_repo: str) -> RunCardRow:
    return RunCardRow(JobDir(job_dir).metrics().summary(), path_in_repo)


def run_card(run_name: str, repo_id: str, rows: list[RunCardRow], license: str = "mit") -> str:
    """The repo's README.md when jobs live in sub-folders: what is here and how well each job does."""
    metadata = ModelCardData(library_name="keras", pipeline_tag=PIPELINE_TAG, tags=BASE_TAGS, license=license,
                             cryptotrain={"run": run_name, "jobs": [row.summary.job for row in rows]})
    lines = ["| job | files | epochs | head | test MAE | persistence MAE | skill |",
             "|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r.summary.job):
        s = row.summary
        lines.append(f"| {s.job} | [{row.path}](./{row.path}) | {s.epochs} | {s.head} | "
                     f"{_num(s.test_mae)} | {_num(s.persistence_mae)} | {_num(s.skill)} |")
    synthetic = [row.summary.job for row in rows if row.summary.synthetic]
    warning = [f"**Trained on synthetic candles: {', '.join(synthetic)}.** Their metrics show the pipeline "
               "works, not how a market behaves."] if synthetic else []
    sections = [
        f"# cryptotrain run `{run_name}`: {len(rows)} crypto price forecaster(s)",
        "One Keras LSTM per symbol and timeframe, each in its own folder with its model card, weights, "
        "preprocessing, metrics and plots. Metrics are on a held-out chronological test split, in price "
        "units, next to the persistence baseline (repeat the last candle); skill > 0 beats it.",
        *warning,
        "\n".join(lines),
        "## How to use\n\n```bash\ncryptotrain predict --model "
        f"{hf_uri(repo_id, rows[0].path if rows else 'SYMBOL/TIMEFRAME')} --json\n```",
    ]
    return _card(metadata, sections)


def _card(metadata: ModelCardData, sections: list[str]) -> str:
    unsigned = f"---\n{metadata.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n"
    digest = hashlib.sha256(unsigned.encode()).hexdigest()
    return unsigned.replace("\n---\n\n", f"\n{CARD_DIGEST}: {digest}\n---\n\n", 1)


def written_by_cryptotrain(card: str) -> bool:
    """Whether a card is one _card made, unedited since."""
    line = re.search(rf"^{CARD_DIGEST}: ([0-9a-f]{{64}})\n", card, flags=re.MULTILINE)
    if line is None:
        return False
    unsigned = card[:line.start()] + card[line.end():]
    return hashlib.sha256(unsigned.encode()).hexdigest() == line.group(1)


def _public_data(data: DataInfo) -> dict:
    """The data description without the directories of the machine that trained the model."""
    return {"source": Source.public_label(data.source),
            **data.model_dump(include={"synthetic", "first", "last", "rows"})}


def _public_config(config: dict) -> str:
    """The run config, less where that machine kept its outputs, caches and candle files (a directory's own
    name is kept: the `path` of every source that has one)."""
    public = {key: copy.deepcopy(value) for key, value in config.items() if key not in ("output_dir", "cache_dir")}
    data = public.get("data") or {}
    for name, source in Source.kinds.items():
        settings = data.get(name) or {}
        if "path" in source.model_fields and settings.get("path"):
            settings["path"] = Path(settings["path"]).name
    return yaml.safe_dump(public, sort_keys=False)


def _iso(timestamp: str) -> str:
    """ISO 8601 in UTC, whichever way the timestamp was written."""
    when = pd.Timestamp(timestamp)
    return (when.tz_localize("UTC") if when.tzinfo is None else when.tz_convert("UTC")).isoformat()


def _data_text(data: dict, n_test: int, test_range: list[str]) -> str:
    text = (f"Source: `{data['source']}`, {data['rows']} candles from {data['first']} to {data['last']}. "
            f"Test split: {n_test} forecasts from {test_range[0]} to {test_range[1]}.")
    if data["synthetic"]:
        text += ("\n\n**These candles are synthetic** (generated by cryptotrain): the metrics show the "
                 "pipeline works, not how a market behaves.")
    return text


def _headline_text(metrics: JobMetrics) -> str:
    """The one sentence a reader needs: better or worse than repeating the last candle, on unseen data."""
    line = metrics.headline
    what = f"`{line.head}` {line.column} (every step of the horizon)" if line.column else f"`{line.head}`"
    text = (f"**Test skill vs persistence: {_num(line.skill)}** for {what}: MAE {_num(line.mae)} against "
            f"{_num(line.persistence_mae)} for repeating the last candle.")
    if line.worse_than_persistence:
        text += (" **This model is worse than persistence**: on the test split, repeating the last candle "
                 "forecast better than it does.")
    shrink = line.shrink
    if shrink == 0:
        text += (" Validation found no deviation from \"no change\" worth keeping, so this model forecasts the "
                 "close as the last close (its wicks and other heads are still its own).")
    elif shrink < 1:
        text += (f" The forecast's deviation from \"no change\" is weighted {shrink:.2f}, a factor chosen on the "
                 "validation split.")
    if line.direction_accuracy is not None and shrink != 0:  # shrunk to no change: no direction to score
        text += (f" Direction of the close: {_num(line.direction_accuracy)} correct, against "
                 f"{_num(line.majority_rate)} for always answering the most frequent move.")
    return text


def _metrics_table(metrics: JobMetrics) -> str:
    lines = ["On the held-out test split, in price units. Persistence repeats the last known candle; "
             "skill compares the model's error with persistence's (> 0: the model is better). Each head serves the "
             "network mixed with its persistence (each column's last value; a candle's body: the last close): mix is "
             "the network's weight, chosen on the validation split, where its gain over persistence (val. gain: 1 - "
             "MAE / persistence's MAE) must be significant, else 0: the head repeats its last value.", "",
             "| head | model | MAE | RMSE | MAPE % | direction accuracy | skill | mix | val. gain "
             "| inconsistent candles |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for head, scores in metrics.heads.items():
        candles = scores.inconsistent_candles or {}
        for who, m in (("model", scores.model), ("persistence", scores.persistence)):
            model = who == "model"
            skill = _num(scores.skill) if model else ""
            accuracy = direction(m.direction_accuracy, scores.shrink, ".4g", "n/a") if model else ""
            inconsistent = _num(candles.get("model")) if model else ""
            mix, gain = (f"{scores.shrink:.2f}", _num(scores.validation_gain)) if model else ("", "")
            lines.append(f"| {head} | {who} | {_num(m.mae)} | {_num(m.rmse)} | {_num(m.mape)} | "
                         f"{accuracy} | {skill} | {mix} | {gain} | {inconsistent} |")
    return "\n".join(lines)


def _candles_text(metrics: JobMetrics) -> str:
    """The size of the next candle against the baselines a quant tries first, and the interval's coverage."""
    candles = metrics.candles
    if candles is None:
        return ""
    skills = candles.skill_vs(BAR)
    worse = [q for q, v in skills.items() if v is not None and v < 0]
    lines = ["", "", "### The next candle: its high, low and range", "",
             "Excursions from the last close C: high ln(high / C), low ln(C / low); range ln(high / low). MAE skill "
             "on the test split against each baseline, fitted on the train split (HAR + time of day: Corsi's HAR on "
             "log ranges with the time-of-day mean), and against HAR + time of day put on its level on validation as "
             "the network's forecasts are (the bar: like with like), and against HAR-X (HAR + time of day with the "
             "network's extra inputs, linear, on its level) where the job has it. The forecast served is the "
             "network's combined with HAR-X's and HAR's, the weights chosen on validation (served: each one's weight "
             "at the next candle; the network's 0: the baselines alone)." + (
                 f" **Worse than HAR + time of day on its level for the {' and the '.join(worse)}.**" if worse else ""),
             "", "| quantity | vs no change | vs persistence | vs EWMA | vs HAR + time of day | vs HAR on its level "
             "| vs HAR-X on its level | the network alone vs HAR on its level | the network alone vs HAR-X | network "
             "weight | served |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for quantity in ("high", "low", "range"):
        scores = getattr(candles, quantity)
        served = ", ".join(f"{name} {weights[0]:.2f}" for name, weights in scores.weights.items())
        alone = " | ".join(_num(scores.network_skill.get(b)) for b in (BAR, Baseline.HARX_LEVEL))
        lines.append(f"| {quantity} | " + " | ".join(_num(scores.skill.get(b)) for b in (
            Baseline.NO_CHANGE, Baseline.PERSISTENCE, Baseline.EWMA, Baseline.HAR_TOD, BAR, Baseline.HARX_LEVEL))
                     + f" | {alone} | {_num(scores.network_weight[0])} | {served} |")
    if candles.range.rms_weights:
        rms = ", ".join(f"{name} {weights[0]:.2f}" for name, weights in candles.range.rms_weights.items())
        lines += ["", "The range's root mean square (what QLIKE scores; `expected_range_rms_pct`, the scale to size "
                      "risk with) is a blend of its own: the network's, HAR-X's and HAR's, each on its level on "
                      f"validation, the weights chosen there by QLIKE (at the next candle: {rms})."]
    interval = candles.interval
    lines += ["", f"80 % interval of the next close: the network's close widened by {interval.calibration} "
                  f"(residuals normalised by {VOLATILITY_NAMES.get(interval.normaliser, interval.normaliser)}); the "
                  f"method's coverage, which it gives around any forecast: it held {_num(interval.coverage)} of the "
                  "test split; by tercile of that volatility "
                  + " / ".join(_num(c) for c in interval.coverage_by_tercile) + "."]
    return "\n".join(lines)


def _training_text(metrics: JobMetrics) -> str:
    engine = f" Trained with {metrics.engine.describe()}." if metrics.engine else ""
    return (f"{metrics.epochs_run} epoch(s) (best: epoch {metrics.best_epoch}, validation loss "
            f"{_num(metrics.best_val_loss)}), {metrics.seconds:.0f} s.{engine} Loss curves and the test-split "
            f"forecast are in `{PLOT}`, per-epoch losses in `{HISTORY}`.")


def _usage_text(repo_id: str, folder: str, uri: str, install: str) -> str:
    load = (f'keras.saving.load_model("hf://{repo_id}", compile=False)' if not folder else
            f'keras.saving.load_model(hf_hub_download("{repo_id}", "{folder}{MODEL}"), compile=False)')
    return (
        "Forecast the next candles from the latest ones (a CSV/Parquet/Feather file of "
        "`timestamp,open,high,low,close,volume`):\n\n"
        f"```bash\n{install}\ncryptotrain predict --model {uri} --data candles.csv\n```\n\n"
        "Or load the Keras model yourself (no custom objects needed for inference: `compile=False`):\n\n"
        "```python\nimport keras\n" + ("from huggingface_hub import hf_hub_download\n" if folder else "") +
        f"\nmodel = {load}\n```\n\n"
        "Its inputs are the last `lookback` rows of `input_columns`, framed relative to the window's last close "
        "when `relative_to` is `last_close` (price levels as log ratios to it, macd/signal/atr divided by it) and "
        f"scaled as `(x - offset) / scale` with `{PREPROCESSING}`'s scaler; its outputs are a dict of heads, "
        "scaled by each head's own scaler (log returns from the last close for prices). A head started at HAR + "
        f"time of day (`\"kind\": \"har_candle\"` in `{PREPROCESSING}`) also reads HAR's forecast after the "
        f"window, the inputs `har_high`, `har_low` and `har_range` (`{HAR}`; "
        "`trainer.evaluation.baselines.Har.inputs`), and outputs its log range as `HEAD_range`. "
        "`trainer.data.windows.Preprocessing` does both ways."
    )


def _eval_results(metrics: JobMetrics, dataset: str | None) -> list[EvalResult]:
    """The headline test scores (the close, price units) in the Hub's model-index format."""
    line = metrics.headline
    what = line.label
    source = _public_data(metrics.data)["source"]
    common = {"task_type": PIPELINE_TAG, "dataset_type": dataset or "crypto-candles", "dataset_split": "test",
              "dataset_name": f"{metrics.symbol} {metrics.timeframe} candles ({source})"}
    scores = [("mae", line.mae, f"MAE of {what} (price units)"),
              ("mae", line.persistence_mae, f"MAE of persistence, {what} (price units)"),
              ("skill", line.skill, "skill vs persistence (1 - MAE / persistence MAE)")]
    if metrics.candles is not None:
        scores += [("skill", value, f"next candle {quantity}: skill vs HAR + time of day on its validation level "
                                    "(1 - MAE / HAR MAE)") for quantity, value in metrics.candles.skill_vs(BAR).items()]
        scores.append(("coverage", metrics.candles.interval.coverage,
                       f"80 % interval of the next close ({metrics.candles.interval.calibration}): coverage"))
    return [EvalResult(**common, metric_type=kind, metric_value=value, metric_name=name)
            for kind, value, name in scores if value is not None]


def _num(value: float | None) -> str:
    return number(value, ".4g", missing="n/a")
