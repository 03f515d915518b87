"""A job's results as typed values: what its metrics.json holds (JobMetrics: where its candles came from, how
it trained, its test scores per head next to persistence's, and the headline it is judged by).

pipeline.train_one makes one; the Hub cards, predict and the report read one back through run.jobdir (which
writes the file as strict JSON), never a dict read back from disk. Its JobSummary is the job's row in the ledger,
which the driver's line, the summary files, status and the run card show. A key a record does not know is refused:
a file of another format is run.jobdir's to refuse, never half read.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..model.settings import Engine
from .names import Baseline

# The bar the network's forecasts of the size of the coming candles are judged against: HAR + time of day put on its
# level on validation, as the network's are (evaluation.serving.Serving), like with like
BAR = Baseline.HAR_TOD_LEVEL
BAR_RMS = Baseline.HAR_TOD_LEVEL_RMS


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scores(_Record):
    """Errors of one head's forecasts (or persistence's) over its columns and steps, in price units."""
    mae: float
    rmse: float | None = None
    mape: float | None = None  # percent; None where some actual value is 0
    direction_accuracy: float | None = None


class CloseScores(_Record):
    """The close against persistence, over every horizon step and per step (evaluate.close_scores)."""
    mae: float
    persistence_mae: float
    skill: float | None
    skill_by_step: list[float | None] = []
    direction_accuracy: float | None = None
    up_move_rate: float | None = None
    down_move_rate: float | None = None
    majority_rate: float | None = None
    skill_unshrunk: float | None = None  # the network's own forecast, before the shrink chosen on validation


class QuantileScores(_Record):
    """A quantile head on the test split: per level its pinball loss (price units) and how often the actual value
    was at or below it; the share inside the outermost pair, and their nominal coverage."""
    levels: list[float]
    pinball: list[float]
    below: list[float]
    coverage: float
    nominal: float


class HeadScores(_Record):
    model: Scores
    persistence: Scores
    skill: float | None  # 1 - model MAE / persistence MAE over the head's columns; None: persistence was exact
    # What is served: shrink x the network + (1 - shrink) x the head's persistence (evaluate.choose_shrink; 0: each
    # column's last value, a candle's body the last close), the factor chosen on validation where its gain there
    # (validation_gain: 1 - MAE / persistence's MAE of the best factor, over the judged columns) is significant
    shrink: float = 1.0
    validation_gain: float | None = None
    skill_unshrunk: float | None = None  # the network's own forecast (factor 1) on the test split
    close: CloseScores | None = None  # heads that predict the close
    inconsistent_candles: dict[str, float] | None = None  # candle heads: share with high/low inside the body
    quantiles: QuantileScores | None = None  # quantile heads (evaluate.quantile_scores)


class PointScores(_Record):
    """Errors of forecasts of one quantity of the coming candles (evaluate.candle_scores): MAE at the next
    candle, over every step and per step; for the range QLIKE too."""
    mae: float
    mae_horizon: float
    mae_by_step: list[float] = []
    qlike: float | None = None
    qlike_horizon: float | None = None


class QuantityScores(PointScores):
    """What users get of a quantity - the network's forecast combined with HAR-X's and HAR + time of day's
    (evaluation.serving) - and each baseline's (baselines.Baseline: no_change, persistence, ewma, har_tod,
    and har_tod_level: HAR + time of day put on its level on validation, as the network is, BAR); the network's own
    beside, and its weight per step in the combination (0: HAR alone)."""
    baselines: dict[str, PointScores]
    skill: dict[str, float | None]  # MAE skill at the next candle vs each baseline
    skill_horizon: dict[str, float | None]  # over every step
    network: PointScores
    network_skill: dict[str, float | None]
    network_weight: list[float]
    # What is served, per step: the weight of the network and of each baseline beside it ("harx" where the job has
    # HAR-X, "har_tod"), chosen on validation by MAE (evaluation.serving.Serving); summing to 1
    weights: dict[str, list[float]] = {}
    # The range: the weights of its served root mean square, chosen on validation by QLIKE, each source on its level
    rms_weights: dict[str, list[float]] | None = None
    # The range: QLIKE skill at the next candle of the root-mean-square range, vs HAR's as fitted (har_tod_rms) and
    # on its validation level (har_tod_level_rms, BAR_RMS); None for the excursions
    qlike_skill: dict[str, float | None] | None = None
    network_qlike_skill: dict[str, float | None] | None = None
    # Whether the network's own forecast differs from each baseline's beyond chance, at the next candle on the test
    # split: the Diebold-Mariano test's two-sided p-value (scores.diebold_mariano) of its MAE, and of the range's
    # QLIKE. Series that share a test period are not independent: a count of significant series is not a count of
    # independent confirmations
    network_p: dict[str, float | None] = {}
    network_qlike_p: dict[str, float | None] | None = None


class IntervalCoverage(_Record):
    """How an interval of the close's return fared on the test split (at the next candle unless said)."""
    coverage: float
    coverage_by_tercile: list[float]  # by tercile of the forecast volatility, low to high
    coverage_horizon: float  # over every step
    pinball: float  # mean pinball loss of its two bounds as quantiles


class IntervalScores(IntervalCoverage):
    """The interval of a conformal method (trainer.evaluation.intervals) around the network's close: "split" (split
    conformal on validation) or "adaptive" (adaptive conformal inference over the test split, starting from
    validation); static and EWMA-scaled quantiles beside it. How well it covers is the method's as much as the
    network's: the same method around "no change" covers as well (bench-baselines)."""
    nominal: float
    normaliser: str  # the volatility forecast the residuals were normalised by
    margin: list[float]  # per step, in units of that volatility: the margin of the next interval (predict's)
    baselines: dict[str, IntervalCoverage]
    pinball_skill: dict[str, float | None]
    method: Literal["split", "adaptive"]
    gamma: float | None = None  # adaptive: the step of its level
    level: list[float] | None = None  # adaptive: per step, the coverage level it ended the test split at

    @property
    def calibration(self) -> str:
        """How the margin was calibrated, said plainly (calibration_text)."""
        return calibration_text(self.method, self.level[0] if self.level else None)


def calibration_text(method: str, level: float | None) -> str:
    """"split conformal on validation", or e.g. "adaptive conformal, level 0.83 after the test split" (`level`: the
    next candle's, where adaptive conformal ended the test split)."""
    return "split conformal on validation" if method == "split" else \
        f"adaptive conformal, level {level:.2f} after the test split"


class MeanRangeScores(_Record):
    """The mean range over the next `steps` candles: QLIKE of what users get, of the network's own and of HAR +
    time of day's (each the mean of its root-mean-square ranges, times its QLIKE-optimal factor on validation)."""
    steps: int
    qlike: float | None
    network_qlike: float | None
    har_qlike: float | None
    qlike_skill: float | None
    network_qlike_skill: float | None


class ValidationSkill(_Record):
    """The network's own forecasts of the next candle on the validation split, against HAR + time of day on its
    level there (BAR, BAR_RMS): what a choice among variants (a setting, a head, a family) is made on, never the test
    split's figures. Both are put on their level on that split, so the figures are in-sample for both alike."""
    range_qlike: float | None  # QLIKE skill of the range's root mean square
    range_mae: float | None  # MAE skill of the range's median
    high_low_mae: float | None  # MAE skill of the high and low excursions together (the sum of their MAEs)


class CandleScores(_Record):
    """The size of the coming candles (a candle head's high, low and range) against the baselines that fit
    each, and the interval of the close's return."""
    head: str
    steps: int
    high: QuantityScores
    low: QuantityScores
    range: QuantityScores
    interval: IntervalScores
    mean_range: MeanRangeScores | None = None  # None: one step
    validation: ValidationSkill

    def skill_vs(self, baseline: str = BAR) -> dict[str, float | None]:
        """Next-candle MAE skill of the high, the low and the range vs one baseline."""
        return {q: getattr(self, q).skill.get(baseline) for q in ("high", "low", "range")}


class Headline(_Record):
    """What a job is judged by (evaluate.headline): the close of the first head that predicts it, else the
    first head's skill over its columns."""
    head: str
    column: str | None = None
    skill: float | None
    mae: float
    persistence_mae: float
    direction_accuracy: float | None = None
    majority_rate: float | None = None
    shrink: float = 1.0

    @property
    def label(self) -> str:
        """"ohlc.close", or the head's name alone."""
        return self.head + (f".{self.column}" if self.column else "")

    @property
    def worse_than_persistence(self) -> bool:
        return self.skill is not None and self.skill < 0


class Evaluation(_Record):
    """evaluate's scores of a job's test split: per head, and the headline."""
    heads: dict[str, HeadScores]
    headline: Headline
    n_test: int


class DataInfo(_Record):
    """Where the job's candles came from."""
    source: str
    synthetic: bool = False
    first: str  # ISO timestamps of the first and last candle
    last: str
    rows: int
    gaps: int = 0


class Timing(_Record):
    """Where a job's time went (metrics.json's "timing"), in seconds, each phase where it ran: benchmarks/
    bench_family.py adds them up over a run. Writing the job's directory comes after and is not in it."""
    prepare: float  # candles -> features (a hit or a miss of the feature cache), in the driver
    windows: float  # features -> windows, and the baselines fitted on the train split
    epochs: list[float]  # each epoch trained in this process, its validation included; packed: its pack's epochs
    train_windows: int  # the windows an epoch trains on
    evaluate: float  # the forecasts of the validation and test splits (packed: its share of its pack's), their
    # scores, what is served


class JobMetrics(_Record):
    job: str
    symbol: str
    timeframe: str
    run: str
    fingerprint: str
    data: DataInfo
    epochs_run: int
    best_epoch: int
    best_val_loss: float
    seconds: float
    # the time in its training steps in this process, its validation not included, its first epoch's compilation
    # included (callbacks.StepTimer), on either engine; a packed job's: its pack's, which its jobs share (the host's
    # writing of the epoch before's checkpoints and progress meanwhile not in it, as a job's alone is not)
    train_step_seconds: float | None = None
    rss_mb: float | None = None
    engine: Engine | None = None  # None in runs of an earlier cryptotrain
    timing: Timing | None = None  # likewise
    heads: dict[str, HeadScores]
    headline: Headline
    candles: CandleScores | None = None  # a candle head's high, low and range; None without one
    n_test: int
    test_range: list[str]  # target times of the first and last test forecast

    def non_finite(self) -> tuple[str, float] | None:
        """Its first number that is NaN or infinite (a score that means nothing), with its key path."""
        return non_finite(self.model_dump())

    def summary(self) -> JobSummary:
        """The job's row of the run's summary table: the headline next to persistence, how it trained."""
        line = self.headline
        return JobSummary(
            job=self.job, epochs=self.epochs_run, best_epoch=self.best_epoch, best_val_loss=self.best_val_loss,
            head=line.label, test_mae=line.mae, persistence_mae=line.persistence_mae, skill=line.skill,
            direction_accuracy=line.direction_accuracy, majority_rate=line.majority_rate, shrink=line.shrink,
            repeating=[name for name, scores in self.heads.items()
                       if scores.shrink == 0 and not (name == line.head and line.column == "close")],
            **self._candle_summary(), seconds=self.seconds, train_step_seconds=self.train_step_seconds,
            rss_mb=self.rss_mb, synthetic=self.data.synthetic)

    def _candle_summary(self) -> dict:
        """Next-candle skill of the high, the low and the range vs HAR + time of day on its validation level (BAR),
        the network's weight in them (the mean of the three at the next candle); the 80 % interval's coverage."""
        if self.candles is None:
            return {}
        weights = [getattr(self.candles, q).network_weight[0] for q in ("high", "low", "range")]
        return {**{f"{q}_skill_har": v for q, v in self.candles.skill_vs(BAR).items()},
                "network_weight": sum(weights) / len(weights), "interval_coverage": self.candles.interval.coverage}


def non_finite(data: object, where: str = "") -> tuple[str, float] | None:
    """The first number in `data` (nested dicts and lists) that is NaN or infinite, with its key path."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where, data)
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


class JobSummary(_Record):
    """A done job's row of the run's summary table (JobMetrics.summary), kept in the ledger: summary.json/csv,
    status and the run card are projections of these rows, in this order of keys. The candle columns are None for a
    job without a candle head."""
    job: str
    epochs: int
    best_epoch: int
    best_val_loss: float
    head: str  # the headline's label, e.g. "ohlc.close"
    test_mae: float
    persistence_mae: float
    skill: float | None
    direction_accuracy: float | None = None
    majority_rate: float | None = None
    shrink: float = 1.0
    # The heads served as their persistence (shrink 0: validation found the network no better than each column's last
    # value), but the headline's close, which `shrink` says
    repeating: list[str] = []
    high_skill_har: float | None = None  # next-candle MAE skill vs HAR + time of day on its validation level (BAR)
    low_skill_har: float | None = None
    range_skill_har: float | None = None
    network_weight: float | None = None  # the network's mean weight beside HAR in those three, at the next candle
    interval_coverage: float | None = None  # the 80 % interval's, on the test split
    seconds: float
    train_step_seconds: float | None = None
    rss_mb: float | None = None
    synthetic: bool = False
