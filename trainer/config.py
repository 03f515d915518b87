"""Run configuration: YAML -> validated RunConfig, overrides, fingerprint.

Everything a run does is decided here, as data. The three model families differ only in
their YAML; a new family needs no code. Unknown keys are errors everywhere (extra="forbid").
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from .data.indicators import OHLCV, Indicator
from .data.scalers import Scaler
from .data.sources import (
    BinanceSource,
    FilePattern,
    FreqtradeSource,
    HfSource,
    LocalSource,
    Source,
    SyntheticSource,
    check_file_pattern,
    check_repo_id,
)
from .errors import UserError
from .files import beside_package
from .model.layers import Layer
from .specs import Strict, listed

INDICATORS = tuple(Indicator.kinds)  # every indicator's name, in the order of trainer/data/indicators.py
SCALERS = tuple(Scaler.kinds)  # window.scaler: a class each in trainer/data/scalers.py

TIMEFRAMES = ("1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d")


class ConfigError(UserError):
    """A bad config or override: the message is one line naming the file and the key path."""


# ----------------------------------------------------------------------------- data
def _repo_template(template: str) -> str:
    repo_id = check_file_pattern(template).format(symbol="BTCUSDT", timeframe="1h")
    if "/" not in repo_id:  # the Hub takes a bare name too, but a push should say whose repo it is
        raise ValueError(f"{template!r}: expected NS/NAME, the namespace (user or organisation) first")
    check_repo_id(repo_id)
    return template


RepoTemplate = Annotated[str, AfterValidator(_repo_template)]  # a repo id, or one per symbol and timeframe
SOURCES = tuple(Source.kinds)  # data.source: a section of DataConfig each


class DataConfig(Strict):
    source: Literal[SOURCES]
    symbols: list[str]
    timeframes: list[str]
    max_rows: int | None = Field(None, gt=0)
    local: LocalSource = LocalSource()
    hf: HfSource = HfSource()
    binance: BinanceSource = BinanceSource()
    synthetic: SyntheticSource = SyntheticSource()
    freqtrade: FreqtradeSource = FreqtradeSource()

    @property
    def chosen(self) -> Source:
        """The section that data.source names: where the run's candles come from."""
        return getattr(self, self.source)

    @field_validator("symbols")
    @classmethod
    def _symbols(cls, symbols: list[str]) -> list[str]:
        if not symbols:
            raise ValueError("must list at least one symbol")
        for s in symbols:
            if not re.fullmatch(r"[A-Z0-9]{2,20}", s):
                raise ValueError(f"'{s}' is not a symbol like BTCUSDT (upper-case letters and digits)")
        _no_duplicates(symbols, "symbols")
        return symbols

    @field_validator("timeframes")
    @classmethod
    def _timeframes(cls, timeframes: list[str]) -> list[str]:
        if not timeframes:
            raise ValueError("must list at least one timeframe")
        for tf in timeframes:
            if tf not in TIMEFRAMES:
                raise ValueError(f"unknown timeframe '{tf}' (one of {', '.join(TIMEFRAMES)})")
        _no_duplicates(timeframes, "timeframes")
        return timeframes


def _no_duplicates(items: list[str], what: str) -> None:
    dupes = sorted({x for x in items if items.count(x) > 1})
    if dupes:
        raise ValueError(f"duplicate {what}: {', '.join(dupes)}")


# ----------------------------------------------------------------------------- features
class FeaturesConfig(Strict):
    base: list[Literal[OHLCV]] = ["open", "high", "low", "close"]
    indicators: list[listed(Indicator)] = []

    @model_validator(mode="after")
    def _unique_columns(self) -> FeaturesConfig:
        _no_duplicates(self.columns, "feature columns")
        return self

    @property
    def columns(self) -> list[str]:
        """Model input columns, in order: the base OHLC(V) columns, then the indicators."""
        return list(self.base) + [ind.name for ind in self.indicators]


# ----------------------------------------------------------------------------- window, heads
class Split(Strict):
    train: float = Field(0.7, gt=0, lt=1)
    val: float = Field(0.15, gt=0, lt=1)
    test: float = Field(0.15, gt=0, lt=1)

    @model_validator(mode="after")
    def _sums_to_one(self) -> Split:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + val + test must sum to 1 (got {total:g})")
        return self


class WindowConfig(Strict):
    lookback: int = Field(gt=0)
    horizon: int = Field(gt=0)
    split: Split = Split()
    scaler: Literal[SCALERS] = "standard"
    # last_close: every window is seen relative to its last close (price levels as log ratios to it, price
    # differences divided by it; targets are log returns from it), so an all-zero output is "no change".
    # null: absolute price levels, as the old scripts did (their models cannot reach prices outside the
    # train split's range).
    relative_to: Literal["last_close"] | None = "last_close"
    # Relative framing only: each head's forecast deviation from "no change" is weighted by a factor in
    # [0, 1] chosen on the validation split (forecast combination with the no-change forecast), so that a
    # model's noise is not shipped where validation finds no signal. false: the network's output as it is.
    shrink: bool = True


CANDLE = ("open", "high", "low", "close")


class HeadConfig(Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    columns: list[str] = Field(min_length=1)
    loss: Literal["mse", "mae", "huber"] = "mse"
    weight: float = Field(1.0, gt=0)
    # A candle-shaped head over open, high, low, close: high >= max(open, close) >= min(open, close) >= low
    # by construction (open and close, plus two non-negative wicks).
    candle: bool = False
    # A quantile head: these quantiles of each column (e.g. [0.1, 0.5, 0.9]), ordered by construction (the
    # lowest plus non-negative gaps) and trained with the pinball loss; its point forecast is the median (0.5,
    # else the middle quantile).
    quantiles: list[float] = []

    @model_validator(mode="after")
    def _candle_columns(self) -> HeadConfig:
        if self.candle and sorted(self.columns) != sorted(CANDLE):
            raise ValueError(f"candle: true needs exactly the columns {', '.join(CANDLE)} "
                             f"(got {', '.join(self.columns)})")
        return self

    @model_validator(mode="after")
    def _quantile_levels(self) -> HeadConfig:
        if not self.quantiles:
            return self
        if len(self.quantiles) < 2 or not all(0 < q < 1 for q in self.quantiles) \
                or any(b <= a for a, b in zip(self.quantiles, self.quantiles[1:])):
            raise ValueError(f"quantiles: at least two levels, increasing, each between 0 and 1 (got "
                             f"{self.quantiles}), e.g. [0.1, 0.5, 0.9]")
        if self.candle:
            raise ValueError("quantiles: a candle head forecasts one candle; put the quantiles on a head of its own")
        if "loss" in self.model_fields_set:
            raise ValueError(f"loss: {self.loss}: a quantile head is trained with the pinball loss; drop the loss")
        return self


# ----------------------------------------------------------------------------- model layers
# Field names are Keras's own argument names, so each spec maps straight onto its layer class.
class ModelConfig(Strict):
    """The trunk, in order. Each head becomes a linear Dense on top (per time step if the trunk
    ends in a sequence)."""
    layers: list[listed(Layer)] = Field(min_length=1)


@dataclass(frozen=True, eq=False)
class NetworkSpec:
    """What a network is built from, and nothing else of the run's config (cf. nanoGPT's GPTConfig): the trunk
    (the model section), the heads, the window's shape and the input columns (RunConfig.network)."""
    name: str  # the Keras model's
    model: ModelConfig
    heads: tuple[HeadConfig, ...]
    lookback: int
    horizon: int
    relative: bool  # framed relative to the last close (window.relative_to): the heads start at "no change"
    columns: tuple[str, ...]  # the input features, in order
    error: Callable[[str], ConfigError] = ConfigError  # a spec Keras cannot chain: names the config's file

    @property
    def n_features(self) -> int:
        return len(self.columns)


# ----------------------------------------------------------------------------- training
class EarlyStoppingConfig(Strict):
    monitor: str = "val_loss"
    patience: int = Field(20, ge=0)
    min_delta: float = Field(0.0, ge=0)
    restore_best_weights: bool = True


class ReduceLrConfig(Strict):
    monitor: str = "val_loss"
    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(8, ge=0)
    min_lr: float = Field(1e-6, ge=0)


class TrainConfig(Strict):
    optimizer: Literal["adam", "adamw", "rmsprop", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0)
    clipvalue: float | None = Field(None, gt=0)
    clipnorm: float | None = Field(None, gt=0)
    batch_size: int = Field(32, gt=0)
    epochs: int = Field(100, gt=0)
    early_stopping: EarlyStoppingConfig | None = EarlyStoppingConfig()
    reduce_lr: ReduceLrConfig | None = ReduceLrConfig()
    seed: int = 42
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16", "auto"] = "float32"
    steps_per_execution: int = Field(1, gt=0)
    # Epoch-level logs per job under RUN/tensorboard/JOB (Keras's TensorBoard callback):
    # `tensorboard --logdir runs/NAME/tensorboard` compares every job of the run.
    tensorboard: bool = False

    @model_validator(mode="after")
    def _one_kind_of_clipping(self) -> TrainConfig:
        if self.clipvalue is not None and self.clipnorm is not None:
            raise ValueError("set clipvalue or clipnorm, not both")
        return self


class ExecutorConfig(Strict):
    """Where jobs train (`run --executor`, CLI options win): "local", this process; "ray", long-lived Ray workers,
    this process driving them (it keeps the run directory and the ledger)."""
    kind: Literal["local", "ray"] = "local"
    # "auto" (the cluster `ray start` made on this machine), "HOST:PORT" / "ray://HOST:PORT", or null: a Ray
    # started for this run on this machine alone (127.0.0.1), stopped at its end.
    address: str | None = None
    workers: int = Field(2, gt=0)
    cpus_per_worker: float = Field(1.0, gt=0)  # Ray resources, and the TensorFlow thread pools of each worker
    gpus_per_worker: float = Field(0.0, ge=0)


class HubConfig(Strict):
    # repo_id may hold {symbol} / {timeframe} for one repo per job; path_template places a job's
    # files inside the repo ("" for the repo root).
    repo_id: RepoTemplate | None = None
    private: bool = True
    path_template: FilePattern = "{symbol}/{timeframe}"
    license: str = "mit"  # the model cards' license (a Hub license identifier: mit, apache-2.0, other, ...)
    # The install line model cards show; default: from the git repository this cryptotrain was installed from.
    install: str | None = None


# ----------------------------------------------------------------------------- the run
class RunConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    output_dir: Path | None = None  # None: runs/{name}
    cache_dir: Path | None = None  # None: $CRYPTOTRAIN_CACHE or ~/.cache/cryptotrain
    data: DataConfig
    features: FeaturesConfig = FeaturesConfig()
    window: WindowConfig
    heads: list[HeadConfig] = Field(min_length=1)
    model: ModelConfig
    train: TrainConfig = TrainConfig()
    hub: HubConfig = HubConfig()
    executor: ExecutorConfig = ExecutorConfig()
    _origin: Path | None = PrivateAttr(None)  # the file it was loaded from

    def error(self, message: str) -> ConfigError:
        """A problem of this config found after loading (e.g. layers Keras cannot chain), naming its file."""
        return ConfigError(f"{self._origin}: {message}" if self._origin else message)

    @field_validator("heads")
    @classmethod
    def _unique_heads(cls, heads: list[HeadConfig]) -> list[HeadConfig]:
        _no_duplicates([h.name for h in heads], "head names")
        return heads

    @model_validator(mode="after")
    def _heads_target_features(self) -> RunConfig:
        columns = self.features.columns
        for i, head in enumerate(self.heads):
            missing = [c for c in head.columns if c not in columns]
            if missing:
                # The key path is part of the message: a model-level validator has no location of its own.
                raise ValueError(
                    f"heads[{i}].columns: head '{head.name}' targets {', '.join(missing)}, which is not a "
                    f"feature column (features are: {', '.join(columns)})"
                )
            if head.candle and self.window.relative_to is None:
                raise ValueError(f"heads[{i}].candle: a candle head needs window.relative_to: last_close")
        if self.window.relative_to == "last_close" and "close" not in columns:
            raise ValueError("window.relative_to: last_close needs close among features.base")
        return self

    @property
    def network(self) -> NetworkSpec:
        """The sections the network is built from (models.build_model, flops, training.ModelCache)."""
        return NetworkSpec(self.name, self.model, tuple(self.heads), self.window.lookback, self.window.horizon,
                           self.window.relative_to is not None, tuple(self.features.columns), self.error)

    @property
    def run_dir(self) -> Path:
        return self.output_dir if self.output_dir is not None else Path("runs") / self.name

    @property
    def cache_path(self) -> Path:
        """Feature and download cache, shared by all runs: keys are content hashes, never stale."""
        if self.cache_dir is not None:
            return self.cache_dir
        return Path(os.environ.get("CRYPTOTRAIN_CACHE", Path.home() / ".cache" / "cryptotrain"))

    def fingerprint(self) -> str:
        """sha256 of everything that makes a run what it is. Where results go (output_dir, cache_dir), where they
        are published (hub), where jobs train (executor) and FREE_KEYS (how long jobs may train: a run is
        extended, not replaced, when they change; whether TensorBoard logs are written) do not count."""
        data = self.fingerprint_data()
        for key in FREE_KEYS:
            section, _, name = key.rpartition(".")
            _at(data, section).pop(name, None)
        return hashlib.sha256(_canonical_json(data).encode()).hexdigest()

    def fingerprint_data(self) -> dict:
        """The config as the run directory records it: everything but where results go and are published, and
        where jobs train."""
        return self.model_dump(mode="json", exclude={"output_dir", "cache_dir", "hub", "executor"})


# How long a job may train. Changing them on an existing run extends or shortens its jobs' training instead of
# making it another run (runner.budget_plan decides, job by job).
BUDGET_KEYS = ("train.epochs", "train.early_stopping.patience")
# What may change on an existing run without making it another run.
FREE_KEYS = (*BUDGET_KEYS, "train.tensorboard")


def _at(data: dict, dotted: str) -> dict:
    """The dict at a dotted path, or an empty one where a section is null (no early stopping)."""
    for key in dotted.split("."):
        data = data.get(key) or {}
    return data


def _canonical_json(data: object) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------- loading
def bundled_configs_dir() -> Path:
    """Configs shipped with the package (wheel) or beside it (editable install / checkout)."""
    return beside_package("bundled_configs", Path("configs"))


def resolve_config_path(name: str | Path) -> Path:
    """A path as given if it exists; otherwise the bundled config of that name (`v8_aligned`,
    `v8_aligned.yaml` or `configs/v8_aligned.yaml`). A path into any other directory is never
    replaced by a bundled config: a typo there must not start a 40-job run of another config."""
    path = Path(name)
    candidates = [path, path.with_name(path.name + ".yaml")]
    if path.parent in (Path("."), Path("configs")):
        stem = path.name if path.suffix in (".yaml", ".yml") else path.name + ".yaml"
        candidates.append(bundled_configs_dir() / stem)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    bundled = ", ".join(sorted(p.stem for p in bundled_configs_dir().glob("*.yaml")))
    raise ConfigError(f"{name}: no such config file (bundled configs: {bundled})")


def load_config(name: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> RunConfig:
    """Read, override (`key.path=value`, value parsed as YAML) and validate a run config."""
    path = resolve_config_path(name)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    for override in overrides:
        _apply_override(raw, override, path)
    return validate_config(raw, path)


def validate_config(raw: dict, path: Path) -> RunConfig:
    """The settings read from `path` as a RunConfig; what is wrong with them is one line naming the file and key."""
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path)) from None
    cfg._origin = path
    return cfg


def _apply_override(raw: dict, override: str, path: Path) -> None:
    """`a.b.c=value` sets a nested key; a number indexes a list (`model.layers.0.units=64`)."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {override}: expected KEY.PATH=VALUE, e.g. --set train.epochs=2")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        raise ConfigError(f"--set {override}: the value is not valid YAML") from None
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        node = _child(node, part, override, path)
    if isinstance(node, list):
        node[_list_index(node, last, override, path)] = parsed
    else:
        node[last] = parsed


def _child(node: dict | list, part: str, override: str, path: Path) -> dict | list:
    if isinstance(node, list):
        return node[_list_index(node, part, override, path)]
    child = node.get(part)
    if child is None:
        child = node[part] = {}
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"--set {override}: {part} is not a mapping or list in {path}")
    return child


def _list_index(node: list, part: str, override: str, path: Path) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"--set {override}: '{part}' is not an index of a {len(node)}-item list in {path}")
    return int(part)


def format_validation_error(exc: ValidationError, path: Path) -> str:
    """`configs/x.yaml: train.epochs: Input should be greater than 0` (+ how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = _format_loc(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif first["type"] == "missing":
        message = "required key is missing"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{path}: {loc + ': ' if loc else ''}{message}{more}"


def _format_loc(loc: tuple) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).removeprefix(".")

