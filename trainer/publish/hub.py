"""Publish finished jobs to the Hugging Face Hub, and fetch a published job back.

Commit budget. The Hub allows about 128 commits per hour per repo, so a push is ONE create_commit per
target repo holding every file of every job it pushes, plus the cards. `cryptotrain push` of a
40-job run into one repo is one commit; `run --push` calls push_jobs at most once a minute with the
jobs finished since (runner.PUSH_EVERY_S), and once more at the end. When nothing changed, the client's
preupload step finds every file already there and no commit is made at all.

Idempotence. Unchanged files are recognised by the Hub's preupload answer (git blob id for small
files, sha256 for LFS files) and neither uploaded nor committed again. A commit attempt whose answer
was lost and that is retried therefore becomes a no-op instead of a duplicate commit.

Cards edited on the Hub. Each card carries the sha256 of its own text (cards.written_by_cryptotrain):
a remote README.md that differs from what we would push now is downloaded, and kept unless
overwrite_cards when its text no longer matches its digest, i.e. someone edited it. A card pushed
from another run directory or machine is recognised as cryptotrain's and replaced.
The run card's rows are those of every job the ledger records as pushed to the repo.

Transient failures. Every HTTP request the Hub client sends is retried on its own (_RetryingTransport,
installed as the client's HTTP transport): on 429, 5xx and dropped connections, after the server's
Retry-After or with exponential backoff, MAX_ATTEMPTS times in all; a Retry-After longer than
MAX_WAIT_SECONDS (the hourly commit limit) is reported rather than waited out. A failed request never
starts a push over. The commit request too is sent again, on the head it was prepared against
(parent_commit): one whose answer was lost but that landed is then refused (412) instead of landing
twice, and the commit is prepared once more, which finds it there. The token never appears in anything
written or raised: error texts are scrubbed of it.
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import subprocess
import time
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi, get_token
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import disable_progress_bars, set_client_factory
from huggingface_hub.utils._http import hf_request_event_hook
from huggingface_hub.utils.sha import git_hash
from pydantic import ValidationError

from ..config import HubConfig
from ..errors import JobError, UserError
from ..retries import retry_wait
from ..run.artifacts import jobs_dir
from ..run.jobdir import MANIFEST, JobDir
from ..run.jobs import Job, make_jobs
from ..run.rundir import RunDir
from .cards import RunCardRow, job_card, job_row, run_card, written_by_cryptotrain
from .plots import PLOT, job_plot

PUSH_LOCK = ".push.lock"  # in the run directory: one push at a time
CARD = "README.md"
RETRY_STATUSES = (429, 500, 502, 503, 504)
TRANSIENT_ERRORS = (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError)
MAX_ATTEMPTS = 5  # per request
BACKOFF_SECONDS = 2.0  # first wait when the server gives no Retry-After; doubles on each attempt
MAX_WAIT_SECONDS = 300.0  # a longer Retry-After is reported, not waited out
NO_TOKEN = "no Hugging Face token: set HF_TOKEN or run `hf auth login`"

log = logging.getLogger(__name__)  # warnings (a card kept, a retry); the command line shows them on stderr


@dataclass(frozen=True)
class Target:
    """Where one finished job goes on the Hub."""
    job: str
    job_dir: Path
    repo_id: str
    path: str  # folder inside the repo, "" for the repo root


# ----------------------------------------------------------------------------- push
def push_run(run: RunDir, repo_id: str | None, private: bool | None, overwrite_cards: bool,
             only: tuple[str, ...]) -> dict[str, dict]:
    """`cryptotrain push`: every finished job of the run (matching `only`), one commit per repo.
    `repo_id` and `private` default to the run config's hub settings. Returns push_jobs's
    {job: {"repo_id", "path", "commit", "url"}}."""
    hub = _hub_config(run.config.hub, repo_id, private, run.path)
    finished = [job.name for job in make_jobs(run.config, only) if (jobs_dir(run.path) / job.name).is_dir()]
    if not finished:
        raise UserError(f"{run.path}: no finished job to push{' matching ' + ' '.join(only) if only else ''}")
    return push_jobs(run, finished, hub, overwrite_cards)


def push_pending(run: RunDir, names: list[str], note: Callable[..., None]) -> int:
    """`run --push` (runner.Push): the done jobs among `names` whose artifacts are not yet on the Hub, in the repo
    the config now names, pushed. A failed push is said through `note` (a line, a style), never raised: it never
    ends the training run. Returns how many of them are still not on the Hub."""
    if unpushed := _unpushed(run, names):
        disable_progress_bars()  # tqdm bars would tear through the rich progress display
        try:
            push_jobs(run, unpushed, run.config.hub)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, (UserError, JobError)) else f"{type(exc).__name__}: {scrub(str(exc))}"
            note(f"push failed for {', '.join(unpushed)}: {reason} (retry with: cryptotrain push {run.path})",
                 style="red")
    return len(_unpushed(run, names))


def _unpushed(run: RunDir, names: list[str]) -> list[str]:
    """Done jobs whose artifacts are not yet on the Hub, in the repo the config now names."""
    return [r.name for r in run.ledger.jobs() if r.name in names and r.status == "done"
            and not (r.pushed_commit and r.pushed_repo == repo_of(run.config.hub, r.name))]


def push_jobs(run: RunDir, job_names: list[str], hub: HubConfig, overwrite_cards: bool = False) -> dict:
    """Push these finished jobs and their cards: one commit per target repo. Records each job's commit
    in the run's ledger; returns {job: {"repo_id", "path", "commit", "url"}}."""
    run_dir = run.path
    if hub.repo_id is None:
        raise UserError(f"{run_dir}: no Hub repo to push to: set hub.repo_id in the config or pass --repo-id")
    token = get_token()
    if not token:
        raise UserError(NO_TOKEN)
    targets = [_target(run_dir, name, hub) for name in job_names]
    _check_distinct(targets)
    api = _api(token)
    pushed = {}
    with _push_lock(run_dir):
        for repo_id in dict.fromkeys(t.repo_id for t in targets):
            repo_targets = [t for t in targets if t.repo_id == repo_id]
            with _hub_errors(repo_id, token, "push to"):
                commit = _push_repo(api, repo_id, repo_targets, run.config.name, hub, overwrite_cards,
                                    _pushed_rows(run, repo_id, hub))
            for t in repo_targets:
                url = f"{api.endpoint}/{repo_id}/tree/{commit.oid}/{t.path}".rstrip("/")
                run.ledger.record_push(t.job, repo_id, commit.oid, url)
                pushed[t.job] = {"repo_id": repo_id, "path": t.path, "commit": commit.oid, "url": url}
    return pushed


def _pushed_rows(run: RunDir, repo_id: str, hub: HubConfig) -> dict[str, RunCardRow]:
    """The run card's rows of the jobs the ledger says are in the repo already (pushed, and unchanged since)."""
    rows = {}
    for record in run.ledger.jobs():
        if record.pushed_repo == repo_id and record.pushed_commit:
            job_dir = jobs_dir(run.path) / record.name
            if JobDir(job_dir).is_job():
                rows[record.name] = job_row(job_dir, _fill(hub.path_template, record.name).strip("/"))
    return rows


def _push_repo(api: HfApi, repo_id: str, targets: list[Target], run_name: str, hub: HubConfig,
               overwrite_cards: bool, rows: dict[str, RunCardRow]) -> CommitInfo:
    """One commit with every target's artifacts and cards (unchanged files are skipped by the client). `rows`:
    the run card's rows of the jobs already in the repo."""
    api.create_repo(repo_id, private=hub.private, exist_ok=True)
    files: dict[str, Path | bytes] = {}
    cards: dict[str, bytes] = {}
    install = install_line(hub)
    for t in targets:
        job = JobDir(t.job_dir)
        for name in job.published():
            files[_join(t.path, name)] = t.job_dir / name
        files[_join(t.path, PLOT)] = job_plot(job)  # drawn here from the job's files: only the Hub shows it
        for name, content in _keras_folder(job.model_file).items():
            files[_join(t.path, name)] = content
        cards[_join(t.path, CARD)] = job_card(t.job_dir, repo_id, t.path, hub.license, install).encode()
        rows[t.job] = job_row(t.job_dir, t.path)
    if all(t.path for t in targets):  # jobs in sub-folders: the repo root gets the run's card
        cards[CARD] = run_card(run_name, repo_id, list(rows.values()), hub.license).encode()
    if not overwrite_cards:
        for path in _cards_edited_on_hub(api, repo_id, cards):
            log.warning("%s: %s was edited on the Hub; kept (--overwrite-cards replaces it)", repo_id, path)
            del cards[path]
    files.update(cards)
    jobs = ", ".join(t.job for t in targets[:5]) + (f" and {len(targets) - 5} more" if len(targets) > 5 else "")
    return _commit(api, repo_id, files, f"cryptotrain run {run_name}: {jobs}")


def _commit(api: HfApi, repo_id: str, files: dict[str, Path | bytes], message: str) -> CommitInfo:
    """One commit of `files` on the head it is prepared against. A commit request retried after its answer was
    lost is refused (412) if the first one landed, as it is if someone else committed meanwhile: the head moved,
    so the commit is prepared once more on the new head, where the client finds what is already there."""
    try:
        return _commit_on_head(api, repo_id, files, message)
    except HfHubHTTPError as err:
        if err.response is None or err.response.status_code != 412:
            raise
        log.warning("Hub: %s changed during the commit; preparing it again on its new head", repo_id)
        return _commit_on_head(api, repo_id, files, message)


def _commit_on_head(api: HfApi, repo_id: str, files: dict[str, Path | bytes], message: str) -> CommitInfo:
    """The commit, prepared on the head as it is now. An upload the client gave up on - its own retries spent on an
    LFS upload, its upload threads raise RuntimeError("Error while uploading 'PATH' to the Hub.") from what failed
    - is one line naming the file and what to do; nothing is committed then, and what was uploaded stays on the Hub
    for the next try."""
    head = api.repo_info(repo_id).sha
    # Fresh operations each time: the client mutates them, and re-checks what is already there.
    try:
        return api.create_commit(repo_id, [CommitOperationAdd(path, source) for path, source in files.items()],
                                 commit_message=message, parent_commit=head)
    except RuntimeError as err:
        path = re.search(r"uploading '([^']+)'", str(err))
        what = f"could not upload {path.group(1)}" if path else f"could not push ({_one_line(err, None)})"
        raise JobError(f"{repo_id}: {what} to the Hub ({_one_line(err.__cause__ or err, None)}); nothing was "
                       "committed: run the same push again") from None


def _cards_edited_on_hub(api: HfApi, repo_id: str, cards: dict[str, bytes]) -> list[str]:
    """Cards on the Hub that differ from what we would push now and were not written by cryptotrain as
    they stand (see cards.written_by_cryptotrain)."""
    infos = api.get_paths_info(repo_id, list(cards))
    differing = [info.path for info in infos
                 if isinstance(info, RepoFile) and info.blob_id != git_hash(cards[info.path])]
    return [path for path in differing
            if not written_by_cryptotrain(_read_remote_text(api, repo_id, path))]


def _read_remote_text(api: HfApi, repo_id: str, path: str) -> str:
    local = api.hf_hub_download(repo_id, path)
    return Path(local).read_text(errors="replace")


def _target(run_dir: Path, job_name: str, hub: HubConfig) -> Target:
    job_dir = jobs_dir(run_dir) / job_name
    if not job_dir.is_dir():
        raise UserError(f"{job_name}: not a finished job of {run_dir} (no {job_dir})")
    if JobDir(job_dir).verify() is None:
        raise JobError(f"{job_name}: {job_dir} does not match its {MANIFEST}; run the job again before "
                       "pushing it")
    return Target(job_name, job_dir, repo_of(hub, job_name), _fill(hub.path_template, job_name).strip("/"))


def repo_of(hub: HubConfig, job_name: str) -> str:
    """The repo a job is pushed to (hub.repo_id may hold {symbol} and {timeframe})."""
    return _fill(hub.repo_id, job_name)


def _fill(template: str, job_name: str) -> str:
    """A template of the hub config (its placeholders checked when it was made) for one job."""
    job = Job.from_name(job_name)
    return template.format(symbol=job.symbol, timeframe=job.timeframe)


def _check_distinct(targets: list[Target]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for t in targets:
        other = seen.setdefault((t.repo_id, t.path), t.job)
        if other != t.job:
            raise UserError(f"hub.path_template: jobs {other} and {t.job} would both be written to "
                            f"{t.repo_id}/{t.path or '(root)'}; include {{symbol}} and {{timeframe}} in "
                            "hub.path_template or hub.repo_id")


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


# ----------------------------------------------------------------------------- download
def download_job(uri: str) -> Path:
    """"hf://NS/NAME/SYMBOL/TIMEFRAME" (any folder of the repo) -> local directory of the job's files,
    from the Hugging Face cache when already downloaded."""
    repo_id, path = _parse_uri(uri)
    token = get_token()
    api = _api(token)
    with _hub_errors(repo_id, token, "download from"):
        local = api.snapshot_download(repo_id, allow_patterns=[f"{path}/*"] if path else None)
    job_dir = Path(local) / path
    if not JobDir(job_dir).has_manifest():
        raise UserError(f"{uri}: no job there (no {MANIFEST} in {repo_id}/{path or '(root)'}); expected "
                        "hf://NS/NAME/SYMBOL/TIMEFRAME")
    if JobDir(job_dir).verify() is None:
        raise JobError(f"{uri}: the downloaded files do not match their {MANIFEST}")
    return job_dir


def _parse_uri(uri: str) -> tuple[str, str]:
    parts = uri.removeprefix("hf://").strip("/").split("/") if uri.startswith("hf://") else []
    if len(parts) < 2 or not all(parts):
        raise UserError(f"{uri}: not a Hub model reference; expected hf://NS/NAME/SYMBOL/TIMEFRAME")
    return "/".join(parts[:2]), "/".join(parts[2:])


# ----------------------------------------------------------------------------- Hub plumbing
def _api(token: str | None) -> HfApi:
    _retry_every_request()
    # HF_ENDPOINT is read now: huggingface_hub reads it once, when it is first imported.
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT"), token=token)


@functools.cache
def _retry_every_request() -> None:
    """The Hub client's HTTP client (one per process, shared by every call) as the client makes it
    (huggingface_hub's default_client_factory), sending each request through _RetryingTransport."""
    set_client_factory(lambda: httpx2.Client(transport=_RetryingTransport(), follow_redirects=True, timeout=None,
                                             event_hooks={"request": [hf_request_event_hook]}))


class _RetryingTransport(httpx2.BaseTransport):
    """Sends each request, and again on a transient failure (429, 5xx, a dropped connection) after the server's
    Retry-After or with backoff: MAX_ATTEMPTS times in all, and the last answer or error is the caller's. A
    Retry-After over MAX_WAIT_SECONDS is answered at once. A body that cannot be sent twice (a file streamed
    from disk: the client retries those uploads itself, rewinding the file) is sent once. The requests the
    client retries itself (preupload, LFS) get its retries as well, once these are spent."""

    def __init__(self) -> None:
        self._http = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        attempts = MAX_ATTEMPTS if isinstance(request.stream, httpx2.ByteStream) else 1
        for attempt in range(1, attempts):
            try:
                response = self._http.handle_request(request)
            except TRANSIENT_ERRORS as err:
                failure = f"{type(err).__name__} for {request.url.path}"
                wait = retry_wait(None, attempt, BACKOFF_SECONDS)
            else:
                if response.status_code not in RETRY_STATUSES:
                    return response
                wait = retry_wait(response.headers.get("Retry-After"), attempt, BACKOFF_SECONDS)
                if wait > MAX_WAIT_SECONDS:  # e.g. the hourly commit limit: waiting here would hold up the run
                    return response
                response.read()  # and closed: its connection goes back to the pool
                failure = f"HTTP {response.status_code} from {request.url.path}"
            log.warning("Hub: %s; retrying in %.0f s (%d/%d)", failure, wait, attempt, MAX_ATTEMPTS - 1)
            time.sleep(wait)
        return self._http.handle_request(request)

    def close(self) -> None:
        self._http.close()


@contextmanager
def _hub_errors(repo_id: str, token: str | None, action: str) -> Iterator[None]:
    """Hub failures as one-line UserError (bad token, no access) or JobError (the Hub failed)."""
    try:
        yield
    except OfflineModeIsEnabled:
        raise UserError(f"{repo_id}: HF_HUB_OFFLINE is set; unset it to {action} the Hub") from None
    except RepositoryNotFoundError:
        raise UserError(f"{repo_id}: no such repo on the Hub, or the token may not access it") from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status == 401:
            raise UserError(f"{repo_id}: the Hub rejected the token (401): set a valid HF_TOKEN or run "
                            "`hf auth login`") from None
        if status == 403:
            raise UserError(f"{repo_id}: the token may not write there (403): use a token with write "
                            "access") from None
        raise JobError(f"{repo_id}: could not {action} the Hub: {_one_line(err, token)}") from None
    except (httpx2.TransportError, LocalEntryNotFoundError) as err:
        raise JobError(f"{repo_id}: could not {action} the Hub: {_one_line(err, token)}") from None
    except ValueError as err:  # the client's answer to a card the Hub refused ("Invalid metadata in README.md")
        text = "; ".join(line.strip("- ") for line in str(err).splitlines() if line.strip())
        raise JobError(f"{repo_id}: the Hub refused the push: {scrub(text, token)}") from None


def _one_line(err: BaseException, token: str | None) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    server = getattr(err, "server_message", None)
    if server:
        text += f" ({' '.join(server.split())})"
    return scrub(text, token)


def scrub(text: str, token: str | None = None) -> str:
    """`text` without the Hub token (the given one, else the one configured)."""
    token = token or get_token()
    return text.replace(token, "***") if token else text


# ----------------------------------------------------------------------------- run directory
def _hub_config(hub: HubConfig, repo_id: str | None, private: bool | None, run_dir: Path) -> HubConfig:
    """The run's hub settings with the command line's repo and visibility, validated like the config."""
    repo_id = repo_id or hub.repo_id
    private = hub.private if private is None else private
    if repo_id is None:
        raise UserError(f"{run_dir}: no Hub repo to push to: pass --repo-id NS/NAME or set hub.repo_id")
    try:
        return HubConfig(repo_id=repo_id, private=private, path_template=hub.path_template)
    except ValidationError as exc:
        raise UserError(f"--repo-id {repo_id}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


@contextmanager
def _push_lock(run_dir: Path) -> Iterator[None]:
    """Processes sharing a run directory push one at a time: each makes the run card from the ledger's record
    of what is pushed, so two at once could each leave out the other's jobs."""
    with open(run_dir / PUSH_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _keras_folder(model_file: Path) -> dict[str, bytes]:
    """model.keras unzipped (config.json, metadata.json, model.weights.h5): a folder Keras loads as it is, so
    that `keras.saving.load_model("hf://NS/NAME")` works on a repo holding one job at its root."""
    with zipfile.ZipFile(model_file) as archive:
        return {name: archive.read(name) for name in archive.namelist() if "/" not in name}


def install_line(hub: HubConfig) -> str:
    """What a model card says to install cryptotrain with: hub.install, else pip from the git repository this
    cryptotrain runs from (until the package is published)."""
    if hub.install:
        return hub.install
    if url := _public_origin():
        return f'pip install "cryptotrain @ git+{url}"'
    return "pip install -e .  # in a clone of the cryptotrain repository"


@functools.cache
def _public_origin() -> str | None:
    """The `origin` remote of the checkout this cryptotrain runs from, as anyone may clone it: an https or ssh
    URL with no credentials in it (a token in `https://user:TOKEN@host/...` never reaches a card); None for
    no remote, or one only this machine can reach (a local path)."""
    source = Path(__file__).resolve().parents[2]
    try:
        url = subprocess.run(["git", "-C", str(source), "remote", "get-url", "origin"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if re.fullmatch(r"[\w.-]+@[\w.-]+:[\w./~-]+", url):  # scp-like: git@github.com:owner/repo.git
        user_host, _, path = url.partition(":")
        url = f"ssh://{user_host}/{path}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http", "ssh") or not parts.hostname:
        return None
    user = "git@" if parts.scheme == "ssh" and parts.username == "git" else ""  # ssh's user is no secret
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, user + host, parts.path, "", ""))
