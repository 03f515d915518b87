"""Run configuration: YAML -> validated RunConfig, overrides, fingerprint.

Everything a run does is decided here, as data. The three model families differ only in
their YAML; a new family needs no code. Unknown keys are errors everywhere (extra="forbid").
RunConfig assembles the sections each stage reads, declared beside it (data/settings.py, model/settings.py,
evaluation/settings.py), with where jobs train and where they are published.
"""
from __future__ import annotations

import hashlib
import json
import os
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

from .data.indicators import Indicator
from .data.settings import DataConfig, FeaturesConfig, WindowConfig
from .data.sources import FilePattern, check_file_pattern, check_repo_id
from .errors import ConfigError
from .evaluation.settings import EvaluationConfig
from .files import beside_package
from .heads import Head
from .model.settings import BUDGET_KEYS, ModelConfig, NetworkSpec, TrainConfig
from .specs import Strict, listed, no_duplicates

INDICATORS = tuple(Indicator.kinds)  # every indicator's name, in the order of trainer/data/indicators.py


# ----------------------------------------------------------------------------- publishing
def _repo_template(template: str) -> str:
    repo_id = check_file_pattern(template).format(symbol="BTCUSDT", timeframe="1h")
    if "/" not in repo_id:  # the Hub takes a bare name too, but a push should say whose repo it is
        raise ValueError(f"{template!r}: expected NS/NAME, the namespace (user or organisation) first")
    check_repo_id(repo_id)
    return template


RepoTemplate = Annotated[str, AfterValidator(_repo_template)]  # a repo id, or one per symbol and timeframe


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
    # A cluster's GCS may restart (GCS fault tolerance; Ray's own drivers wait 60 s for it): the run stops, in one
    # line, once the GCS has not answered for this many seconds (the jobs left to resume).
    gcs_patience_s: float = Field(10.0, gt=0)


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
    heads: list[listed(Head)] = Field(min_length=1)
    model: ModelConfig
    train: TrainConfig = TrainConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    hub: HubConfig = HubConfig()
    executor: ExecutorConfig = ExecutorConfig()
    _origin: Path | None = PrivateAttr(None)  # the file it was loaded from

    def error(self, message: str) -> ConfigError:
        """A problem of this config found after loading (e.g. layers Keras cannot chain), naming its file."""
        return ConfigError(f"{self._origin}: {message}" if self._origin else message)

    @field_validator("heads")
    @classmethod
    def _unique_heads(cls, heads: list[Head]) -> list[Head]:
        """Every output of the model has a name of its own, as every input the heads read beside the windows."""
        no_duplicates([h.name for h in heads], "head names")
        owner = {}
        for head in heads:
            for output in head.outputs[1:]:  # a head's other outputs: their names are taken too
                if output in [h.name for h in heads]:
                    raise ValueError(f"head '{output}': the name of head '{head.name}''s output {output}; rename it")
            for name in head.input_shapes(1):
                if name in owner:
                    raise ValueError(f"heads '{owner[name]}' and '{head.name}' both read the model input {name}: one "
                                     f"head of kind {head.kind} at most")
                owner[name] = head.name
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
            try:
                head.check(relative=self.window.relative_to is not None)
            except ValueError as exc:
                raise ValueError(f"heads[{i}].kind: {exc}") from None
        if self.window.relative_to == "last_close" and "close" not in columns:
            raise ValueError("window.relative_to: last_close needs close among features.base")
        return self

    @model_validator(mode="after")
    def _market_references(self) -> RunConfig:
        market = self.features.market
        alone = [s for s in self.data.symbols if market is not None and not market.references(self.data.symbols, s)]
        if alone:
            raise ValueError(f"features.market.symbols: the job of {alone[0]} has no reference series (a job's own "
                             "symbol is left out of its references); list other symbols")
        return self

    @model_validator(mode="after")
    def _monitors_a_loss_of_the_model(self) -> RunConfig:
        outputs = [output for head in self.heads for output in head.outputs]
        losses = {f"{prefix}{name}" for prefix in ("", "val_") for name in ("loss", *(f"{o}_loss" for o in outputs))}
        for section in ("early_stopping", "reduce_lr"):
            monitor = getattr(getattr(self.train, section), "monitor", None)
            if monitor is not None and monitor.endswith("loss") and monitor not in losses:
                raise ValueError(f"train.{section}.monitor: {monitor} is no loss of this model (one of "
                                 f"{', '.join(sorted(losses))})")
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
        extended, not replaced, when they change; whether TensorBoard logs are written; how many jobs train together)
        do not count."""
        data = self.fingerprint_data()
        for key in FREE_KEYS:
            section, _, name = key.rpartition(".")
            _at(data, section).pop(name, None)
        return hashlib.sha256(_canonical_json(data).encode()).hexdigest()

    def fingerprint_data(self) -> dict:
        """The config as the run directory records it: everything but where results go and are published, and
        where jobs train."""
        return self.model_dump(mode="json", exclude={"output_dir", "cache_dir", "hub", "executor"})


# What may change on an existing run without making it another run.
FREE_KEYS = (*BUDGET_KEYS, "train.tensorboard", "train.pack")


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

