"""Shared pieces of the Hub security tests (tests/security/test_hub_*.py).

The `hub` / `api` fixtures are the Hub tests' own (tests/hub/conftest.py, re-exported here): a real HubServer over
`tmp_path/"store"` with token TOKEN, and the real huggingface_hub client pointed at it. An attacker here holds that
valid token. `forge_sentinel` plants, next to the store root, a directory that looks like a repo (meta.json,
refs.json, a commit whose file points at a secret outside the store), so that any traversal that reaches it reads
or writes something visible; `outside_state` snapshots everything next to the root, so a test can assert that no
request changed, created or deleted anything outside it.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from hub.conftest import TOKEN, api, hub, ndjson, raw_request  # noqa: F401  (fixtures and helpers re-exported)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
MARKER = "SENTINEL-OUTSIDE-THE-ROOT"
SECRET = b"secret bytes outside the hub root\n"
FORGED_COMMIT = "5e" * 20
# Reached from <root>/repos/<type>/<ns>/<name>: each (ns, name) below resolves to <root>/../sentinel once the URL
# segment is percent-decoded (the defect: decoding after splitting the path on "/").
TRAVERSALS = [
    ("..%2F..%2F..", "sentinel"),
    ("%2E%2E%2F%2E%2E%2F%2E%2E", "sentinel"),
    ("acme", "..%2F..%2F..%2F..%2Fsentinel"),
]
REPO_KINDS = [("models", ""), ("kernels", "kernels/")]  # (API plural, file-URL prefix)


def forge_sentinel(base: Path) -> Path:
    """`base/sentinel`: a fake repo outside the store. Its commit's only file names a blob id that, joined by
    the store's blob layout (<root>/blobs/<id[:2]>/<id>), is `base/sentinel/secret.txt`."""
    s = base / "sentinel"
    (s / "commits").mkdir(parents=True)
    (s / "meta.json").write_text(json.dumps({"private": False, "createdAt": MARKER}))
    (s / "refs.json").write_text(
        json.dumps({"branches": {"main": FORGED_COMMIT, "dev": FORGED_COMMIT}, "tags": {"v1": FORGED_COMMIT}})
    )
    commit = {
        "parent": None,
        "files": {"secret.txt": {"sha256": "../sentinel/secret.txt", "size": len(SECRET), "oid": "0" * 40}},
        "message": MARKER,
        "description": "",
        "author": "attacker",
        "date": "2026-01-01T00:00:00.000Z",
    }
    (s / "commits" / f"{FORGED_COMMIT}.json").write_text(json.dumps(commit))
    (s / "secret.txt").write_bytes(SECRET)
    return s


def populate(api, hub) -> Path:
    """Real repos acme/real (model and kernel), so that `<root>/repos/<type>/acme/` exists as on any store in use
    (the OS walks `..` only through existing directories), plus the sentinel next to the root; returns it."""
    api.create_repo("acme/real")
    api.create_repo("acme/real", repo_type="kernel")
    return forge_sentinel(hub.root.parent)


def tree_state(base: Path, skip=()) -> dict:
    """Every path under `base` (but `skip` subtrees) -> file bytes, link target or "<dir>"."""
    out = {}
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base)
        if rel.parts and rel.parts[0] in skip:
            continue
        if p.is_symlink():
            out[str(rel)] = ("link", str(p.readlink()))
        elif p.is_dir():
            out[str(rel)] = "<dir>"
        else:
            out[str(rel)] = p.read_bytes()
    return out


def outside_state(hub) -> dict:
    """Everything next to the store root (the client's cache excluded): what a traversal could change."""
    return tree_state(hub.root.parent, skip=(hub.root.name, "hf-home"))


def assert_no_leak(status: int, body: bytes, what: str) -> None:
    assert status in (400, 404), (what, status, body[:200])
    assert MARKER.encode() not in body and SECRET not in body and FORGED_COMMIT.encode() not in body, what


def raw_exchange(url: str, request: bytes, *, wait: float = 3.0) -> tuple[bytes, float]:
    """Send raw bytes and keep the connection open; (what came back before the server closed or `wait` seconds
    passed, seconds until the first byte of the answer, or inf if none came)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.settimeout(0.2)
    start, first, data = time.monotonic(), float("inf"), b""
    try:
        sock.sendall(request)
        while time.monotonic() - start < wait:
            try:
                piece = sock.recv(65536)
            except socket.timeout:
                continue
            if not piece:
                break
            if first == float("inf"):
                first = time.monotonic() - start
            data += piece
    finally:
        sock.close()
    return data, first
