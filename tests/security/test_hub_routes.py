"""A Hub token holder stays inside `--root` on every route, and bad bytes in a request are a 400 (issue 13, items 8-9).

Each traversal test plants a fake repo next to the store root (`forge_sentinel`), sends the request with every
encoding of `..`/`/` in TRAVERSALS, for model and kernel repos, with a valid token, and asserts: the answer is a
400/404 that leaks nothing of the sentinel, and nothing next to the root changed (created, rewritten or deleted).
On the original code each of these requests read or changed the sentinel: the namespace and name were
percent-decoded after the path was split and only `create_repo` validated them.
"""

from __future__ import annotations

import base64
import json

import pytest
from huggingface_hub.errors import BadRequestError

from ._hub_support import (  # noqa: F401  (fixtures)
    AUTH,
    FORGED_COMMIT,
    REPO_KINDS,
    TRAVERSALS,
    api,
    assert_no_leak,
    forge_sentinel,
    populate,
    hub,
    ndjson,
    outside_state,
    raw_exchange,
    raw_request,
    tree_state,
)

_COMMIT = ndjson(
    {"key": "header", "value": {"summary": "evil"}},
    {"key": "file", "value": {"path": "pwned.txt", "content": base64.b64encode(b"pwned").decode()}},
)
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}

# (method, path under /api/{t}/{ns}/{name} or a resolve URL, body, extra headers). `{t}`, `{p}`, `{ns}`, `{name}`
# are filled per repo kind and traversal.
URL_ROUTES = {
    "info": ("GET", "/api/{t}/{ns}/{name}", None, {}),
    "revision": ("GET", "/api/{t}/{ns}/{name}/revision/main", None, {}),
    "refs": ("GET", "/api/{t}/{ns}/{name}/refs", None, {}),
    "tree": ("GET", "/api/{t}/{ns}/{name}/tree/main", None, {}),
    "tree-commit": ("GET", f"/api/{{t}}/{{ns}}/{{name}}/tree/{FORGED_COMMIT}?recursive=true", None, {}),
    "commits": ("GET", "/api/{t}/{ns}/{name}/commits/main", None, {}),
    "paths-info": ("POST", "/api/{t}/{ns}/{name}/paths-info/main", b"paths=secret.txt", _FORM),
    "resolve-get": ("GET", f"/{{p}}{{ns}}/{{name}}/resolve/{FORGED_COMMIT}/secret.txt", None, {}),
    "resolve-head": ("HEAD", "/{p}{ns}/{name}/resolve/main/secret.txt", None, {}),
    "settings": ("PUT", "/api/{t}/{ns}/{name}/settings", b'{"private": true}', {}),
    "branch-create": ("POST", "/api/{t}/{ns}/{name}/branch/evil", b"{}", {}),
    "branch-delete": ("DELETE", "/api/{t}/{ns}/{name}/branch/dev", None, {}),
    "tag-create": ("POST", "/api/{t}/{ns}/{name}/tag/main", b'{"tag": "evil"}', {}),
    "tag-delete": ("DELETE", "/api/{t}/{ns}/{name}/tag/v1", None, {}),
    "preupload": ("POST", "/api/{t}/{ns}/{name}/preupload/main", b'{"files": [{"path": "secret.txt"}]}', {}),
    "commit": ("POST", "/api/{t}/{ns}/{name}/commit/main", _COMMIT, {"Content-Type": "application/x-ndjson"}),
}


@pytest.mark.parametrize("route", sorted(URL_ROUTES))
def test_url_traversal_stays_inside_the_root(hub, api, route):
    populate(api, hub)
    before = outside_state(hub)
    method, template, body, headers = URL_ROUTES[route]
    for t, p in REPO_KINDS:
        for ns, name in TRAVERSALS:
            path = template.format(t=t, p=p, ns=ns, name=name)
            status, _, resp = raw_request(hub.url, method, path, body, {**AUTH, **headers})
            assert_no_leak(status, resp, f"{method} {path}")
            assert outside_state(hub) == before, f"{method} {path} changed files outside the root"


@pytest.mark.parametrize(
    "target",
    [
        {"organization": "../../..", "name": "sentinel"},
        {"name": "../../../sentinel"},
        {"organization": "../../..", "name": "sentinel", "type": "kernel"},
        {"organization": "acme", "name": "../../../../sentinel"},
    ],
)
def test_delete_repo_stays_inside_the_root(hub, api, target):
    """The original deleted the sentinel directory (and created `<root>/../sentinel.lock` while locking it)."""
    populate(api, hub)
    before = outside_state(hub)
    status, _, resp = raw_request(hub.url, "DELETE", "/api/repos/delete", json.dumps(target).encode(), AUTH)
    assert_no_leak(status, resp, target)
    assert outside_state(hub) == before


def test_create_repo_stays_inside_the_root(hub, api):
    """Coverage of the last route with a repo id (create validated its names already before issue 13)."""
    populate(api, hub)
    before = outside_state(hub)
    for target in (
        {"organization": "../../..", "name": "evil"},
        {"name": "../../../evil"},
        {"organization": "acme", "name": "evil", "type": "../../../x"},
    ):
        status, _, resp = raw_request(hub.url, "POST", "/api/repos/create", json.dumps(target).encode(), AUTH)
        assert status == 400, (target, status, resp)
        assert outside_state(hub) == before


def test_org_overview_does_not_probe_outside_the_root(hub, api):
    """The original answered 200 for a namespace that resolves to an existing directory outside the root (and 404
    for a missing one): an existence oracle for the server's file system."""
    populate(api, hub)
    for ns in ("..%2F..%2F..%2Fsentinel", "%2E%2E%2F%2E%2E%2F%2E%2E%2Fsentinel"):
        status, _, resp = raw_request(hub.url, "GET", f"/api/organizations/{ns}/overview", None, AUTH)
        assert_no_leak(status, resp, ns)


def test_writes_to_a_missing_repo_touch_nothing(hub, api):
    """No directory or lock file appears in the store for a repo that does not exist (the original's delete made
    `locks/model/acme/missing.lock` before looking)."""
    api.create_repo("acme/present")
    before = tree_state(hub.root)
    requests = [
        ("DELETE", "/api/repos/delete", json.dumps({"organization": "acme", "name": "missing"}).encode()),
        ("DELETE", "/api/repos/delete", json.dumps({"organization": "nobody", "name": "missing"}).encode()),
        ("PUT", "/api/models/acme/missing/settings", b'{"private": true}'),
        ("POST", "/api/models/acme/missing/branch/dev", b"{}"),
        ("POST", "/api/models/acme/missing/commit/main", _COMMIT),
    ]
    for method, path, body in requests:
        status, headers, _ = raw_request(hub.url, method, path, body, AUTH)
        assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound"), (method, path)
        assert tree_state(hub.root) == before, (method, path)


def test_repo_dir_resolving_outside_the_root_is_refused(hub, api):
    """A symlink planted inside the store (by whoever can write there) does not lead requests outside it."""
    sentinel = forge_sentinel(hub.root.parent)
    ns_dir = hub.root / "repos" / "model" / "linked"
    ns_dir.mkdir(parents=True)
    (ns_dir / "repo").symlink_to(sentinel, target_is_directory=True)
    before = outside_state(hub)
    for method, path in (("GET", "/api/models/linked/repo"), ("DELETE", "/api/models/linked/repo/branch/dev")):
        status, _, resp = raw_request(hub.url, method, path, None, AUTH)
        assert_no_leak(status, resp, path)
    status, _, resp = raw_request(
        hub.url, "DELETE", "/api/repos/delete", json.dumps({"organization": "linked", "name": "repo"}).encode(), AUTH
    )
    assert_no_leak(status, resp, "delete")
    assert outside_state(hub) == before


# -- NUL and control characters: 400, never 500, never in a header


@pytest.fixture
def repo(api):
    api.create_repo("acme/data")
    api.upload_file(path_or_fileobj=b"a", path_in_repo="a.txt", repo_id="acme/data")
    return "acme/data"


BAD_CHARS = ["%00", "%01", "%0A", "%0D%0A", "%1F", "%7F"]
BAD_CHAR_ROUTES = [
    ("GET", "/api/models/ac{c}me/data"),
    ("GET", "/api/models/acme/da{c}ta/refs"),
    ("GET", "/ac{c}me/data/resolve/main/a.txt"),
    ("GET", "/api/organizations/ac{c}me/overview"),
    ("GET", "/api/models/acme/data/revision/ma{c}in"),
    ("GET", "/api/models/acme/data/tree/ma{c}in"),
    ("HEAD", "/acme/data/resolve/ma{c}in/a.txt"),
    ("POST", "/api/models/acme/data/paths-info/ma{c}in"),
    ("POST", "/api/models/acme/data/preupload/ma{c}in"),
    ("POST", "/api/models/acme/data/commit/ma{c}in"),
    ("DELETE", "/api/models/acme/data/branch/ma{c}in"),
    ("DELETE", "/api/models/acme/data/tag/v{c}1"),
    ("PUT", "/api/models/ac{c}me/data/settings"),
]


@pytest.mark.parametrize("method,template", BAD_CHAR_ROUTES, ids=[t for _, t in BAD_CHAR_ROUTES])
def test_control_characters_are_400(hub, repo, method, template):
    """The original answered NUL in a namespace with a 500 (traceback in the log) and a NUL or newline elsewhere
    with 404s whose X-Error-Message carried the NUL; a `\\n` at the end of a name even passed its validation."""
    bodies = {"POST": b"{}", "PUT": b"{}"}
    if "commit" in template:
        bodies["POST"] = _COMMIT
    if "preupload" in template:
        bodies["POST"] = b'{"files": []}'
    for c in BAD_CHARS:
        path = template.format(c=c)
        status, headers, resp = raw_request(hub.url, method, path, bodies.get(method), AUTH)
        assert (status, headers["X-Error-Code"]) == (400, "BadRequest"), (method, path, status)
        assert b"Traceback" not in resp


def test_json_body_control_characters_are_400(hub, repo):
    for method, path, body in (
        ("POST", "/api/repos/create", {"organization": "ac\x00me", "name": "x"}),
        ("POST", "/api/repos/create", {"organization": "acme", "name": "x\n"}),
        ("DELETE", "/api/repos/delete", {"organization": "ac\x00me", "name": "data"}),
        ("DELETE", "/api/repos/delete", {"organization": "acme", "name": "data\n"}),
        ("POST", "/api/models/acme/data/branch/dev", {"startingPoint": "ma\x00in"}),
        ("POST", "/api/models/acme/data/tag/main", {"tag": "v1\n"}),
    ):
        status, headers, _ = raw_request(hub.url, method, path, json.dumps(body).encode(), AUTH)
        assert (status, headers["X-Error-Code"]) == (400, "BadRequest"), (method, path, body)


def _header_block(answer: bytes) -> bytes:
    head, sep, _ = answer.partition(b"\r\n\r\n")
    assert sep, answer[:200]
    return head


@pytest.mark.parametrize("rev", ["ma%00in", "ma%0D%0AX-Injected:%201", "ma%0Ain", "m%C3%A4in%01"])
def test_revision_bytes_never_reach_a_response_header(hub, repo, rev):
    """The original echoed a NUL of the revision into X-Error-Message (h11-based clients then refuse the answer)."""
    for path in (f"/api/models/acme/data/revision/{rev}", f"/acme/data/resolve/{rev}/a.txt"):
        answer, _ = raw_exchange(hub.url, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        head = _header_block(answer)
        assert head.startswith(b"HTTP/1.1 400 "), head
        lines = head.split(b"\r\n")
        assert all(0x20 <= b <= 0x7E for line in lines for b in line), head
        assert not any(line.lower().startswith(b"x-injected") for line in lines)


def test_real_client_gets_a_bad_request_error_for_a_nul_revision(api, repo):
    """huggingface_hub raises its own typed error, not a protocol error about an illegal header value."""
    with pytest.raises(BadRequestError):
        list(api.list_repo_tree(repo, revision="ma\x00in"))
    with pytest.raises(BadRequestError):
        api.repo_info(repo, revision="ma\x00in")
