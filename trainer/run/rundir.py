"""A run directory opened once per command: its ledger, and the config its run saved (config.yaml) read once.

`cryptotrain status`, `report` and `push` open it (RunDir.open) and pass it down; `run` makes one around the ledger
it opens (runner._open_run). Closing it (the end of its `with` block) closes the ledger.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig, load_config
from ..errors import UserError
from .ledger import Ledger, check_writable

CONFIG = "config.yaml"


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
        elif not (path / "ledger.sqlite").is_file():
            raise UserError(f"{path}: not a run directory (no ledger.sqlite); runs live under runs/<config name>")
        else:
            config, problem = _saved_config(path / CONFIG)
        return cls(path, Ledger(path, read_only=not config_required and not _writable(path)), config, problem)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.ledger.close()


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
