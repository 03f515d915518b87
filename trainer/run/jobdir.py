"""A job's directory (RUN/jobs/SYMBOL_TF): the one module that knows the names of its files, writes them, reads
them back as typed values, and knows the format they are laid out in.

The format is manifest.json's "format" (FORMAT; a manifest without one is of format 1). Every change to what a
file of the directory holds bumps it, as numpy's .npy versions do. This version reads its own format only: a
directory of another one is refused in one line naming it (cryptotrain is at 0.1.0: there are no upgrade steps;
`run` trains such a job again, see run.runner). Format 1 held plot.png; 2 had no head kinds, and metrics.json,
preprocessing.json and har.json lacked what 3 holds (the heads' kinds, the network's level on validation, HAR's
log variance); 3's metrics.json lacked what 4 holds (each head's validation gain and the network's own skill beside
its mix with its persistence, the weights of what is served of the next candles, HAR-X's scores), and 4 adds
harx.json (HAR-X, where the job has it); 5 adds serving.json (what is served of the next candles: factors, weights,
the interval's margin; before, in metrics.json's candles, whose range root mean square had the medians' weights).

No TensorFlow, Keras or Matplotlib is imported here (the report reads job directories without them).
"""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pandas as pd
import yaml
from pydantic import ValidationError

from ..config import ConfigError, FeaturesConfig, RunConfig, TrainConfig, validate_config
from ..data.windows import Preprocessing
from ..errors import UserError, cause
from ..evaluation import charts
from ..evaluation.baselines import Har
from ..evaluation.results import JobMetrics
from ..evaluation.serving import Serving
from ..files import json_bytes, sha256_file

if TYPE_CHECKING:
    import keras

FORMAT = 5  # of the directories this version writes and reads

MANIFEST = "manifest.json"  # sha256 of every other file, and the format
MODEL = "model.keras"
PREPROCESSING = "preprocessing.json"  # Preprocessing: columns, scalers, lookback, horizon, heads, indicators
METRICS = "metrics.json"  # JobMetrics
HISTORY = "history.csv"  # one row per epoch
CONFIG = "config.yaml"  # the run's config, as published with the model
PREDICTIONS = "predictions.npz"  # the test split: each head's forecasts, the actual and persistence close
HAR = "har.json"  # the fitted HAR + time of day, with a head that forecasts high, low and close
HARX = "harx.json"  # HAR-X (HAR + time of day with the network's extra inputs), where the job's features hold them
SERVING = "serving.json"  # what is served of the size of the coming candles (evaluation.serving.Serving), with HAR

T = TypeVar("T")


class JobFileError(UserError):
    """A file of a job directory that is missing, or there but not what it should be (garbage, a truncated copy, a
    format this version does not know): one line naming it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: cannot be read ({reason}); train the job again, or download it again")
        self.path, self.reason = path, reason


class MissingJobFile(JobFileError):
    def __init__(self, path: Path) -> None:
        super().__init__(path, "it is missing")


# ----------------------------------------------------------------------------- the directory
@dataclass(frozen=True)
class CloseSeries:
    """A head's close on the test split at the first forecast step, per sample: what the price chart shows."""
    times: np.ndarray  # datetime64[ns]
    predicted: np.ndarray
    actual: np.ndarray
    persistence: np.ndarray  # each sample's last input close


@dataclass(frozen=True)
class JobConfig:
    """A job's config.yaml, read once: as its run saved it, the sections forecasting needs (which a job saved by
    an earlier version still passes), and the whole run config where this version reads it."""
    saved: dict
    features: FeaturesConfig
    train: TrainConfig  # what the job was trained with
    run: RunConfig | None
    problem: str | None = None  # why `run` is None: the config error, one line


@dataclass(frozen=True)
class JobDir:
    """A job's directory: a finished one (RUN/jobs/NAME, a Hub download), or the staging directory it is written
    into."""
    path: Path

    # ------------------------------------------------------------------------- what it is
    def is_job(self) -> bool:
        """A directory of a finished job (predict: a job directory rather than a run directory)."""
        return (self.path / PREPROCESSING).is_file()

    def has_manifest(self) -> bool:
        return (self.path / MANIFEST).is_file()

    @property
    def model_file(self) -> Path:
        return self.path / MODEL

    @cached_property
    def format(self) -> int | None:
        """manifest.json's format (1 where it names none); None where there is no manifest to say (a staging
        directory, a damaged one)."""
        try:
            found = json.loads((self.path / MANIFEST).read_text()).get("format", 1)
        except (OSError, ValueError, AttributeError):
            return None
        return found if isinstance(found, int) else None

    def check_format(self) -> None:
        """UserError, one line, for a directory of another format than this version's (FORMAT)."""
        found = self.format
        if found is None or found == FORMAT:
            return
        if found > FORMAT:
            raise UserError(f"{self.path}: a job directory of format {found}, newer than this cryptotrain reads "
                            f"(format {FORMAT}); upgrade cryptotrain to use it")
        raise UserError(f"{self.path}: a job directory of format {found}, written by an earlier cryptotrain; this one "
                        f"reads format {FORMAT} only: train the job again (`cryptotrain run` of its config does)")

    def verify(self) -> str | None:
        """The manifest's sha256 if every file it lists is present and intact, else None."""
        try:
            files = json.loads((self.path / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        for name, digest in files.items():
            path = self.path / name
            if not path.is_file() or sha256_file(path) != digest:
                return None
        return sha256_file(self.path / MANIFEST)

    def published(self) -> list[str]:
        """Every file the manifest lists (checked by verify), and the manifest: what a push uploads as it is."""
        return [*json.loads((self.path / MANIFEST).read_text())["files"], MANIFEST]

    # ------------------------------------------------------------------------- writing
    @staticmethod
    def files(preprocessing: Preprocessing, metrics: JobMetrics, config: dict, history: pd.DataFrame,
              predictions: dict[str, np.ndarray], har: Har | None, harx: Har | None = None,
              serving: Serving | None = None) -> dict[str, bytes]:
        """Every file of a job's directory but its model and its manifest, by name, as the bytes `write` puts
        there (made where the job is evaluated: run.host). `predictions`: target_times, each head's forecasts on the
        test split in prices, and the actual and persistence close (actual_close, persistence_close) where a head
        forecasts the close."""
        files = {name: json_bytes(fitted.to_dict()) for name, fitted in ((HAR, har), (HARX, harx)) if fitted}
        if serving is not None:
            files[SERVING] = json_bytes(serving.model_dump(mode="json"))
        npz = io.BytesIO()
        np.savez(npz, **predictions)
        return files | {PREPROCESSING: json_bytes(preprocessing.to_dict()),
                        METRICS: json_bytes(metrics.model_dump(mode="json")),
                        CONFIG: yaml.safe_dump(config, sort_keys=False).encode(),
                        HISTORY: history.to_csv(index=False).encode(),
                        PREDICTIONS: npz.getvalue()}

    def write(self, model: keras.Model, files: dict[str, bytes]) -> None:
        """The model and `files` (JobDir.files) into this directory, a staging one (artifacts.stage_job); the
        manifest is written last (write_manifest)."""
        model.save(self.path / MODEL)
        for name, content in files.items():
            (self.path / name).write_bytes(content)

    def write_manifest(self) -> str:
        """The sha256 of every other file, and the format: written last, when every other file is there. Returns
        the manifest's own sha256 (what verify gives while the files are intact)."""
        files = {p.name: sha256_file(p) for p in sorted(self.path.iterdir()) if p.name != MANIFEST}
        (self.path / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
        return sha256_file(self.path / MANIFEST)

    # ------------------------------------------------------------------------- reading
    def metrics(self) -> JobMetrics:
        return self._read(METRICS, _json, JobMetrics.model_validate)

    def preprocessing(self) -> Preprocessing:
        return self._read(PREPROCESSING, _json, _preprocessing)

    def har_tod(self) -> Har | None:
        """The job's HAR + time of day; None for a job without a head that forecasts high, low and close."""
        return self._read(HAR, _json, Har.from_dict) if (self.path / HAR).is_file() else None

    def serving(self) -> Serving | None:
        """What the job serves of the size of the coming candles (evaluation.serving); None without a candle head."""
        return self._read(SERVING, _json, Serving.model_validate) if (self.path / SERVING).is_file() else None

    def harx(self) -> Har | None:
        """The job's HAR-X; None for a job without it (no candle head, or features without its inputs)."""
        return self._read(HARX, _json, Har.from_dict) if (self.path / HARX).is_file() else None

    def model(self) -> keras.Model:
        """model.keras, loaded for inference; UserError where it holds Python code (Keras's safe mode)."""
        return self._read(MODEL, _load_model)

    def history(self) -> pd.DataFrame:
        return self._read(HISTORY, pd.read_csv)

    def config(self) -> JobConfig:
        def parse(saved: dict) -> JobConfig:
            features = FeaturesConfig.model_validate(saved["features"])
            train = TrainConfig.model_validate(saved["train"])
            try:
                return JobConfig(saved, features, train, validate_config(saved, self.path / CONFIG))
            except ConfigError as exc:
                return JobConfig(saved, features, train, None, str(exc))
        return self._read(CONFIG, _yaml, parse)

    def test_closes(self, head: str, columns: list[str]) -> CloseSeries:
        """`head`'s close (one of `columns`, its columns) on the test split at the first forecast step, from
        predictions.npz; charts.NoChart where the file does not hold it."""
        if "close" not in columns:
            raise charts.NoChart(f"head {head} predicts no close")

        def load(path: Path) -> CloseSeries:
            with np.load(path) as saved:
                if head not in saved or "target_times" not in saved:
                    raise charts.NoChart(f"{PREDICTIONS} holds no {head} predictions")
                if "actual_close" not in saved or "persistence_close" not in saved:
                    raise charts.NoChart(f"{PREDICTIONS} holds no actual close (runs of an earlier cryptotrain did "
                                         "not keep it)")
                times = saved["target_times"].astype("datetime64[ns]")
                forecasts = saved[head]
                first_step = forecasts[:, 0, :] if forecasts.ndim == 3 else forecasts.reshape(len(times), -1)
                return CloseSeries(times, first_step[:, columns.index("close")].astype(float),
                                  saved["actual_close"].reshape(len(times), -1)[:, 0].astype(float),
                                  saved["persistence_close"].reshape(len(times)).astype(float))
        return self._read(PREDICTIONS, load)

    def interval_margins(self) -> dict[np.datetime64, np.ndarray]:
        """The margin (per step, in units of its volatility) the 80 % interval of the close had at each test sample,
        by the time of its first target, from predictions.npz: adaptive conformal's moves along the test split.
        Empty where the file (of an earlier cryptotrain) holds no margins."""
        def load(path: Path) -> dict[np.datetime64, np.ndarray]:
            with np.load(path) as saved:
                if "interval_margin" not in saved:
                    return {}
                return dict(zip(saved["target_times"].astype("datetime64[ns]"), saved["interval_margin"]))
        return self._read(PREDICTIONS, load)

    def _read(self, name: str, load: Callable[[Path], object], parse: Callable[[object], T] | None = None) -> T:
        """The file `name`: `load`ed, then `parse`d. JobFileError when it is missing or cannot be read as what it
        should be; charts.NoChart and UserError (another format; load's own line) pass as they are."""
        self.check_format()
        path = self.path / name
        if not path.is_file():
            raise MissingJobFile(path)
        try:
            value = load(path)
            return parse(value) if parse is not None else value
        except (UserError, charts.NoChart):
            raise
        except Exception as exc:  # json, yaml, zip, pydantic, a missing key: whatever the garbage trips
            if isinstance(exc, ValidationError):  # its first problem, not "14 validation errors for JobMetrics"
                first = exc.errors()[0]
                reason = f"{'.'.join(map(str, first['loc'])) or 'the file'}: {first['msg']}"
            else:
                reason = cause(exc)
            raise JobFileError(path, f"{type(exc).__name__}: {reason}") from None


def _json(path: Path) -> object:
    return json.loads(path.read_text())


def _yaml(path: Path) -> dict:
    saved = yaml.safe_load(path.read_text())
    if not isinstance(saved, dict):
        raise ValueError("not a mapping")
    return saved


def _preprocessing(values: dict) -> Preprocessing:
    if not (isinstance(values, dict) and values.get("symbol") and values.get("timeframe")):
        raise ValueError("no symbol and timeframe")
    return Preprocessing.from_dict(values)


def _load_model(path: Path) -> keras.Model:
    import keras  # here: the report reads job directories without Keras or TensorFlow

    if not zipfile.is_zipfile(path):  # Keras would call it "File not found"
        raise ValueError("not a .keras (zip) file")
    with zipfile.ZipFile(path) as archive:
        holders = _code_holders(json.loads(archive.read("config.json")))
    if holders:  # Keras's safe mode would refuse it too, in a paragraph that says nothing of this file
        raise UserError(f"{path}: holds Python code (in {', '.join(holders)}), which loading the model would run, "
                        "so it is refused (Keras's safe mode); a model cryptotrain trains holds none: this one was "
                        "made or changed elsewhere")
    return keras.saving.load_model(path, compile=False)


def _code_holders(config: object, holder: str = "the model") -> list[str]:
    """What in a .keras file's config.json holds Python code (Keras writes a Python function's bytecode as a
    "__lambda__" object), e.g. ["Lambda 'doubled'"]: each object with a name around such code, once."""
    if isinstance(config, list):
        return list(dict.fromkeys(found for item in config for found in _code_holders(item, holder)))
    if not isinstance(config, dict):
        return []
    if config.get("class_name") == "__lambda__":
        return [holder]
    inner = config.get("config")
    if "class_name" in config and isinstance(inner, dict) and "name" in inner:
        holder = f"{config['class_name']} '{inner['name']}'"
    return _code_holders(list(config.values()), holder)
