"""The embedded Hub at the HTTP level: resolve headers, redirects, ranges, error codes, malformed and hostile input."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download

from winattn.hub import HubServer

from .conftest import TOKEN, ndjson, point_clients_at, raw_request

AUTH = {"Authorization": f"Bearer {TOKEN}"}
DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture
def repo(api):
    """Model repo acme/data: main holds data.bin (DATA) and dir/a.txt. Returns the head commit."""
    api.create_repo("acme/data")
    return api.create_commit(
        "acme/data",
        [CommitOperationAdd("data.bin", DATA), CommitOperationAdd("dir/a.txt", b"a")],
        commit_message="data",
    ).oid


def _store_state(hub: HubServer) -> tuple:
    """Everything a commit could change on disk: refs files, commit objects, blobs."""
    root = hub.root
    refs = sorted((p.relative_to(root), p.read_bytes()) for p in root.glob("repos/*/*/*/refs.json"))
    objects = sorted(str(p.relative_to(root)) for p in root.glob("repos/*/*/*/commits/*.json"))
    blobs = sorted(p.name for p in root.glob("blobs/*/*"))
    return refs, objects, blobs


def test_head_on_commit_url_has_hub_headers(hub, repo):
    status, headers, body = raw_request(hub.url, "HEAD", f"/acme/data/resolve/{repo}/data.bin")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == repo
    git_oid = hashlib.sha1(b"blob %d\0" % len(DATA) + DATA).hexdigest()
    assert headers["ETag"] == f'"{git_oid}"'
    assert headers["Content-Length"] == str(len(DATA))
    assert headers["Accept-Ranges"] == "bytes"
    assert not any(h.lower().startswith("x-xet") for h in headers)


def test_branch_url_redirects_to_commit_url(hub, repo):
    status, headers, _ = raw_request(hub.url, "HEAD", "/acme/data/resolve/main/dir/a.txt")
    assert status == 307
    assert headers["Location"] == f"/acme/data/resolve/{repo}/dir/a.txt"
    assert headers["X-Repo-Commit"] == repo
    status, headers, _ = raw_request(hub.url, "GET", "/acme/data/resolve/refs%2Fheads%2Fmain/dir/a.txt")
    assert status == 307 and headers["Location"].endswith(f"/{repo}/dir/a.txt")


def test_range_requests(hub, repo):
    url = f"/acme/data/resolve/{repo}/data.bin"
    status, headers, body = raw_request(hub.url, "GET", url, headers={"Range": "bytes=100-199"})
    assert status == 206 and body == DATA[100:200]
    assert headers["Content-Range"] == f"bytes 100-199/{len(DATA)}" and headers["Content-Length"] == "100"
    status, headers, body = raw_request(hub.url, "GET", url, headers={"Range": "bytes=10000-"})
    assert status == 206 and body == DATA[10000:]
    status, _, body = raw_request(hub.url, "GET", url, headers={"Range": "bytes=-16"})
    assert status == 206 and body == DATA[-16:]
    status, _, body = raw_request(hub.url, "GET", url, headers={"Range": "bytes=0-999999"})
    assert status == 206 and body == DATA
    status, headers, _ = raw_request(hub.url, "GET", url, headers={"Range": f"bytes={len(DATA)}-"})
    assert status == 416 and headers["X-Error-Code"] == "RangeNotSatisfiable"
    assert headers["Content-Range"] == f"bytes */{len(DATA)}"
    status, _, body = raw_request(hub.url, "GET", url, headers={"Range": "bytes=0-1,5-6"})
    assert status == 200 and body == DATA  # multi-range: the whole file is a valid answer


def test_large_files_are_presented_as_lfs(tmp_path, monkeypatch):
    with HubServer(tmp_path / "store", tokens=[TOKEN], lfs_threshold=1024) as srv:
        point_clients_at(srv.url, tmp_path / "home", monkeypatch)
        api = HfApi(endpoint=srv.url, token=TOKEN)
        api.create_repo("acme/big")
        sha = api.upload_file(path_or_fileobj=DATA, path_in_repo="w.bin", repo_id="acme/big").oid
        sha256 = hashlib.sha256(DATA).hexdigest()
        status, headers, _ = raw_request(srv.url, "HEAD", f"/acme/big/resolve/{sha}/w.bin")
        assert status == 200
        assert headers["X-Linked-Etag"] == f'"{sha256}"' and headers["X-Linked-Size"] == str(len(DATA))
        (entry,) = api.list_repo_tree("acme/big")
        assert entry.lfs.sha256 == sha256 and entry.size == len(DATA)
        path = Path(hf_hub_download("acme/big", "w.bin"))
        assert path.read_bytes() == DATA and path.resolve().name == sha256
        assert api.model_info("acme/big", files_metadata=True).siblings[0].lfs.sha256 == sha256


def test_not_found_codes(hub, repo):
    cases = {
        "/api/models/acme/missing": "RepoNotFound",
        "/api/models/acme/data/revision/v9": "RevisionNotFound",
        "/api/models/acme/data/tree/main/nope": "EntryNotFound",
        "/acme/missing/resolve/main/data.bin": "RepoNotFound",
        "/acme/data/resolve/v9/data.bin": "RevisionNotFound",
        "/acme/data/resolve/main/nope.bin": "EntryNotFound",
        "/acme/data/resolve/main/dir": "EntryNotFound",
        "/api/kernels/acme/data": "RepoNotFound",  # a model repo is not a kernel repo
        "/api/no/such/route": "NotFound",
    }
    for path, code in cases.items():
        status, headers, body = raw_request(hub.url, "GET", path)
        assert (status, headers["X-Error-Code"]) == (404, code), path
        assert "error" in json.loads(body)
    status, headers, _ = raw_request(hub.url, "HEAD", "/acme/data/resolve/main/nope.bin")
    assert headers["X-Repo-Commit"] == repo  # lets the client cache the miss


def test_every_error_has_a_code(hub, repo):
    requests = [
        ("DELETE", "/api/models/acme/data/tree/main", None, {}),
        ("POST", "/api/repos/create", b"{not json", AUTH),
        ("POST", "/api/repos/create", json.dumps({"name": "bad--name"}).encode(), AUTH),
        ("POST", "/api/repos/create", json.dumps({"name": "x", "type": "widget"}).encode(), AUTH),
        ("POST", "/api/models/acme/data/branch/refs%2Fpr%2F1", b"{}", AUTH),
        ("POST", "/api/models/acme/data/commit/main?create_pr=1", ndjson({"key": "header", "value": {}}), AUTH),
        ("GET", "/api/whoami-v2", None, {}),
        ("DELETE", "/api/models/acme/data/branch/main", None, AUTH),
    ]
    for method, path, body, headers in requests:
        status, resp_headers, resp_body = raw_request(hub.url, method, path, body, headers)
        assert 400 <= status < 500, (method, path, status)
        assert resp_headers["X-Error-Code"], (method, path)
        assert isinstance(json.loads(resp_body)["error"], str)


def test_create_conflict_carries_url(hub, api):
    api.create_repo("acme/dup", repo_type="kernel")
    body = json.dumps({"name": "dup", "organization": "acme", "type": "kernel"}).encode()
    status, headers, resp = raw_request(hub.url, "POST", "/api/repos/create", body, AUTH)
    assert status == 409 and headers["X-Error-Code"]
    assert json.loads(resp)["url"] == f"{hub.url}/kernels/acme/dup"


def test_preupload_is_always_regular_and_xet_is_refused(hub, repo):
    body = json.dumps(
        {
            "files": [
                {"path": "huge.so", "sample": "", "size": 5 * 1024**3},
                {"path": "dir/a.txt", "sample": "", "size": 1},
            ]
        }
    ).encode()
    status, _, resp = raw_request(hub.url, "POST", "/api/models/acme/data/preupload/main", body, AUTH)
    files = json.loads(resp)["files"]
    assert status == 200 and [f["uploadMode"] for f in files] == ["regular", "regular"]
    assert all(f["shouldIgnore"] is False for f in files)
    assert files[1]["oid"] == hashlib.sha1(b"blob 1\0a").hexdigest() and "oid" not in files[0]
    status, headers, _ = raw_request(hub.url, "GET", "/api/models/acme/data/xet-write-token/main", None, AUTH)
    assert status == 501 and headers["X-Error-Code"]
    status, _, _ = raw_request(hub.url, "POST", "/acme/data.git/info/lfs/objects/batch", b"{}", AUTH)
    assert status == 501


def test_malformed_ndjson_is_400_and_changes_nothing(hub, repo):
    before = _store_state(hub)
    header = {"key": "header", "value": {"summary": "x"}}
    good = {
        "key": "file",
        "value": {"path": "new.txt", "content": base64.b64encode(b"new").decode(), "encoding": "base64"},
    }
    bodies = [
        ndjson(header, good) + b"{this is not json}\n",
        ndjson(good, header),  # header not first
        ndjson(good),  # no header
        b"",
        ndjson(header, {"key": "file", "value": {"path": "x", "content": "!!!notbase64", "encoding": "base64"}}),
        ndjson(header, {"key": "rename", "value": {"path": "x"}}),
        ndjson(header, ["not", "an", "object"]),
        ndjson({"key": "header", "value": {"summary": "x", "parentCommit": "nothex"}}, good),
        ndjson(header, {"key": "lfsFile", "value": {"path": "x.bin", "algo": "sha256", "oid": "a" * 64, "size": 3}}),
    ]
    for body in bodies:
        status, headers, resp = raw_request(hub.url, "POST", "/api/models/acme/data/commit/main", body, AUTH)
        assert status == 400 and headers["X-Error-Code"] == "BadRequest", (body[:80], status)
        assert b"Traceback" not in resp and json.loads(resp)["error"]
    assert _store_state(hub) == before


@pytest.mark.parametrize(
    "path", ["../escape.txt", "dir/../../escape.txt", "/etc/passwd", "a//b", "./a", ".git/config", "C:/x", "a\\b", ""]
)
def test_path_traversal_in_commit_is_refused(hub, repo, path):
    before = _store_state(hub)
    body = ndjson(
        {"key": "header", "value": {"summary": "evil"}},
        {
            "key": "file",
            "value": {"path": "ok.txt", "content": base64.b64encode(b"fine").decode(), "encoding": "base64"},
        },
        {"key": "file", "value": {"path": path, "content": base64.b64encode(b"pwned").decode(), "encoding": "base64"}},
    )
    status, headers, _ = raw_request(hub.url, "POST", "/api/models/acme/data/commit/main", body, AUTH)
    assert status == 400 and headers["X-Error-Code"] == "BadRequest"
    for op in ("deletedFile", "deletedFolder"):
        body = ndjson({"key": "header", "value": {"summary": "evil"}}, {"key": op, "value": {"path": path}})
        status, _, _ = raw_request(hub.url, "POST", "/api/models/acme/data/commit/main", body, AUTH)
        assert status == 400
    assert _store_state(hub) == before
    assert not (hub.root.parent / "escape.txt").exists()


def test_path_traversal_in_resolve_is_refused(hub, repo):
    for path in (
        "/acme/data/resolve/main/dir/../data.bin",
        "/acme/data/resolve/main/%2E%2E/x",
        "/acme/data/resolve/main//a",
    ):
        status, headers, _ = raw_request(hub.url, "GET", path)
        assert status == 400 and headers["X-Error-Code"] == "BadRequest", path


def test_file_and_folder_with_the_same_name_are_refused(hub, repo):
    body = ndjson(
        {"key": "header", "value": {"summary": "clash"}},
        {"key": "file", "value": {"path": "data.bin/inner", "content": "", "encoding": "base64"}},
    )
    status, _, _ = raw_request(hub.url, "POST", "/api/models/acme/data/commit/main", body, AUTH)
    assert status == 400


def test_oversize_commit_is_413(tmp_path):
    with HubServer(tmp_path / "store", tokens=[TOKEN], max_commit_bytes=4096) as srv:
        raw_request(srv.url, "POST", "/api/repos/create", json.dumps({"name": "r", "organization": "o"}).encode(), AUTH)
        content = base64.b64encode(b"x" * 8192).decode()
        body = ndjson(
            {"key": "header", "value": {"summary": "big"}},
            {"key": "file", "value": {"path": "big.bin", "content": content, "encoding": "base64"}},
        )
        status, headers, _ = raw_request(srv.url, "POST", "/api/models/o/r/commit/main", body, AUTH)
        assert status == 413 and headers["X-Error-Code"] == "PayloadTooLarge"
        # Chunked bodies (no Content-Length) are counted as they arrive.
        status, headers, _ = raw_request(
            srv.url, "POST", "/api/models/o/r/commit/main", iter([body[:3000], body[3000:]]), AUTH
        )
        assert status == 413
        assert json.loads(raw_request(srv.url, "GET", "/api/models/o/r/tree/main")[2]) == []


def test_chunked_commit_body(hub, repo):
    body = ndjson(
        {"key": "header", "value": {"summary": "chunked"}},
        {"key": "file", "value": {"path": "c.txt", "content": base64.b64encode(b"chunked!").decode()}},
    )
    status, _, resp = raw_request(
        hub.url, "POST", "/api/models/acme/data/commit/main", iter([body[:7], body[7:50], body[50:]]), AUTH
    )
    assert status == 200, resp
    commit = json.loads(resp)["commitOid"]
    assert raw_request(hub.url, "GET", f"/acme/data/resolve/{commit}/c.txt")[2] == b"chunked!"


def test_agent_harnesses_and_validate_yaml(hub):
    status, _, body = raw_request(hub.url, "GET", "/api/agent-harnesses")
    assert status == 200 and json.loads(body) == {"standardEnvVars": [], "harnesses": {}}
    payload = json.dumps({"content": "---\nlicense: mit\n---\n# x", "repoType": "kernel"}).encode()
    status, _, body = raw_request(hub.url, "POST", "/api/validate-yaml", payload, {"Content-Type": "application/json"})
    assert status == 200 and json.loads(body) == {"errors": [], "warnings": []}
