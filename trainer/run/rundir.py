"""A run directory, opened once per command: its ledger, and the config its run saved (config.yaml) read once.

`cryptotrain run` makes or reopens one (RunDir.create: a run directory made with another config is refused, naming
what changed, or moved aside with --new-run); `status`, `report` and `push` open one (RunDir.open); each passes it
down. Nothing else in trainer/ opens the ledger. Closing it (the end of its `with` block) closes the ledger.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..config import FREE_KEYS, RunConfig, load_config
from ..errors import UserError
from ..files import atomic_write
from .artifacts import write_config
from .ledger import LEDGER, ROLLBACK_NOTE, STALE_AFTER, Ledger, check_writable

CONFIG = "config.yaml"
TIMING = "timing.json"  # where the last `run` process's time went (DeviceTime)
_MAX_LISTED_CHANGES = 5


@dataclass(frozen=True)
class RunDir:
    path: Path
    ledger: Ledger
    config: RunConfig | None  # as the run saved it; None: config_problem says why
    config_problem: str | None = None

    @classmethod
    def open(cls, path: Path, config_required: bool = False) -> RunDir:
        """status, report: a directory without a ledger is no run directory; a config.yaml missing or unreadable
        is only a config_problem; one this user cannot write (a colleague's, a read-only mount) is read as it
        is. push (`config_required`): a directory without a valid config.yaml is refused before anything is made
        in it (its ledger is made when missing, as a push records itself there)."""
        path = Path(path)
        if config_required:
            if not (path / CONFIG).is_file():
                raise UserError(f"{path}: not a run directory (no {CONFIG})")
            config, problem = load_config(path / CONFIG), None
        elif not (path / LEDGER).is_file():
            raise UserError(f"{path}: not a run directory (no {LEDGER}); runs live under runs/<config name>")
        else:
            config, problem = _saved_config(path / CONFIG)
        return cls(path, Ledger(path, read_only=not config_required and not _writable(path)), config, problem)

    @classmethod
    def create(cls, cfg: RunConfig, new_run: bool = False, note: Callable[[str], None] = lambda line: None,
               stale_after: float = STALE_AFTER) -> RunDir:
        """`run`: the config's run directory, made or reopened, with its config recorded in the ledger and saved as
        config.yaml. One made with another config is refused, naming the keys that changed (FREE_KEYS may change:
        the record follows the latest config), or with `new_run` moved aside - kept, renamed with a timestamp, said
        through `note` - unless another process is training in it. `stale_after`: seconds without a heartbeat after
        which another process takes a running job over (Ledger)."""
        run_dir = cfg.run_dir
        ledger = Ledger(run_dir, stale_after=stale_after)
        try:
            ledger.open_run(cfg.fingerprint(), cfg.fingerprint_data(), _same_run(cfg))
        except UserError:
            busy = ledger.in_use() if new_run else []
            ledger.close()
            if not new_run:
                raise
            if busy:  # moving it would pull the directory from under that process, which would go on writing there
                raise UserError(f"{run_dir}: --new-run cannot move this run directory: another process is training "
                                f"in it ({', '.join(busy)}); stop it first, or give this config another output_dir"
                                ) from None
            kept = run_dir.with_name(f"{run_dir.name}-{datetime.now():%Y%m%d-%H%M%S}")
            run_dir.rename(kept)
            note(f"Config changed: the previous run was moved to {kept}")
            ledger = Ledger(run_dir, stale_after=stale_after)
            ledger.open_run(cfg.fingerprint(), cfg.fingerprint_data(), _same_run(cfg))
        if ledger.journal != "wal":
            note(f"{ledger.path}: {ROLLBACK_NOTE}")
        atomic_write(run_dir / CONFIG, lambda tmp: write_config(tmp, cfg.model_dump(mode="json")))
        return cls(run_dir, ledger, cfg)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.ledger.close()


def _same_run(cfg: RunConfig) -> Callable[[str, dict], None]:
    """Ledger.open_run's check of the config a run recorded against `cfg`: UserError naming the keys that changed,
    unless only FREE_KEYS did (or the fingerprint is the same). A fingerprint that differs with only such keys
    changed (one computed by an earlier version, which still counted them) is taken over; options added since
    appear in the recorded config at their defaults, which is what the run was made with."""
    def check(fingerprint: str, recorded: dict) -> None:
        changes = [change for change in _changed_keys(_as_read_now(recorded), cfg.fingerprint_data())
                   if change.split(" ", 1)[0] not in FREE_KEYS]
        if fingerprint != cfg.fingerprint() and changes:
            raise UserError(f"{cfg.run_dir}: made with a different config ({_describe(changes)}); "
                            "run with --new-run to start over")
    return check


def _as_read_now(recorded: dict) -> dict:
    """A run's recorded config as this version reads it. As recorded where this version cannot read it (then it
    differs anyway)."""
    try:
        return RunConfig.model_validate(recorded).fingerprint_data()
    except ValueError:  # pydantic's ValidationError
        return recorded


_UNSET = object()


def _changed_keys(old: object, new: object, path: str = "") -> list[str]:
    """Dotted paths where two JSON-like configs differ, with old -> new for plain values,
    e.g. ['train.epochs 100 -> 2', 'model.layers[0].units 64 -> 32', 'data.symbols']."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [change for key in {**old, **new}
                for change in _changed_keys(old.get(key, _UNSET), new.get(key, _UNSET),
                                           f"{path}.{key}" if path else str(key))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [change for i, (a, b) in enumerate(zip(old, new)) for change in _changed_keys(a, b, f"{path}[{i}]")]
    if old == new:
        return []
    if isinstance(old, (dict, list)) or isinstance(new, (dict, list)):
        return [path]
    return [f"{path} {_short(old)} -> {_short(new)}"]


def _short(value: object, limit: int = 30) -> str:
    text = "unset" if value is _UNSET else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(changes: list[str]) -> str:
    listed = ", ".join(changes[:_MAX_LISTED_CHANGES])
    more = len(changes) - _MAX_LISTED_CHANGES
    return f"changed: {listed}" + (f", +{more} more" if more > 0 else "")


def _writable(path: Path) -> bool:
    try:
        check_writable(path)
    except OSError:
        return False
    return True


def _saved_config(path: Path) -> tuple[RunConfig | None, str | None]:
    """The saved config, or why there is none to use (a run may be looked at whatever became of the file)."""
    if not path.is_file():
        return None, f"{CONFIG} is missing from the run directory"
    try:
        return load_config(path), None
    except UserError as exc:  # config.ConfigError: unreadable, not YAML, not a config this version reads
        return None, f"{CONFIG} is unreadable ({exc})"


class DeviceTime(BaseModel):
    """Where a `run` process's time went, from its executor's start to its last job, where it trains the jobs itself
    (not on Ray workers): RUN/timing.json (the last run's), and what `run` prints. What the device did, and what it
    waited for while the host worked, one job after another or on `host_workers` processes (run.host)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    host_workers: int
    seconds: float  # from the executor's start to the last job's end
    training: float  # the device's: building packs, the epochs (their compilation too), the forecasts
    preparing: float  # waiting for jobs' candles -> features -> windows and baselines
    evaluating: float  # waiting for trained jobs' scores and files
    writing: float  # each job's directory written and committed, the ledger told

    @classmethod
    def read(cls, run_dir: Path) -> DeviceTime | None:
        """The run directory's, where a run wrote one it can read (None: none, or not this version's)."""
        try:
            return cls.model_validate_json((run_dir / TIMING).read_text())
        except (OSError, ValueError):
            return None

    def line(self) -> str:
        how = "one job at a time" if self.host_workers == 1 else f"on {self.host_workers} host workers"
        return (f"The device trained {self.training:.1f} s of {self.seconds:.1f} s; it waited {self.preparing:.1f} s "
                f"for jobs to be prepared, {self.evaluating:.1f} s evaluated, {self.writing:.1f} s written ({how})")
