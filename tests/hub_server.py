"""A Hugging Face Hub-compatible HTTP server on 127.0.0.1 for tests, in memory, in a thread.

It implements what the real huggingface_hub client calls to create a model repo, commit files
(preupload, LFS batch / upload / verify, the ndjson commit), inspect it (repo info, tree,
paths-info) and download from it (resolve), with the same status codes and headers the client
interprets. The repo state is git-like: a list of commits, each a full snapshot of path -> blob.
Failures can be injected per endpoint: `fail("commit", 500)` answers the next call with an error
before doing anything; `drop("commit")` does the work and then closes the connection without an
answer (the case where a retry must not duplicate a commit); `fail_at_random(0.3, seed, 4)` answers
about 30 % of all requests with a 429 or a 500 (none more than 4 times in a row), reproducibly for a seed.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import yaml

GITATTRIBUTES = b"*.keras filter=lfs diff=lfs merge=lfs -text\n*.npz filter=lfs diff=lfs merge=lfs -text\n"
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub stores big files in LFS whatever their content


@dataclass(frozen=True)
class Blob:
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        spec = "version https://git-lfs.github.com/spec/v1"
        return f"{spec}\noid sha256:{self.sha256}\nsize {len(self.content)}\n".encode()

    @property
    def git_oid(self) -> str:
        """git's blob id: of the content for a regular file, of the pointer file for an LFS file."""
        stored = self.pointer if self.lfs else self.content
        return hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid

    def tree_entry(self, path: str) -> dict:
        entry = {"type": "file", "path": path, "size": len(self.content), "oid": self.git_oid}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.content), "pointerSize": len(self.pointer)}
        return entry


@dataclass(frozen=True)
class Commit:
    oid: str
    message: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def at(self, revision: str) -> Commit | None:
        if revision == "main":
            return self.head
        return next((c for c in self.commits if c.oid == revision), None)

    def add_commit(self, message: str, files: dict[str, Blob]) -> Commit:
        parent = self.commits[-1].oid if self.commits else ""
        digest = hashlib.sha1(f"{self.repo_id}\n{len(self.commits)}\n{parent}\n{message}".encode())
        commit = Commit(digest.hexdigest(), message, files)
        self.commits.append(commit)
        return commit


@dataclass
class Failure:
    status: int | None  # None: process the request, then drop the connection without an answer
    headers: dict[str, str]
    body: str  # "{auth}" is replaced by the request's Authorization header (a server that echoes it)


class HttpError(Exception):
    def __init__(self, status: int, message: str, error_code: str | None = None, **extra: str):
        super().__init__(message)
        self.status, self.message, self.error_code, self.extra = status, message, error_code, extra


REPO = r"(?P<repo>[^/]+/[^/]+)"
REV = r"(?P<rev>[^/]+)"
ROUTES: list[tuple[str, re.Pattern, str]] = [
    (method, re.compile(pattern), name)
    for method, pattern, name in [
        ("POST", r"/api/repos/create", "create"),
        ("GET", r"/api/whoami-v2", "whoami"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("POST", rf"/api/models/{REPO}/preupload/{REV}", "preupload"),
        ("POST", rf"/api/models/{REPO}/commit/{REV}", "commit"),
        ("POST", rf"/api/models/{REPO}/paths-info/{REV}", "paths_info"),
        ("GET", rf"/api/models/{REPO}/revision/{REV}", "repo_info"),
        ("GET", rf"/api/models/{REPO}", "repo_info"),
        ("GET", rf"/api/models/{REPO}/tree/{REV}(?:/(?P<path>.+))?", "tree"),
        ("POST", rf"/{REPO}\.git/info/lfs/objects/batch", "lfs_batch"),
        ("PUT", r"/_lfs/upload/(?P<oid>[0-9a-f]{64})", "lfs_upload"),
        ("POST", r"/_lfs/verify", "lfs_verify"),
        ("GET", rf"/{REPO}/resolve/{REV}/(?P<path>.+)", "resolve"),
        ("HEAD", rf"/{REPO}/resolve/{REV}/(?P<path>.+)", "resolve"),
    ]
]
PUBLIC_ENDPOINTS = {"lfs_upload", "lfs_verify", "validate_yaml"}  # upload hrefs are pre-signed on the Hub
READ_ENDPOINTS = {"repo_info", "tree", "resolve"}


def record_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits a push asks for (its retries and the Hub client's own backoff), recorded instead of slept.
    The standard library's own polling (subprocess waiting for git) still sleeps, unrecorded."""
    waits, real_sleep = [], time.sleep

    def sleep(seconds: float) -> None:
        if sys._getframe(1).f_code.co_filename == subprocess.__file__:
            real_sleep(seconds)
        else:
            waits.append(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return waits


@contextmanager
def serve_hub(monkeypatch: pytest.MonkeyPatch, token: str, cache_dir: Path) -> Iterator[HubServer]:
    """A running HubServer, with HF_ENDPOINT and HF_TOKEN pointing the client at it.

    huggingface_hub reads its settings when first imported, which may have happened in another test
    (under conftest's HF_HUB_OFFLINE=1), so the settings that matter are patched on its constants.
    """
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # this server speaks classic LFS only
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_dir))
    # The client fetches a registry of AI agents from huggingface.co once a day, for its progress bars: a fresh
    # copy, so that no test waits on a host it cannot reach.
    registry = cache_dir / "agent-harnesses.json"
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_text(json.dumps({"standardEnvVars": [], "harnesses": {}}))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(registry))
    monkeypatch.setenv("HF_TOKEN", token)
    with HubServer(token) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


class HubServer:
    """Start with `with HubServer(token) as hub:`; the client's endpoint is `hub.url`."""

    def __init__(self, token: str, user: str = "tester"):
        self.token, self.user = token, user
        self.repos: dict[str, Repo] = {}
        self.lfs_store: dict[str, bytes] = {}
        self.calls: Counter[str] = Counter()
        self.failed_at_random: Counter[str] = Counter()
        self._failures: dict[str, deque[Failure]] = {}
        self._random: tuple[float, int, int] | None = None  # (rate, seed, most in a row) of fail_at_random
        self._sent: Counter[str] = Counter()  # how often each distinct request came, for fail_at_random
        self._failed_in_a_row: Counter[str] = Counter()  # and how often it has just failed
        self.retry_afters_sent: set[float] = set()  # the Retry-After values fail_at_random answered with
        self._lock = threading.RLock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: up to 0.5 s at the end of every test, by default
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._http.shutdown()
        self._http.server_close()

    # ------------------------------------------------------------------ test controls
    def fail(self, endpoint: str, status: int, times: int = 1, retry_after: str | None = "0",
             body: str = "injected failure") -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self._queue(endpoint, [Failure(status, headers, body) for _ in range(times)])

    def drop(self, endpoint: str, times: int = 1) -> None:
        self._queue(endpoint, [Failure(None, {}, "") for _ in range(times)])

    def fail_at_random(self, rate: float, seed: int, most_in_a_row: int) -> None:
        """From now on, answer `rate` of all requests, before doing anything, with a 429 (Retry-After 0 or 1) or a
        500, but never one request more than `most_in_a_row` times in a row (transient failures: what a client's
        retries are for). Drawn per request from `seed`, the request (method, path, body) and how often that same
        request came before: the same for a seed whatever order the client's threads send requests in."""
        self._random = (rate, seed, most_in_a_row)

    def _random_failure(self, name: str, method: str, path: str, body: bytes) -> Failure | None:
        if self._random is None:
            return None
        rate, seed, most_in_a_row = self._random
        request = f"{method} {path} {hashlib.sha256(body).hexdigest()}"
        self._sent[request] += 1
        draw = random.Random(f"{seed} {request} {self._sent[request]}")
        if draw.random() >= rate or self._failed_in_a_row[request] == most_in_a_row:
            self._failed_in_a_row[request] = 0
            return None
        self._failed_in_a_row[request] += 1
        self.failed_at_random[name] += 1
        status, retry_after = draw.choice([(429, "0"), (429, "1"), (500, None)])
        if retry_after:
            self.retry_afters_sent.add(float(retry_after))
        return Failure(status, {"Retry-After": retry_after} if retry_after else {}, "injected failure")

    def _queue(self, endpoint: str, failures: list[Failure]) -> None:
        assert endpoint in {name for _, _, name in ROUTES}, endpoint
        with self._lock:
            self._failures.setdefault(endpoint, deque()).extend(failures)

    def recover(self) -> None:
        """The failures injected and not yet answered dropped: the Hub works again."""
        with self._lock:
            self._failures.clear()

    def pending_failures(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._failures.values())

    def commits(self, repo_id: str) -> list[Commit]:
        """Commits after the one that created the repo."""
        return self.repos[repo_id].commits[1:]

    def files(self, repo_id: str) -> dict[str, bytes]:
        return {path: blob.content for path, blob in self.repos[repo_id].head.files.items()}

    def edit(self, repo_id: str, path: str, content: bytes) -> None:
        """A commit made by someone else (e.g. a card edited in the Hub's web editor)."""
        with self._lock:
            repo = self.repos[repo_id]
            repo.add_commit(f"Update {path}", {**repo.head.files, path: Blob(content, lfs=False)})

    # ------------------------------------------------------------------ endpoints
    def handle(self, name: str, match: re.Match, request: _Request) -> tuple[int, dict[str, str], bytes]:
        params = match.groupdict()
        repo_id = params.get("repo")
        if name == "create":
            return self._create(request)
        if name == "whoami":
            return _json({"type": "user", "name": self.user})
        if name == "validate_yaml":
            return self._validate_yaml(request.json())
        if name in ("lfs_upload", "lfs_verify"):
            return self._lfs_upload(params["oid"], request.body) if name == "lfs_upload" else \
                self._lfs_verify(request.json())
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not request.authorized):
            raise HttpError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        if name == "lfs_batch":
            return self._lfs_batch(request.json())
        commit = repo.at(unquote(params.get("rev") or "main"))
        if commit is None:
            raise HttpError(404, f"Invalid rev id: {params['rev']}", "RevisionNotFound")
        if name == "preupload":
            return self._preupload(commit, request.json())
        if name == "commit":
            return self._commit(repo, request.ndjson())
        if name == "paths_info":
            paths = parse_qs(request.body.decode()).get("paths", [])
            return _json([commit.files[p].tree_entry(p) for p in paths if p in commit.files])
        if name == "repo_info":
            return _json({"id": repo.repo_id, "sha": commit.oid, "private": repo.private,
                          "siblings": [{"rfilename": p} for p in sorted(commit.files)]})
        if name == "tree":
            prefix = unquote(params["path"]) + "/" if params["path"] else ""
            return _json([blob.tree_entry(p) for p, blob in sorted(commit.files.items()) if p.startswith(prefix)])
        return self._resolve(commit, unquote(params["path"]), request.method)

    def _create(self, request: _Request) -> tuple[int, dict[str, str], bytes]:
        body = request.json()
        repo_id = f"{body.get('organization') or self.user}/{body['name']}"
        with self._lock:
            if repo_id in self.repos:
                raise HttpError(409, "You already created this model repo", url=f"{self.url}/{repo_id}")
            repo = self.repos[repo_id] = Repo(repo_id, private=body.get("visibility") == "private")
            repo.add_commit("initial commit", {".gitattributes": Blob(GITATTRIBUTES, lfs=False)})
        return _json({"url": f"{self.url}/{repo_id}", "name": repo_id})

    @staticmethod
    def _validate_yaml(body: dict) -> tuple[int, dict[str, str], bytes]:
        content = body["content"]
        match = re.match(r"---\n(.*?)\n---\n", content, re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as exc:
            return _json({"errors": [{"message": str(exc)}]}, status=400)
        if not isinstance(metadata, dict):
            return _json({"errors": [{"message": "metadata must be a mapping"}]}, status=400)
        return _json({"errors": [], "warnings": []})

    @staticmethod
    def _preupload(commit: Commit, body: dict) -> tuple[int, dict[str, str], bytes]:
        files = []
        for item in body["files"]:
            binary = b"\0" in base64.b64decode(item["sample"])
            entry = {"path": item["path"], "uploadMode": "lfs" if binary or item["size"] >= LFS_MIN_SIZE else "regular",
                     "shouldIgnore": False}
            if item["path"] in commit.files:
                entry["oid"] = commit.files[item["path"]].etag
            files.append(entry)
        return _json({"files": files, "commitOid": commit.oid})

    def _lfs_batch(self, body: dict) -> tuple[int, dict[str, str], bytes]:
        objects = []
        for obj in body["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs_store:
                entry["actions"] = {"upload": {"href": f"{self.url}/_lfs/upload/{obj['oid']}"},
                                    "verify": {"href": f"{self.url}/_lfs/verify"}}
            objects.append(entry)
        return _json({"transfer": "basic", "objects": objects})

    def _lfs_upload(self, oid: str, content: bytes) -> tuple[int, dict[str, str], bytes]:
        if hashlib.sha256(content).hexdigest() != oid:
            raise HttpError(400, f"content does not match oid {oid}")
        with self._lock:
            self.lfs_store[oid] = content
        return 200, {}, b""

    def _lfs_verify(self, body: dict) -> tuple[int, dict[str, str], bytes]:
        content = self.lfs_store.get(body["oid"])
        if content is None or len(content) != body["size"]:
            raise HttpError(404, f"object {body['oid']} was not uploaded")
        return _json({"success": True})

    def _commit(self, repo: Repo, lines: list[dict]) -> tuple[int, dict[str, str], bytes]:
        header = lines[0]["value"]
        with self._lock:
            if header.get("parentCommit") not in (None, repo.head.oid):
                raise HttpError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(repo.head.files)
            for line in lines[1:]:
                value = line["value"]
                if line["key"] == "file":
                    files[value["path"]] = Blob(base64.b64decode(value["content"]), lfs=False)
                elif line["key"] == "lfsFile":
                    if value["oid"] not in self.lfs_store:
                        raise HttpError(400, f"LFS object {value['oid']} of {value['path']} was not uploaded")
                    files[value["path"]] = Blob(self.lfs_store[value["oid"]], lfs=True)
                elif line["key"] == "deletedFile":
                    files.pop(value["path"], None)
                else:
                    raise HttpError(400, f"unsupported commit operation {line['key']}")
            commit = repo.add_commit(header["summary"], files)
        return _json({"success": True, "commitOid": commit.oid,
                      "commitUrl": f"{self.url}/{repo.repo_id}/commit/{commit.oid}"})

    @staticmethod
    def _resolve(commit: Commit, path: str, method: str) -> tuple[int, dict[str, str], bytes]:
        blob = commit.files.get(path)
        if blob is None:
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.git_oid}"'}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.content))})
        return 200, headers, blob.content


def _json(data: object, status: int = 200) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


@dataclass
class _Request:
    method: str
    body: bytes
    authorization: str
    authorized: bool

    def json(self) -> dict:
        return json.loads(self.body)

    def ndjson(self) -> list[dict]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_HEAD(self) -> None:
            self._dispatch("HEAD")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def log_message(self, *args) -> None:
            pass

        def _dispatch(self, method: str) -> None:
            path = urlsplit(self.path).path
            body = self._read_body()
            route = next(((name, m) for verb, pattern, name in ROUTES
                          if verb == method and (m := pattern.fullmatch(path))), None)
            if route is None:
                return self._send(404, {}, f"no route for {method} {path}".encode())
            name, match = route
            authorization = self.headers.get("authorization", "")
            request = _Request(method, body, authorization, authorization == f"Bearer {hub.token}")
            with hub._lock:
                hub.calls[name] += 1
                queue = hub._failures.get(name)
                failure = queue.popleft() if queue else hub._random_failure(name, method, path, body)
            if failure is not None and failure.status is not None:
                message = failure.body.replace("{auth}", authorization)
                return self._send(failure.status, failure.headers, json.dumps({"error": message}).encode())
            try:
                if authorization and not request.authorized:
                    raise HttpError(401, "Invalid credentials in Authorization header")
                if not request.authorized and name not in PUBLIC_ENDPOINTS | READ_ENDPOINTS:
                    raise HttpError(401, "You must be authenticated to access this endpoint")
                status, headers, payload = hub.handle(name, match, request)
            except HttpError as err:
                headers = {"X-Error-Code": err.error_code} if err.error_code else {}
                headers["X-Error-Message"] = err.message
                status, payload = err.status, json.dumps({"error": err.message, **err.extra}).encode()
            if failure is not None:  # the work is done, the answer is lost
                self.close_connection = True
                return None
            self._send(status, headers, payload)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            for key, value in {"Content-Type": "application/octet-stream", **headers}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
