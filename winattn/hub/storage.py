"""On-disk store of the embedded Hub: content-addressed blobs, immutable commit objects, one refs file per repo.

Layout under the root directory::

    hub-store.json                              {"format": 1}
    blobs/<aa>/<sha256>                         file contents, named by their sha256, written once, never modified
    repos/<type>/<namespace>/<name>/
        meta.json                               {"private": bool, "createdAt": "..."}
        refs.json                               {"branches": {name: commit}, "tags": {name: commit}}
        commits/<commit>.json                   {"parent", "files": {path: {"sha256", "size", "oid"}}, "message", ...}
    locks/<type>/<namespace>/<name>.lock        flock target: writers of one repo take turns (also across processes)
    tmp/<store id>/                             staging area on the same filesystem, so os.replace is atomic; the
                                                owning server holds a flock on it, so a server starting on the same
                                                root removes the staging of dead servers (killed uploads) at once

Confinement: this module is the only one that turns request values into file-system paths, so it validates every
repo type, namespace, name, revision, commit id, blob id and file path itself (`validate_*`, `Store._repo_path`,
`Store.blob_path`, `Repo.commit`, `Repo.resolve`) whatever the caller checked, and checks that the resolved repo
directory lies under `<root>/repos`. A request for a repo that does not exist touches nothing on disk (no lock file,
no directory): writers find the repo first, then lock it.

Consistency: a write stores and fsyncs its blobs and its commit object first, then replaces refs.json with
os.replace. A reader reads refs.json once and follows immutable objects from there, so it sees either the old or the
new head and never half a commit. Commit ids are the sha1 of the commit object's canonical JSON (40 hex digits, like
git's, but not git-compatible). `oid` is the git blob sha1 of the content (what the Hub reports for regular files).
Blobs are never deleted (no garbage collection): deleting a repo removes its refs and commits only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None

STORE_FORMAT = 1
REPO_TYPES = ("model", "dataset", "space", "kernel")
DEFAULT_BRANCH = "main"
# Files at least this large are presented as Git-LFS files (sha256 ETag, `lfs` in tree entries), as the Hub does.
DEFAULT_LFS_THRESHOLD = 10 * 1024 * 1024

# `\Z`, not `$`: `$` also matches before a trailing newline, which would let "main\n" or "<sha>\n" through.
HEX40 = re.compile(r"^[0-9a-fA-F]{40}\Z")
HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?\Z")
_REF_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
# Namespaces that would make URLs ambiguous (`/kernels/x/resolve/...`, `/api/...`).
_RESERVED_NAMESPACES = {"api", "models", "datasets", "spaces", "kernels", "buckets", "organizations", "users"}
_FORBIDDEN_FOLDERS = {".git", ".cache"}
_CHUNK = 1024 * 1024


class HubError(Exception):
    """An HTTP error answer: status, the Hub's X-Error-Code and a message; `extra` goes into the JSON body."""

    def __init__(self, status: int, code: str, message: str, *, headers: dict | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def bad_request(message: str) -> HubError:
    return HubError(400, "BadRequest", message)


def now_iso() -> str:
    """UTC time in the Hub's format, e.g. 2026-08-19T07:19:38.123Z."""
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def git_blob_oid(data: bytes) -> str:
    """Git's blob id: sha1("blob <len>\\0" + data)."""
    h = hashlib.sha1(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _has_control(value: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value)


def validate_repo_type(value) -> str:
    if value not in REPO_TYPES:
        raise bad_request(f"Invalid repo type {value!r}, expected one of {', '.join(REPO_TYPES)}")
    return value


def validate_name(value, what: str) -> str:
    """A namespace or repo name: Hub rules (letters, digits, `._-`, no `--`/`..`, at most 96 characters)."""
    if isinstance(value, str) and _has_control(value):
        raise bad_request(f"Invalid {what} {value!r}: control characters (NUL, CR, LF, ...) are not allowed.")
    if not isinstance(value, str) or not _NAME.match(value) or "--" in value or ".." in value or len(value) > 96:
        raise bad_request(f"Invalid {what} {value!r}: use letters, digits, '-', '_', '.' (no '--' or '..').")
    if what == "namespace" and value.lower() in _RESERVED_NAMESPACES:
        raise bad_request(f"Invalid namespace {value!r}: reserved name.")
    return value


def validate_revision(value) -> str:
    """A revision as a request names it (branch, tag, `refs/heads/X`, `refs/tags/X`, commit id): a short string
    without control characters. Revisions never become paths except as a 40-hex commit id (`Repo.commit`)."""
    if not isinstance(value, str) or not value or len(value) > 256 or _has_control(value):
        raise bad_request(f"Invalid revision {value!r}: expected a branch, tag or commit id, no control characters.")
    return value


def validate_ref_name(value, what: str = "branch") -> str:
    """A branch or tag name: `/`-separated parts of `[A-Za-z0-9._-]`, not `refs/...`, not a 40-hex commit id."""
    if isinstance(value, str) and _has_control(value):
        raise bad_request(f"Invalid {what} name {value!r}: control characters are not allowed.")
    ok = isinstance(value, str) and 0 < len(value) <= 200 and not value.startswith("refs/")
    ok = ok and not HEX40.match(value) and not value.endswith(".lock") and ".." not in value
    ok = ok and all(_REF_PART.match(part) for part in value.split("/"))
    if not ok:
        raise bad_request(f"Invalid {what} name {value!r}.")
    return value


def validate_path(value, what: str = "path") -> str:
    """A file path inside a repo: relative, `/`-separated, no empty/`.`/`..` parts, no `.git`/`.cache` folders."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"Invalid {what}: expected a non-empty string (at most 4096 characters).")
    if len(value) > 4096:
        raise bad_request(f"Invalid {what}: longer than 4096 characters.")
    if value.startswith("/") or "\\" in value or re.match(r"^[A-Za-z]:", value):
        raise bad_request(f"Invalid {what} {value!r}: must be a relative POSIX path.")
    if _has_control(value):
        raise bad_request(f"Invalid {what} {value!r}: control characters are not allowed.")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise bad_request(f"Invalid {what} {value!r}: empty, '.' or '..' components are not allowed.")
    if any(part in _FORBIDDEN_FOLDERS for part in parts[:-1]) or parts[-1] in _FORBIDDEN_FOLDERS:
        raise bad_request(f"Invalid {what} {value!r}: '.git' and '.cache' are reserved.")
    return value


def _hold_staging(path: Path) -> int | None:
    """Open and flock this server's staging directory for its lifetime (None without flock): the mark of a live
    owner that `Store._clean_stale_tmp` of another server on the same root respects."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class StagedBlob:
    """Content received for a commit: hashes, size, and the staging file (None when the blob is already stored)."""

    sha256: str
    size: int
    oid: str
    tmp: Path | None


# ---------------------------------------------------------------------------------------------------------- trees


def file_entry(path: str, info: dict, lfs_threshold: int) -> dict:
    """Tree entry of a file as the Hub lists it (`oid` = git blob sha1; `lfs` for large files)."""
    if info["size"] >= lfs_threshold:
        pointer = lfs_pointer(info["sha256"], info["size"])
        return {
            "type": "file",
            "oid": git_blob_oid(pointer),
            "size": info["size"],
            "path": path,
            "lfs": {"oid": info["sha256"], "size": info["size"], "pointerSize": len(pointer)},
        }
    return {"type": "file", "oid": info["oid"], "size": info["size"], "path": path}


def directory_oids(files: dict) -> dict[str, str]:
    """A stable id per directory ("" = root): sha1 over the sorted (path, oid) of the files below it."""
    members: dict[str, list] = {"": []}
    for path in sorted(files):
        parts = path.split("/")
        for i in range(len(parts)):
            members.setdefault("/".join(parts[:i]), []).append((path, files[path]["oid"]))
    return {d: hashlib.sha1(_canonical(m)).hexdigest() for d, m in members.items()}


def list_tree(files: dict, path: str, recursive: bool, lfs_threshold: int) -> list[dict]:
    """Entries under directory `path` ("" = root): immediate children, or everything below with `recursive`."""
    dirs = directory_oids(files)
    if path not in dirs:
        if path in files:
            raise HubError(404, "EntryNotFound", f"{path} is a file, not a directory")
        raise HubError(404, "EntryNotFound", f"{path} does not exist")
    prefix = path + "/" if path else ""
    entries = []
    for d in sorted(dirs):
        if d and d.startswith(prefix) and (recursive or "/" not in d[len(prefix) :]):
            entries.append({"type": "directory", "oid": dirs[d], "size": 0, "path": d})
    for f in sorted(files):
        if f.startswith(prefix) and (recursive or "/" not in f[len(prefix) :]):
            entries.append(file_entry(f, files[f], lfs_threshold))
    return entries


def path_entry(files: dict, path: str, lfs_threshold: int, dirs: dict | None = None) -> dict | None:
    """Tree entry of one file or directory, None if the path does not exist."""
    if path in files:
        return file_entry(path, files[path], lfs_threshold)
    dirs = directory_oids(files) if dirs is None else dirs
    if path in dirs and path:
        return {"type": "directory", "oid": dirs[path], "size": 0, "path": path}
    return None


# ---------------------------------------------------------------------------------------------------------- store


class Store:
    """All repos under one root directory. Thread-safe; one Store per server."""

    def __init__(self, root: Path, *, lfs_threshold: int = DEFAULT_LFS_THRESHOLD):
        self.root = Path(root).resolve()
        self.lfs_threshold = lfs_threshold
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / "hub-store.json"
        if marker.exists():
            fmt = json.loads(marker.read_text()).get("format")
            if fmt != STORE_FORMAT:
                raise ValueError(f"{self.root} holds a hub store of format {fmt}, expected {STORE_FORMAT}")
        else:
            if any(p.name not in ("blobs", "repos", "locks", "tmp") for p in self.root.iterdir()):
                raise ValueError(f"{self.root} is not empty and is not a hub store; pick an empty or new directory")
            _fsync_write(marker, _canonical({"format": STORE_FORMAT}))
        for sub in ("blobs", "repos", "locks", "tmp"):
            (self.root / sub).mkdir(exist_ok=True)
        self._repos_root = (self.root / "repos").resolve()
        self._clean_stale_tmp()
        self.tmp = self.root / "tmp" / uuid.uuid4().hex
        self.tmp.mkdir()
        self._tmp_fd = _hold_staging(self.tmp)
        self._locks: dict[tuple, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._commit_cache: OrderedDict[str, dict] = OrderedDict()
        self._cache_guard = threading.Lock()

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self._tmp_fd is not None:
            os.close(self._tmp_fd)  # releases the flock
            self._tmp_fd = None

    def _clean_stale_tmp(self, max_age_s: float = 24 * 3600) -> None:
        """Remove the staging of servers that are gone (a killed upload leaves its staged and spilled files there).

        A live server holds a flock on its staging directory, so one that can be locked here has no owner and goes
        at once. Without flock (not Linux), or for stray files, fall back to age: older than a day of idling.
        """
        for p in (self.root / "tmp").iterdir():
            with contextlib.suppress(OSError):
                if p.is_dir() and not p.is_symlink() and fcntl is not None:
                    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a running server's staging
                    else:
                        shutil.rmtree(p, ignore_errors=True)
                    finally:
                        os.close(fd)
                elif time.time() - p.lstat().st_mtime > max_age_s:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()

    # -- blobs

    def blob_path(self, sha256: str) -> Path:
        if not isinstance(sha256, str) or not HEX64.match(sha256):
            raise HubError(500, "InternalError", f"Corrupt store: blob id {sha256!r} is not a sha256")
        return self.root / "blobs" / sha256[:2] / sha256

    def has_blob(self, sha256: str) -> bool:
        return isinstance(sha256, str) and bool(HEX64.match(sha256)) and self.blob_path(sha256).is_file()

    def stage_blob(self, data: bytes) -> StagedBlob:
        """Hash `data` and, unless already stored, write it to the staging area (fsynced)."""
        return self.stage_stream([data], len(data))

    def stage_stream(self, chunks, size: int) -> StagedBlob:
        """Write the byte chunks of one file of `size` bytes to the staging area, hashing them on the way (sha256
        and the git blob sha1, whose header needs the size up front). Memory: one chunk. The staged file is dropped
        again if the store already holds the blob; on any error (also one raised by `chunks`) it is removed."""
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        tmp, n = self.tmp_path("blob-"), 0
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    sha256.update(chunk)
                    sha1.update(chunk)
                    f.write(chunk)
                    n += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            if n != size:
                raise bad_request(f"File content is {n} bytes, {size} were announced")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        staged = StagedBlob(sha256=sha256.hexdigest(), size=size, oid=sha1.hexdigest(), tmp=tmp)
        if self.blob_path(staged.sha256).is_file():
            tmp.unlink(missing_ok=True)
            staged.tmp = None
        return staged

    def stored_blob(self, sha256: str) -> StagedBlob:
        """A blob already in the store (used by `lfsFile` commit operations); its git oid is hashed streaming."""
        path = self.blob_path(sha256)
        size = path.stat().st_size
        sha1 = hashlib.sha1(b"blob %d\0" % size)
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha1.update(chunk)
        return StagedBlob(sha256=sha256, size=size, oid=sha1.hexdigest(), tmp=None)

    def publish_blob(self, staged: StagedBlob) -> None:
        if staged.tmp is None:
            return
        dest = self.blob_path(staged.sha256)
        if dest.is_file():
            staged.tmp.unlink(missing_ok=True)
        else:
            dest.parent.mkdir(exist_ok=True)
            os.replace(staged.tmp, dest)
        staged.tmp = None

    def tmp_path(self, prefix: str = "") -> Path:
        """A fresh name in this store's staging directory (recreated if a stale-tmp sweep removed it)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self.tmp / f"{prefix}{uuid.uuid4().hex}"

    def write_atomic(self, dest: Path, data: bytes) -> None:
        """Write `data` to a staging file, fsync it, then os.replace it onto `dest`."""
        tmp = self.tmp_path("w-")
        _fsync_write(tmp, data)
        os.replace(tmp, dest)

    @staticmethod
    def discard(staged: list[StagedBlob]) -> None:
        for s in staged:
            if s.tmp is not None:
                s.tmp.unlink(missing_ok=True)
                s.tmp = None

    # -- commit objects (immutable: cached by id)

    def cached_commit(self, cid: str) -> dict | None:
        with self._cache_guard:
            obj = self._commit_cache.get(cid)
            if obj is not None:
                self._commit_cache.move_to_end(cid)
            return obj

    def cache_commit(self, cid: str, obj: dict) -> None:
        with self._cache_guard:
            self._commit_cache[cid] = obj
            while len(self._commit_cache) > 256:
                self._commit_cache.popitem(last=False)

    # -- repos

    def repo_dir(self, rtype: str, ns: str, name: str) -> Path:
        """`<root>/repos/<type>/<ns>/<name>`, after validating all three and checking that it stays under the root
        once symlinks are resolved (a link planted in the store must not lead outside either)."""
        validate_repo_type(rtype)
        validate_name(ns, "namespace")
        validate_name(name, "repo name")
        path = self.root / "repos" / rtype / ns / name
        if not path.resolve().is_relative_to(self._repos_root):
            raise bad_request(f"Invalid repo {ns}/{name}: it resolves outside the store")
        return path

    @contextlib.contextmanager
    def repo_lock(self, rtype: str, ns: str, name: str, *, create: bool = False):
        """Exclusive lock of one repo: a thread lock, plus flock on a lock file for other processes on this root.

        Only for a repo that exists (404 otherwise, before anything is created on disk), or with `create` for the
        repo `create_repo` is about to make.
        """
        repo_dir = self.repo_dir(rtype, ns, name)
        if not create and not (repo_dir / "meta.json").is_file():
            raise HubError(404, "RepoNotFound", f"Repository {ns}/{name} ({rtype}) not found")
        key = (rtype, ns, name)
        with self._locks_guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if fcntl is None:
                yield
                return
            path = self.root / "locks" / rtype / ns / f"{name}.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

    def get_repo(self, rtype: str, ns: str, name: str) -> Repo:
        """The repo; HubError 400 for an invalid type/namespace/name, 404 RepoNotFound if it does not exist."""
        repo = Repo(self, rtype, ns, name)
        try:
            repo.meta = json.loads((repo.dir / "meta.json").read_text())
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise HubError(404, "RepoNotFound", f"Repository {ns}/{name} ({rtype}) not found") from None
        return repo

    def create_repo(self, rtype: str, ns: str, name: str, *, private: bool, author: str) -> Repo:
        """New repo whose `main` holds one empty commit. HubError 409 if it exists."""
        final = self.repo_dir(rtype, ns, name)  # validates
        with self.repo_lock(rtype, ns, name, create=True):
            if (final / "meta.json").exists():
                raise HubError(409, "RepoExists", f"You already created this {rtype} repo: {ns}/{name}")
            work = self.tmp_path("repo-")
            (work / "commits").mkdir(parents=True)
            created = now_iso()
            _fsync_write(work / "meta.json", _canonical({"private": bool(private), "createdAt": created}))
            root_commit = {
                "parent": None,
                "files": {},
                "message": "initial commit",
                "description": "",
                "author": author,
                "date": created,
            }
            cid = hashlib.sha1(_canonical(root_commit)).hexdigest()
            _fsync_write(work / "commits" / f"{cid}.json", _canonical(root_commit))
            _fsync_write(work / "refs.json", _canonical({"branches": {DEFAULT_BRANCH: cid}, "tags": {}}))
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():  # a leftover without meta.json (crash during delete): replace it
                shutil.rmtree(final, ignore_errors=True)
            os.rename(work, final)
        return self.get_repo(rtype, ns, name)

    def delete_repo(self, rtype: str, ns: str, name: str) -> None:
        self.get_repo(rtype, ns, name)  # 400 / 404 before anything is locked or created
        with self.repo_lock(rtype, ns, name):
            repo = self.get_repo(rtype, ns, name)
            trash = self.tmp_path("trash-")
            os.rename(repo.dir, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def list_repos(self, rtype: str) -> list[Repo]:
        base = self.root / "repos" / rtype
        repos = []
        if base.is_dir():
            for ns_dir in sorted(base.iterdir()):
                for repo_dir in sorted(ns_dir.iterdir()) if ns_dir.is_dir() else ():
                    with contextlib.suppress(HubError):
                        repos.append(self.get_repo(rtype, ns_dir.name, repo_dir.name))
        return repos

    def namespace_exists(self, ns: str) -> bool:
        validate_name(ns, "namespace")
        return any((self.root / "repos" / t / ns).is_dir() for t in REPO_TYPES)


class Repo:
    """One repo of a Store. Reads are lock-free (refs.json + immutable commits); writes take the repo lock."""

    def __init__(self, store: Store, rtype: str, ns: str, name: str):
        self.store = store
        self.rtype = rtype
        self.ns = ns
        self.name = name
        self.dir = store.repo_dir(rtype, ns, name)
        self.meta: dict = {}

    @property
    def repo_id(self) -> str:
        return f"{self.ns}/{self.name}"

    @property
    def private(self) -> bool:
        return bool(self.meta.get("private"))

    def _not_found(self) -> HubError:
        return HubError(404, "RepoNotFound", f"Repository {self.repo_id} ({self.rtype}) not found")

    # -- reads

    def refs(self) -> dict:
        try:
            return json.loads((self.dir / "refs.json").read_text())
        except FileNotFoundError:
            raise self._not_found() from None

    def commit(self, cid: str) -> dict:
        if not isinstance(cid, str) or not HEX40.match(cid):
            raise HubError(500, "InternalError", f"Corrupt store: commit id {cid!r} in {self.repo_id}")
        obj = self.store.cached_commit(cid)
        if obj is not None and (self.dir / "commits" / f"{cid}.json").exists():
            return obj
        try:
            obj = json.loads((self.dir / "commits" / f"{cid}.json").read_text())
        except FileNotFoundError:
            if not self.dir.exists():
                raise self._not_found() from None
            raise HubError(404, "RevisionNotFound", f"Commit {cid} not found in {self.repo_id}") from None
        self.store.cache_commit(cid, obj)
        return obj

    def resolve(self, rev: str, refs: dict | None = None) -> str:
        """Commit id of a branch, tag, `refs/heads/X`, `refs/tags/X` or 40-hex commit id of this repo."""
        validate_revision(rev)
        refs = self.refs() if refs is None else refs
        branches, tags = refs["branches"], refs["tags"]
        if rev.startswith("refs/heads/") and rev[len("refs/heads/") :] in branches:
            return branches[rev[len("refs/heads/") :]]
        if rev.startswith("refs/tags/") and rev[len("refs/tags/") :] in tags:
            return tags[rev[len("refs/tags/") :]]
        if rev in branches:
            return branches[rev]
        if rev in tags:
            return tags[rev]
        if HEX40.match(rev) and (self.dir / "commits" / f"{rev.lower()}.json").exists():
            return rev.lower()
        if not self.dir.exists():
            raise self._not_found()
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def files(self, cid: str) -> dict:
        return self.commit(cid)["files"]

    def history(self, cid: str):
        """Commits from `cid` back to the root: (id, commit object)."""
        while cid is not None:
            obj = self.commit(cid)
            yield cid, obj
            cid = obj["parent"]

    def last_commits(self, cid: str, paths: list[str]) -> dict[str, tuple[str, dict]]:
        """For each path (file or directory), the latest commit at or before `cid` that changed it."""
        pending, found = set(paths), {}
        for commit_id, obj in self.history(cid):
            if not pending:
                break
            parent_files = self.files(obj["parent"]) if obj["parent"] else {}
            files = obj["files"]
            changed = {p for p in files.keys() | parent_files.keys() if files.get(p) != parent_files.get(p)}
            for p in list(pending):
                if p in changed or any(c.startswith(p + "/") for c in changed):
                    found[p] = (commit_id, obj)
                    pending.discard(p)
        return found

    # -- writes (all under the repo lock; refs.json replaced last)

    def _write_refs(self, refs: dict) -> None:
        self.store.write_atomic(self.dir / "refs.json", _canonical(refs))

    def _locked_refs(self) -> dict:
        if not (self.dir / "meta.json").exists():  # deleted since get_repo
            raise self._not_found()
        return self.refs()

    def create_branch(self, branch: str, starting_point: str | None) -> str:
        validate_ref_name(branch, "branch")
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            refs = self._locked_refs()
            if branch in refs["branches"] or branch in refs["tags"]:
                raise HubError(409, "RefExists", f"Reference {branch} already exists")
            cid = self.resolve(starting_point or DEFAULT_BRANCH, refs)
            refs["branches"][branch] = cid
            self._write_refs(refs)
        return cid

    def delete_branch(self, branch: str) -> None:
        branch = validate_revision(branch).removeprefix("refs/heads/")
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            refs = self._locked_refs()
            if branch not in refs["branches"]:
                raise HubError(404, "RevisionNotFound", f"Branch {branch} not found")
            if branch == DEFAULT_BRANCH:
                raise HubError(403, "Forbidden", f"Cannot delete the default branch {DEFAULT_BRANCH}")
            del refs["branches"][branch]
            self._write_refs(refs)

    def create_tag(self, tag: str, revision: str) -> str:
        validate_ref_name(tag, "tag")
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            refs = self._locked_refs()
            if tag in refs["tags"] or tag in refs["branches"]:
                raise HubError(409, "RefExists", f"Reference {tag} already exists")
            cid = self.resolve(revision, refs)
            refs["tags"][tag] = cid
            self._write_refs(refs)
        return cid

    def delete_tag(self, tag: str) -> None:
        tag = validate_revision(tag).removeprefix("refs/tags/")
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            refs = self._locked_refs()
            if tag not in refs["tags"]:
                raise HubError(404, "RevisionNotFound", f"Tag {tag} not found")
            del refs["tags"][tag]
            self._write_refs(refs)

    def set_private(self, private: bool) -> None:
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            self._locked_refs()
            meta = dict(self.meta, private=bool(private))
            self.store.write_atomic(self.dir / "meta.json", _canonical(meta))
            self.meta = meta

    def apply_commit(
        self,
        revision: str,
        operations: list[tuple],
        *,
        summary: str,
        description: str,
        parent: str | None,
        author: str,
    ) -> str:
        """Apply ("add", path, StagedBlob) / ("delete_file", path) / ("delete_folder", path) on top of a branch.

        Atomic: either the branch moves to a new commit holding all operations, or nothing changes. `parent`, if
        given, must be the branch head (else 412). Staged blobs are published only once everything validated.
        """
        branch = validate_revision(revision).removeprefix("refs/heads/")
        for op in operations:
            validate_path(op[1])
        with self.store.repo_lock(self.rtype, self.ns, self.name):
            refs = self._locked_refs()
            if branch not in refs["branches"]:
                if branch in refs["tags"] or HEX40.match(branch):
                    raise bad_request(f"Commits must target a branch, {revision!r} is not one")
                raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            head = refs["branches"][branch]
            if parent is not None and parent.lower() != head:
                raise HubError(
                    412,
                    "PreconditionFailed",
                    f"Parent commit {parent} is not the head of {branch} ({head}): the branch moved, retry",
                )
            files = dict(self.files(head))
            for op in operations:
                kind, path = op[0], op[1]
                if kind == "add":
                    blob = op[2]
                    files[path] = {"sha256": blob.sha256, "size": blob.size, "oid": blob.oid}
                elif kind == "delete_file":
                    if path not in files:
                        raise HubError(404, "EntryNotFound", f"A file with this name doesn't exist: {path}")
                    del files[path]
                else:
                    doomed = [p for p in files if p.startswith(path + "/")]
                    if not doomed:
                        raise HubError(404, "EntryNotFound", f"A folder with this name doesn't exist: {path}")
                    for p in doomed:
                        del files[p]
            for p in files:  # a path cannot be both a file and a directory
                parts = p.split("/")
                for i in range(1, len(parts)):
                    if "/".join(parts[:i]) in files:
                        raise bad_request(f"{'/'.join(parts[:i])!r} is a file, it cannot hold {p!r}")
            for op in operations:
                if op[0] == "add":
                    self.store.publish_blob(op[2])
            obj = {
                "parent": head,
                "files": files,
                "message": summary,
                "description": description,
                "author": author,
                "date": now_iso(),
            }
            cid = hashlib.sha1(_canonical(obj)).hexdigest()
            self.store.write_atomic(self.dir / "commits" / f"{cid}.json", _canonical(obj))
            refs["branches"][branch] = cid
            self._write_refs(refs)
        self.store.cache_commit(cid, obj)
        return cid
