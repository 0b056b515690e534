"""HTTP routes of the embedded Hub: maps Hub API requests onto the Store. Transport-free (see server.py).

Routes (`{t}` = models | datasets | spaces | kernels; file prefix `""` | `datasets/` | `spaces/` | `kernels/`):

    GET    /api/whoami-v2                                   token owner (401 without a valid token)
    GET    /api/agent-harnesses                             empty registry (huggingface_hub telemetry helper)
    POST   /api/validate-yaml                               always valid (README front matter is not checked)
    GET    /api/organizations/{ns}/overview                 `trustedKernelPublisher` iff ns is a trusted org
    POST   /api/repos/create                                409 with `url` if it exists
    DELETE /api/repos/delete
    PUT    /api/{t}/{ns}/{name}/settings                    {"private": bool} / {"visibility": ...}
    GET    /api/{t}                                         list repos (?author=, ?search=)
    GET    /api/{t}/{ns}/{name}[/revision/{rev}]            repo info: id, sha, private, siblings, ...
    GET    /api/{t}/{ns}/{name}/refs                        branches, tags, converts (+ pullRequests: [])
    GET    /api/{t}/{ns}/{name}/tree/{rev}[/{path}]         ?recursive=, ?expand= (lastCommit)
    POST   /api/{t}/{ns}/{name}/paths-info/{rev}            form or JSON `paths`, `expand`
    GET    /api/{t}/{ns}/{name}/commits/{rev}               history, newest first
    POST   /api/{t}/{ns}/{name}/branch/{branch}             {"startingPoint"?}; DELETE removes it
    POST   /api/{t}/{ns}/{name}/tag/{rev}                   {"tag", "message"?}; DELETE /tag/{tag} removes it
    POST   /api/{t}/{ns}/{name}/preupload/{rev}             every file "regular" (never lfs/xet)
    POST   /api/{t}/{ns}/{name}/commit/{rev}                NDJSON: header, file, lfsFile, deletedFile, deletedFolder
    HEAD   /{prefix}{ns}/{name}/resolve/{rev}/{path}        branch/tag -> 307 to the commit URL; Range -> 206
    GET    same

Xet and Git-LFS transfer endpoints answer 501 so clients never switch to them.

Request values (repo type, namespace, name, revision, path) are validated by storage.py, the one place that maps
them to the file system; invalid ones, NUL and control characters included, are 400 BadRequest on every route.
Commit bodies are read as a stream (ndjson.py): bounded memory whatever the file sizes.

Auth: reads of public repos need no token; private repos and every write need a configured token. Any configured
token may write to any namespace. A request that presents an unknown token is refused (401 "Invalid credentials in
Authorization header") whatever it asks for, as the Hub does: a wrong HF_TOKEN is reported, not silently ignored.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote

from .. import bounded_json
from .ndjson import NDJSONError, NDJSONReader, Spilled
from .storage import (
    HEX40,
    HEX64,
    REPO_TYPES,
    HubError,
    Repo,
    Store,
    bad_request,
    directory_oids,
    file_entry,
    list_tree,
    path_entry,
    validate_path,
    validate_repo_type,
)

PLURAL_TO_TYPE = {f"{t}s": t for t in REPO_TYPES}
FILE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/", "kernel": "kernels/"}
_PREFIX_TO_TYPE = {"datasets": "dataset", "spaces": "space", "kernels": "kernel"}
MAX_JSON_BYTES = 16 * 1024 * 1024
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


@dataclass
class Response:
    status: int
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    file: Path | None = None  # streamed instead of `body`: bytes [offset, offset + length) of this file
    offset: int = 0
    length: int = 0


@dataclass
class Request:
    method: str
    segments: list  # URL path split on "/", each part percent-decoded
    query: dict  # parse_qs of the query string
    headers: object  # case-insensitive .get()
    body: object  # server.BodyReader
    base_url: str  # "http://host:port" as the client addressed us


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, json.dumps(obj).encode()
    )


def header_value(value) -> str:
    """A response header value as one printable-ASCII line: anything else (NUL, CR, LF, non-ASCII: request values
    echoed in error messages) becomes `?`, so that no request can split or break the headers the client parses.
    server.py passes every header through it."""
    return "".join(c if " " <= c <= "~" else "?" for c in str(value)[:1000])


def error_response(err: HubError) -> Response:
    """The Hub's error shape: status, X-Error-Code, X-Error-Message (one ASCII line), JSON {"error": ...}."""
    headers = {"X-Error-Code": err.code, "X-Error-Message": header_value(err.message[:500]), **err.headers}
    return json_response({"error": err.message, **err.extra}, err.status, headers)


def _qbool(query: dict, key: str) -> bool:
    return query.get(key, ["false"])[-1].lower() in ("1", "true", "yes")


def _split_rev(rest: list) -> tuple[str, list]:
    """(revision, remaining segments). Clients send the revision as one %2F-encoded segment; also accept a raw
    `refs/heads/X`, `refs/tags/X` or `refs/pr/N` spread over three segments."""
    if not rest or not rest[0]:
        raise bad_request("Missing revision")
    if rest[0] == "refs" and len(rest) >= 3 and rest[1] in ("heads", "tags", "pr", "convert"):
        return "/".join(rest[:3]), rest[3:]
    return rest[0], rest[1:]


class HubApp:
    """Request -> Response for one Store. Thread-safe (state lives in the Store)."""

    def __init__(
        self,
        store: Store,
        *,
        tokens=(),
        trusted_orgs=(),
        max_commit_bytes: int,
        user_name: str = "local",
    ):
        self.store = store
        self.tokens = [t for t in tokens if t]
        self.trusted_orgs = set(trusted_orgs)
        self.max_commit_bytes = max_commit_bytes
        self.user_name = user_name

    # -- auth

    def _identify(self, req: Request) -> tuple[str | None, bool]:
        """(user name or None, whether an unknown token was presented)."""
        header = req.headers.get("Authorization") or ""
        if not header:
            return None, False
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            for known in self.tokens:
                if hmac.compare_digest(token.encode(), known.encode()):
                    return self.user_name, False
        return None, True

    def _require_user(self, req: Request) -> str:
        user, invalid = self._identify(req)
        if user is None:
            if invalid:
                raise HubError(401, "Unauthorized", _INVALID_CREDENTIALS)
            hint = (
                "pass a token that the server was started with (--token)"
                if self.tokens
                else "this server has no tokens configured and is read-only (start it with --token)"
            )
            raise HubError(401, "Unauthorized", f"Authentication required: {hint}")
        return user

    def _readable_repo(self, req: Request, rtype: str, ns: str, name: str) -> Repo:
        """The repo if the caller may read it. Missing and private-without-token look the same (404 RepoNotFound)."""
        user, invalid = self._identify(req)
        try:
            repo = self.store.get_repo(rtype, ns, name)
        except HubError as e:
            if e.status != 404:
                raise  # an invalid name: 400, not "not found"
            repo = None
        if repo is not None and (not repo.private or user is not None):
            return repo
        if invalid:
            raise HubError(401, "Unauthorized", _INVALID_CREDENTIALS)
        raise HubError(
            404,
            "RepoNotFound",
            f"Repository {ns}/{name} ({rtype}) not found. If it is private, make sure you pass a valid token.",
        )

    def _writable_repo(self, req: Request, rtype: str, ns: str, name: str) -> tuple[Repo, str]:
        user = self._require_user(req)
        return self.store.get_repo(rtype, ns, name), user

    # -- dispatch

    def handle(self, req: Request) -> Response:
        try:
            if self._identify(req)[1]:
                raise HubError(401, "Unauthorized", _INVALID_CREDENTIALS + (
                    "" if self.tokens else " (this server has no tokens: it is read-only, and reads need none)"))
            s = req.segments
            if s and s[0] == "api":
                return self._api(req, s[1:])
            return self._files(req, s)
        except HubError as e:
            return error_response(e)

    def _files(self, req: Request, s: list) -> Response:
        if len(s) >= 5 and s[0] in _PREFIX_TO_TYPE and s[3] == "resolve":
            return self._resolve(req, _PREFIX_TO_TYPE[s[0]], s[1], s[2], s[4:])
        if len(s) >= 4 and s[2] == "resolve":
            return self._resolve(req, "model", s[0], s[1], s[3:])
        if "info" in s and any(part.endswith(".git") for part in s):
            raise HubError(501, "NotImplemented", "Git-LFS transfers are not supported: uploads are inline (regular)")
        raise HubError(404, "NotFound", f"No route for /{'/'.join(s)}")

    def _api(self, req: Request, s: list) -> Response:
        m = req.method
        if s == ["whoami-v2"] and m in ("GET", "HEAD"):
            return self._whoami(req)
        if s == ["agent-harnesses"] and m in ("GET", "HEAD"):
            return json_response({"standardEnvVars": [], "harnesses": {}})
        if s == ["validate-yaml"] and m == "POST":
            req.body.read_all(MAX_JSON_BYTES)
            return json_response({"errors": [], "warnings": []})
        if len(s) == 3 and s[0] == "organizations" and s[2] == "overview" and m in ("GET", "HEAD"):
            return self._org_overview(s[1])
        if s == ["repos", "create"] and m == "POST":
            return self._create_repo(req)
        if s == ["repos", "delete"] and m == "DELETE":
            return self._delete_repo(req)
        if s and s[0] in PLURAL_TO_TYPE:
            rtype = PLURAL_TO_TYPE[s[0]]
            if len(s) == 1 and m in ("GET", "HEAD"):
                return self._list_repos(req, rtype)
            if len(s) >= 3:
                return self._repo_api(req, rtype, s[1], s[2], s[3:])
        raise HubError(404, "NotFound", f"No route for {m} /api/{'/'.join(s)}")

    def _repo_api(self, req: Request, rtype: str, ns: str, name: str, rest: list) -> Response:
        m = req.method
        action, args = (rest[0], rest[1:]) if rest else ("", [])
        reads = {"": 0, "revision": 1, "refs": 0, "tree": 1, "commits": 1}
        if action in reads and m in ("GET", "HEAD"):
            if len(args) < reads[action]:
                raise bad_request("Missing revision")
            repo = self._readable_repo(req, rtype, ns, name)
            if action in ("", "revision"):
                return self._info(req, repo, "/".join(args) if args else None)
            if action == "refs":
                return self._refs(req, repo)
            if action == "tree":
                return self._tree(req, repo, args)
            return self._commits(repo, "/".join(args))
        if action == "paths-info" and m == "POST" and args:
            return self._paths_info(req, self._readable_repo(req, rtype, ns, name), "/".join(args))
        if action in ("xet-read-token", "xet-write-token"):
            raise HubError(501, "NotImplemented", "Xet is not supported by this server: files are served over HTTP")
        if action in ("branch", "tag", "preupload", "commit", "settings"):
            repo, user = self._writable_repo(req, rtype, ns, name)
            if action == "branch" and args and m in ("POST", "DELETE"):
                return self._branch(req, repo, "/".join(args))
            if action == "tag" and args and m in ("POST", "DELETE"):
                return self._tag(req, repo, "/".join(args))
            if action == "preupload" and args and m == "POST":
                return self._preupload(req, repo, "/".join(args))
            if action == "commit" and args and m == "POST":
                return self._commit(req, repo, "/".join(args), user)
            if action == "settings" and not args and m == "PUT":
                return self._settings(req, repo)
        if action in reads or action in ("paths-info", "branch", "tag", "preupload", "commit", "settings"):
            raise HubError(405, "MethodNotAllowed", f"{m} is not allowed on {action or 'repo info'}")
        raise HubError(404, "NotFound", f"No route for {m} /api/{rtype}s/{ns}/{name}/{'/'.join(rest)}")

    # -- helpers

    def _json_body(self, req: Request) -> dict:
        raw = req.body.read_all(MAX_JSON_BYTES)
        if not raw.strip():
            return {}
        try:
            obj = bounded_json.loads(raw, max_bytes=MAX_JSON_BYTES, what="the request body")
        except bounded_json.JSONLimitError as e:
            raise bad_request(str(e)) from None
        except (ValueError, UnicodeDecodeError):
            raise bad_request("Request body is not valid JSON") from None
        if not isinstance(obj, dict):
            raise bad_request("Request body must be a JSON object")
        return obj

    def _repo_url(self, req: Request, repo_type: str, repo_id: str) -> str:
        return f"{req.base_url}/{FILE_PREFIX[repo_type]}{repo_id}"

    def _repo_info(self, repo: Repo, cid: str, commit: dict, *, siblings: bool) -> dict:
        info = {
            "_id": repo.repo_id,
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.ns,
            "sha": cid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "lastModified": commit["date"],
            "createdAt": repo.meta.get("createdAt"),
        }
        if repo.rtype != "model":
            del info["modelId"]
        if siblings:
            threshold = self.store.lfs_threshold
            info["siblings"] = []
            for path, f in sorted(commit["files"].items()):
                entry = file_entry(path, f, threshold)
                sib = {"rfilename": path, "size": f["size"], "blobId": entry["oid"]}
                if "lfs" in entry:
                    sib["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": entry["lfs"]["pointerSize"]}
                info["siblings"].append(sib)
        return info

    # -- account, orgs, repos

    def _whoami(self, req: Request) -> Response:
        user = self._require_user(req)
        orgs = [{"type": "org", "name": o, "fullname": o, "roleInOrg": "write"} for o in sorted(self.trusted_orgs)]
        return json_response(
            {
                "type": "user",
                "id": user,
                "name": user,
                "fullname": "winattn local Hub user",
                "email": None,
                "emailVerified": False,
                "isPro": False,
                "orgs": orgs,
                "auth": {"type": "access_token", "accessToken": {"displayName": "winattn-hub", "role": "write"}},
            }
        )

    def _org_overview(self, ns: str) -> Response:
        trusted = ns in self.trusted_orgs
        if not trusted and not self.store.namespace_exists(ns):
            raise HubError(404, "NotFound", f"Organization {ns} not found")
        counts = {t: sum(1 for r in self.store.list_repos(t) if r.ns == ns and not r.private) for t in REPO_TYPES}
        return json_response(
            {
                "name": ns,
                "fullname": ns,
                "type": "org",
                "avatarUrl": "",
                "isVerified": False,
                "isFollowing": False,
                "numUsers": 1,
                "numModels": counts["model"],
                "numDatasets": counts["dataset"],
                "numSpaces": counts["space"],
                "numKernels": counts["kernel"],
                "numFollowers": 0,
                "numPapers": 0,
                "trustedKernelPublisher": trusted,
            }
        )

    def _repo_target(self, body: dict, user: str) -> tuple[str, str, str]:
        name = body.get("name")
        ns = body.get("organization") or user
        rtype = validate_repo_type(body.get("type") or "model")
        if isinstance(name, str) and "/" in name and not body.get("organization"):
            ns, name = name.split("/", 1)
        return rtype, ns, name

    def _create_repo(self, req: Request) -> Response:
        user = self._require_user(req)
        body = self._json_body(req)
        rtype, ns, name = self._repo_target(body, user)
        visibility = body.get("visibility")
        if visibility not in (None, "public", "private", "protected"):
            raise bad_request(f"Invalid visibility {visibility!r}")
        private = visibility == "private" if visibility is not None else bool(body.get("private", False))
        url = self._repo_url(req, rtype, f"{ns}/{name}")
        try:
            self.store.create_repo(rtype, ns, name, private=private, author=user)
        except HubError as e:
            if e.status == 409:
                e.extra["url"] = url
            raise
        return json_response({"url": url, "name": f"{ns}/{name}", "id": f"{ns}/{name}"})

    def _delete_repo(self, req: Request) -> Response:
        user = self._require_user(req)
        rtype, ns, name = self._repo_target(self._json_body(req), user)
        self.store.delete_repo(rtype, ns, name)  # validates all three before touching the disk
        return json_response({})

    def _settings(self, req: Request, repo: Repo) -> Response:
        body = self._json_body(req)
        if "visibility" in body:
            repo.set_private(body["visibility"] == "private")
        elif "private" in body:
            repo.set_private(bool(body["private"]))
        return json_response({})

    def _list_repos(self, req: Request, rtype: str) -> Response:
        user, _ = self._identify(req)
        author = req.query.get("author", [None])[-1]
        search = (req.query.get("search", [""])[-1] or "").lower()
        out = []
        for repo in self.store.list_repos(rtype):
            if (repo.private and user is None) or (author and repo.ns != author) or search not in repo.repo_id.lower():
                continue
            cid = repo.resolve("main")
            out.append(self._repo_info(repo, cid, repo.commit(cid), siblings=False))
        return json_response(out)

    # -- reads

    def _info(self, req: Request, repo: Repo, rev: str | None) -> Response:
        cid = repo.resolve(rev or "main")
        return json_response(self._repo_info(repo, cid, repo.commit(cid), siblings=True))

    def _refs(self, req: Request, repo: Repo) -> Response:
        refs = repo.refs()
        out = {
            "branches": [
                {"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in sorted(refs["branches"].items())
            ],
            "converts": [],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in sorted(refs["tags"].items())],
        }
        if "include_prs" in req.query:
            out["pullRequests"] = []
        return json_response(out)

    def _with_last_commits(self, repo: Repo, cid: str, entries: list) -> list:
        found = repo.last_commits(cid, [e["path"] for e in entries])
        for e in entries:
            if e["path"] in found:
                commit_id, obj = found[e["path"]]
                e["lastCommit"] = {"id": commit_id, "title": obj["message"], "date": obj["date"]}
        return entries

    def _tree(self, req: Request, repo: Repo, args: list) -> Response:
        rev, path_parts = _split_rev(args)
        path = "/".join(path_parts)
        if path:
            validate_path(path)
        cid = repo.resolve(rev)
        entries = list_tree(repo.files(cid), path, _qbool(req.query, "recursive"), self.store.lfs_threshold)
        if _qbool(req.query, "expand"):
            entries = self._with_last_commits(repo, cid, entries)
        return json_response(entries)

    def _paths_info(self, req: Request, repo: Repo, rev: str) -> Response:
        raw = req.body.read_all(MAX_JSON_BYTES)
        ctype = (req.headers.get("Content-Type") or "").lower()
        if "json" in ctype:
            try:
                body = bounded_json.loads(raw or b"{}", max_bytes=MAX_JSON_BYTES, what="the request body")
                paths, expand = body.get("paths", []), bool(body.get("expand", False))
            except bounded_json.JSONLimitError as e:
                raise bad_request(str(e)) from None
            except (ValueError, AttributeError):
                raise bad_request("Request body is not a valid JSON object") from None
        else:
            form = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[-1].lower() == "true"
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise bad_request("`paths` must be a list of strings")
        cid = repo.resolve(rev)
        files = repo.files(cid)
        dirs = directory_oids(files)
        entries = []
        for p in dict.fromkeys(p.strip("/") for p in paths):
            entry = path_entry(files, p, self.store.lfs_threshold, dirs) if p else None
            if entry is not None:
                entries.append(entry)
        if expand:
            entries = self._with_last_commits(repo, cid, entries)
        return json_response(entries)

    def _commits(self, repo: Repo, rev: str) -> Response:
        out = []
        for cid, obj in repo.history(repo.resolve(rev)):
            out.append(
                {
                    "id": cid,
                    "title": obj["message"],
                    "message": obj.get("description", ""),
                    "authors": [{"user": obj.get("author", ""), "avatar": ""}],
                    "date": obj["date"],
                }
            )
        return json_response(out)

    def _resolve(self, req: Request, rtype: str, ns: str, name: str, rest: list) -> Response:
        if req.method not in ("GET", "HEAD"):
            raise HubError(405, "MethodNotAllowed", f"{req.method} is not allowed on resolve")
        repo = self._readable_repo(req, rtype, ns, name)
        rev, parts = _split_rev(rest)
        path = validate_path("/".join(parts), "file path")
        cid = repo.resolve(rev)
        info = repo.files(cid).get(path)
        if info is None:
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}", headers={"X-Repo-Commit": cid})
        if rev != cid:
            # Branches and tags move: send the client to the immutable commit URL, so that its HEAD and GET
            # (and a resumed GET) all read the same bytes.
            location = f"/{FILE_PREFIX[rtype]}{ns}/{name}/resolve/{cid}/{quote(path)}"
            return Response(307, {"Location": location, "X-Repo-Commit": cid})
        size = info["size"]
        entry = file_entry(path, info, self.store.lfs_threshold)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": cid,
            "ETag": f'"{info["sha256"] if "lfs" in entry else info["oid"]}"',
        }
        if "lfs" in entry:
            headers["X-Linked-Etag"] = f'"{info["sha256"]}"'
            headers["X-Linked-Size"] = str(size)
        start, end = 0, size - 1
        status = 200
        rng = _parse_range(req.headers.get("Range"), size)
        if rng is not None:
            start, end = rng
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return Response(
            status, headers, file=self.store.blob_path(info["sha256"]), offset=start, length=end - start + 1
        )

    # -- writes

    def _branch(self, req: Request, repo: Repo, branch: str) -> Response:
        if req.method == "DELETE":
            repo.delete_branch(branch)
            return json_response({})
        body = self._json_body(req)
        start = body.get("startingPoint")
        if start is not None and not isinstance(start, str):
            raise bad_request("`startingPoint` must be a revision string")
        repo.create_branch(branch, start)
        return json_response({})

    def _tag(self, req: Request, repo: Repo, arg: str) -> Response:
        if req.method == "DELETE":
            repo.delete_tag(arg)
            return json_response({})
        tag = self._json_body(req).get("tag")
        repo.create_tag(tag, arg)
        return json_response({})

    def _preupload(self, req: Request, repo: Repo, rev: str) -> Response:
        body = self._json_body(req)
        files_in = body.get("files")
        if not isinstance(files_in, list):
            raise bad_request("`files` must be a list")
        cid = repo.resolve(rev)
        existing = repo.files(cid)
        out = []
        for f in files_in:
            if not isinstance(f, dict):
                raise bad_request("each entry of `files` must be an object")
            path = validate_path(f.get("path"))
            item = {"path": path, "uploadMode": "regular", "shouldIgnore": False}
            if path in existing:
                item["oid"] = existing[path]["oid"]
            out.append(item)
        return json_response({"files": out, "commitOid": cid})

    def _commit(self, req: Request, repo: Repo, rev: str, user: str) -> Response:
        if _qbool(req.query, "create_pr"):
            raise bad_request("Pull requests (create_pr) are not supported by this server")
        header, operations, staged = self._parse_commit(req)
        try:
            cid = repo.apply_commit(
                rev,
                operations,
                summary=header["summary"],
                description=header["description"],
                parent=header["parent"],
                author=user,
            )
        finally:
            Store.discard(staged)  # no-op for the blobs apply_commit published
        return json_response(
            {
                "success": True,
                "commitOid": cid,
                "commitUrl": f"{self._repo_url(req, repo.rtype, repo.repo_id)}/commit/{cid}",
                "pullRequestUrl": None,
                "hookOutput": "",
            }
        )

    def _parse_commit(self, req: Request) -> tuple[dict, list, list]:
        """Read the NDJSON body as it arrives, staging file contents on disk; 400 on anything malformed.

        Bounded memory per request: file contents are never held whole (ndjson.py spills long strings to the staging
        directory; the base64 is decoded from there chunk by chunk while hashing into the staged blob). Measured growth
        of a server process's peak RSS (VmHWM) during one commit of a 200 MiB file, sent inline as base64:
        huggingface_hub `upload_file` +1001 MiB before (whole line, JSON string and decoded bytes in memory), +5 MiB
        after; a raw chunked client +1002 MiB before, +4 MiB after. tests/security/test_hub_body.py bounds it.
        """
        header, operations, staged = None, [], []
        body = req.body
        body.check_declared(self.max_commit_bytes)
        reader = NDJSONReader(
            lambda: body.read_chunk(self.max_commit_bytes),
            lambda: self.store.tmp_path("spill-"),
            line_max=MAX_JSON_BYTES,
        )
        try:
            for lineno, item in _ndjson_items(reader):
                if not isinstance(item, dict) or not isinstance(item.get("value"), dict):
                    raise bad_request(f'Malformed NDJSON: line {lineno} must be {{"key": ..., "value": {{...}}}}')
                key, value = item.get("key"), item["value"]
                if key == "header":
                    if header is not None or operations:
                        raise bad_request(f"Malformed NDJSON: line {lineno}: the header must come first, once")
                    header = self._commit_header(value)
                    continue
                if header is None:
                    raise bad_request("Malformed NDJSON: the first line must be the commit header")
                operations.append(self._commit_operation(key, value, lineno, staged))
            if header is None:
                raise bad_request("Malformed NDJSON: empty commit body (no header)")
        except BaseException:
            Store.discard(staged)
            raise
        finally:
            reader.close()  # spill files
        return header, operations, staged

    @staticmethod
    def _commit_header(value: dict) -> dict:
        summary = _small_text(value.get("summary", ""))
        description = _small_text(value.get("description", "") or "")
        parent = value.get("parentCommit")
        if not isinstance(summary, str) or not isinstance(description, str):
            raise bad_request("Commit header: `summary` and `description` must be strings")
        if parent is not None and not (isinstance(parent, str) and HEX40.match(parent)):
            raise bad_request("Commit header: `parentCommit` must be a 40-hex commit id")
        return {"summary": summary, "description": description, "parent": parent}

    def _commit_operation(self, key, value: dict, lineno: int, staged: list) -> tuple:
        where = f"line {lineno} ({key})"
        if key == "file":
            path = validate_path(value.get("path"), f"path on {where}")
            content, encoding = value.get("content"), value.get("encoding", "base64")
            if isinstance(content, Spilled):
                blob = self._stage_spilled(content, encoding, where)
                staged.append(blob)
                return ("add", path, blob)
            if not isinstance(content, str):
                raise bad_request(f"Missing `content` on {where}")
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise bad_request(f"Invalid base64 content on {where}") from None
            elif encoding in ("utf-8", "utf8", "text"):
                data = content.encode()
            else:
                raise bad_request(f"Unsupported encoding {encoding!r} on {where}")
            blob = self.store.stage_blob(data)
            staged.append(blob)
            return ("add", path, blob)
        if key == "lfsFile":
            path = validate_path(value.get("path"), f"path on {where}")
            oid, size = value.get("oid"), value.get("size")
            if value.get("algo", "sha256") != "sha256" or not isinstance(oid, str) or not HEX64.match(oid):
                raise bad_request(f"`lfsFile` needs a sha256 `oid` on {where}")
            if not self.store.has_blob(oid):
                raise bad_request(f"LFS object {oid} was never uploaded (this server takes inline uploads only)")
            blob = self.store.stored_blob(oid)
            if size is not None and size != blob.size:
                raise bad_request(f"LFS object {oid} has size {blob.size}, not {size}")
            return ("add", path, blob)
        if key == "deletedFile":
            return ("delete_file", validate_path(value.get("path"), f"path on {where}"))
        if key == "deletedFolder":
            path = value.get("path")
            path = path.rstrip("/") if isinstance(path, str) else path
            return ("delete_folder", validate_path(path, f"path on {where}"))
        raise bad_request(f"Unsupported operation {key!r} on line {lineno}")

    def _stage_spilled(self, content: Spilled, encoding, where: str):
        """Stage a file whose content the reader spilled to disk, decoding it chunk by chunk; the spill goes."""
        try:
            if encoding == "base64":
                return self.store.stage_stream(_base64_chunks(content, where), _base64_size(content, where))
            if encoding in ("utf-8", "utf8", "text"):
                return self.store.stage_stream(content.chunks(), content.size)
            raise bad_request(f"Unsupported encoding {encoding!r} on {where}")
        finally:
            content.path.unlink(missing_ok=True)


def _ndjson_items(reader: NDJSONReader):
    """(lineno, item) from the reader, its syntax errors as 400."""
    try:
        yield from reader
    except NDJSONError as e:
        raise bad_request(f"Malformed NDJSON: {e}") from None


def _small_text(value, limit: int = 1024 * 1024):
    """A commit-header string; one the reader spilled (over 64 KiB) is read back if it is at most `limit` bytes."""
    if isinstance(value, Spilled) and value.size <= limit:
        return value.path.read_text("utf-8")
    return value


_B64_CHUNK = 1024 * 1024  # a multiple of 4: every chunk but the last decodes on its own


def _base64_size(content: Spilled, where: str) -> int:
    """Decoded size of spilled base64 text, from its length and padding (the git blob id needs it up front)."""
    if content.size % 4:
        raise bad_request(f"Invalid base64 content on {where}")
    with open(content.path, "rb") as f:
        f.seek(content.size - 2)
        pad = f.read(2).count(b"=")
    return content.size // 4 * 3 - pad


def _base64_chunks(content: Spilled, where: str):
    """Decoded bytes of spilled base64 text, 768 KiB at a time; 400 on anything `b64decode(validate=True)` refuses
    for the whole text (padding is only allowed at the very end)."""
    left = content.size
    for chunk in content.chunks(_B64_CHUNK):
        left -= len(chunk)
        try:
            if left and b"=" in chunk:
                raise ValueError("padding before the end")
            yield base64.b64decode(chunk, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"Invalid base64 content on {where}") from None


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end) inclusive for a single `bytes=` range; None to serve the whole file (no or unusable header);
    HubError 416 if it cannot be satisfied."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if not m or (not m[1] and not m[2]):
        return None  # multiple ranges or other units: a full 200 answer is allowed
    if not m[1]:
        length = int(m[2])
        if length == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - length), size - 1
    start = int(m[1])
    end = int(m[2]) if m[2] else size - 1
    if m[2] and end < start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size - 1)


def _unsatisfiable(size: int) -> HubError:
    return HubError(
        416, "RangeNotSatisfiable", "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"}
    )
