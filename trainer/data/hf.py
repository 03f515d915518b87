"""Candle files from a Hugging Face dataset repo, fetched into huggingface_hub's own cache.

The client takes HF_TOKEN and HF_HOME / HF_HUB_CACHE from the environment. HF_ENDPOINT and
HF_HUB_OFFLINE are read here at each call, because huggingface_hub reads them only once, when first
imported. Offline, or when the Hub cannot be reached, a file already in the cache is used; one that
is not is an error.

The client retries a request that cannot reach the Hub for ~23 s before it gives up. Once it has, the
rest of the process uses only the cache for that endpoint: with no network, a 40-job run would
otherwise wait that long for every job (twice with a retry) to fail the same way.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..errors import JobError
from .files import job_filename
from .sources import FilePattern, RepoId, Source

_unreachable_endpoints: set[str] = set()  # endpoints this process could not reach


class HfSource(Source):
    """A Hugging Face dataset repo laid out like zongowo111/cpb-models."""
    name: ClassVar[str] = "hf"
    downloads: ClassVar[bool] = True
    repo_id: RepoId = "zongowo111/cpb-models"
    repo_type: Literal["dataset", "model"] = "dataset"
    revision: str = "main"
    pattern: FilePattern = "klines_binance_us/{symbol}/{symbol}_{timeframe}_binance_us.csv"

    def describe(self) -> str:
        return f"Hugging Face {self.repo_type} {self.repo_id}@{self.revision}"

    @property
    def dataset(self) -> str:
        return self.repo_id

    def file(self, symbol: str, timeframe: str, cache: Path) -> tuple[Path, str]:
        return hf_file(self, symbol, timeframe), hf_label(self, symbol, timeframe)


def hf_label(source: HfSource, symbol: str, timeframe: str) -> str:
    return f"hf:{source.repo_id}@{source.revision}/{_filename(source, symbol, timeframe)}"


def hf_file(source: HfSource, symbol: str, timeframe: str) -> Path:
    """Local path of the job's file, downloading it unless the cache already holds that revision."""
    where = hf_label(source, symbol, timeframe)
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    cache_only = _offline() or endpoint in _unreachable_endpoints
    try:
        return Path(hf_hub_download(
            source.repo_id, _filename(source, symbol, timeframe),
            repo_type=source.repo_type, revision=source.revision, endpoint=endpoint, local_files_only=cache_only,
        ))
    except GatedRepoError:
        raise JobError(f"{where}: gated repository: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise JobError(f"{where}: repository not found (a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise JobError(f"{where}: revision not found (data.hf.revision)") from None
    except LocalEntryNotFoundError:
        if _offline():
            reason = "offline (HF_HUB_OFFLINE=1)"
        elif cache_only:
            reason = f"{endpoint} could not be reached earlier in this process"
        else:
            _unreachable_endpoints.add(endpoint)
            reason = f"{endpoint} cannot be reached"
        raise JobError(f"{where}: not in the local Hugging Face cache and {reason}; run the same command "
                       "again with network access (or `cryptotrain data download` first)") from None
    except EntryNotFoundError:
        raise JobError(f"{where}: no such file in the repository (data.hf.pattern)") from None
    except HfHubHTTPError as exc:
        raise JobError(f"{where}: download failed: {str(exc).splitlines()[0]}") from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}  # as huggingface_hub


def _filename(source: HfSource, symbol: str, timeframe: str) -> str:
    return job_filename(source.pattern, symbol, timeframe)
