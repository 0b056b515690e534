"""Issue 27, "remote words as paths": what a Hub says is data, never a path, and a lying Hub is refused in bounded time.

The attacker is the Hub (or anyone in the path of a plain-HTTP `HF_ENDPOINT`): `HostileHub` forwards to a real
embedded Hub holding a real signed publication and rewrites its answers. On the original loader the commit id a Hub
answered with was never checked to be a commit id, and huggingface_hub builds cache paths from the Hub's headers
(`X-Repo-Commit`, `ETag`), so `winattn.load(..., require_signature=True)` wrote a file of the Hub's choosing, with
content of its choosing, outside the cache before any verification (a `.pth` in site-packages runs at the next Python
start). Now every commit id, ref, file name, size and ETag is checked before use (`winattn.untrusted`, on the wire by
`winattn.hub_guard`), each refusal is a `RemoteValueError`, and nothing appears outside the cache.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from ._hostile_hub import HostileHub, Recorder, all_paths, new_paths
from ._loader_support import REPO, hf_cache, hub, keys, make_build, publish_build  # noqa: F401  (fixtures)


@pytest.fixture
def published(hub, hf_cache, make_build, keys):
    """A signed publication of the real CPU build on the real Hub: (build, commit)."""
    b = make_build()
    return b, publish_build(hub, b, signing_key=keys["good"][0])


def _load(url, keys, **kwargs):
    import winattn

    return winattn.load(REPO, endpoint=url, public_keys=[keys["good"][1]], require_signature=True, **kwargs)


def _outside(tmp_path, before: set) -> list:
    """What appeared under tmp_path outside the HF cache, winattn's cache and the Hub's store."""
    allowed = [str(tmp_path / d) for d in ("hf-home", "winattn-cache", "hub-root")]
    return [p for p in new_paths(before, tmp_path) if not any(p == a or p.startswith(a + "/") for a in allowed)]


# Relative to <cache>/kernels--winattn--window-attention/{snapshots,blobs}/: four levels up is tmp_path.
CLIMB = "../../../../outside-pwn"


def _lie_commit(ans):
    if ans.path.endswith("/refs") and ans.status == 200:
        refs = ans.json()
        for ref in refs.get("branches", []) + refs.get("tags", []):
            ref["targetCommit"] = CLIMB
        ans.set_json(refs)


@pytest.mark.parametrize("asked", [{"version": 1}, {"revision": "v1"}, {"revision": "refs/heads/v1"}], ids=str)
def test_path_like_commit_id_is_refused_before_anything_is_written(published, hub, keys, tmp_path, asked):
    from winattn.errors import RemoteValueError

    _, commit = published
    before = all_paths(tmp_path)
    with HostileHub(hub.url) as evil:
        evil.lie(_lie_commit)
        evil.rewrite_request(lambda path: path.replace(quote(CLIMB, safe=""), commit))  # serves the forged id
        with pytest.raises(RemoteValueError, match="as a commit id; a commit id is 40 lowercase hex digits"):
            _load(evil.url, keys, **asked)
    assert _outside(tmp_path, before) == []
    assert not any("/resolve/" in path or "/tree/" in path for _, path in evil.requests), "the forged id was used"


@pytest.mark.parametrize("header", ["ETag", "X-Linked-Etag", "X-Repo-Commit"])
def test_path_like_etag_or_commit_header_writes_nothing_outside_the_cache(published, hub, keys, tmp_path, header):
    """huggingface_hub names the blob file after the ETag and the snapshot directory after X-Repo-Commit."""
    from winattn.errors import RemoteValueError

    def lie(ans):
        if "/resolve/" in ans.path and ans.path.endswith("/metadata.json"):
            ans.set_header(header, f'"{CLIMB}.pth"' if header != "X-Repo-Commit" else CLIMB)

    before = all_paths(tmp_path)
    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match=f"\\({header}\\) gave"):
            _load(evil.url, keys)
    assert _outside(tmp_path, before) == []


def test_x_repo_commit_of_another_commit_is_refused(published, hub, keys, tmp_path):
    """A valid-looking commit id, but not the one pinned: the files would land in another commit's snapshot."""
    from winattn.errors import RemoteValueError

    def lie(ans):
        if "/resolve/" in ans.path:
            ans.set_header("X-Repo-Commit", "0" * 40)

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="this download is of commit"):
            _load(evil.url, keys)
    assert not list((tmp_path / "hf-home").glob("hub/*/snapshots/" + "0" * 40))


@pytest.mark.parametrize("name", ["../../../../outside-pwn.py", "/etc/outside-pwn.py", "a\x1b[31m.py", "a/./b.py"])
def test_file_names_that_leave_the_variant_are_refused(published, hub, keys, tmp_path, name):
    from winattn.errors import RemoteValueError

    build, _ = published

    def lie(ans):
        if "/tree/" in ans.path and ans.status == 200:
            entries = ans.json()
            entries.append({"type": "file", "oid": "1" * 40, "size": 1, "path": f"build/{build.variant}/{name}"})
            ans.set_json(entries)

    before = all_paths(tmp_path)
    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="as a file name"):
            _load(evil.url, keys)
    assert _outside(tmp_path, before) == []


def test_a_listed_size_that_disagrees_with_the_download_is_refused(published, hub, keys):
    from winattn.errors import RemoteValueError

    build, _ = published

    def lie(ans):
        if "/tree/" in ans.path and ans.status == 200:
            entries = ans.json()
            for e in entries:
                if e.get("path", "").endswith(build.so_name):
                    e["size"] = 10
            ans.set_json(entries)

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="the file listing declared 10 bytes for this file"):
            _load(evil.url, keys)


def test_a_listing_over_the_size_limit_is_refused_before_any_file_is_downloaded(published, hub, keys, monkeypatch):
    from winattn.errors import VerificationError

    build, _ = published
    monkeypatch.setenv("WINATTN_MAX_VARIANT_BYTES", str(1 << 30))

    def lie(ans):
        if "/tree/" in ans.path and ans.status == 200:
            entries = ans.json()
            for e in entries:
                if e.get("path", "").endswith(build.so_name):
                    e["size"] = 1 << 40
            ans.set_json(entries)

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(VerificationError, match="at most 1073741824 bytes|more than the limit"):
            _load(evil.url, keys)
    assert not [p for m, p in evil.requests if "/resolve/" in p and m == "GET"], "a file was downloaded"


def test_a_body_longer_than_declared_is_cut_off(published, hub, keys):
    """The .so answered without Content-Length, closed by the server after far more bytes than listed."""
    from winattn.errors import RemoteValueError

    build, _ = published

    def lie(ans):
        if ans.method == "GET" and ans.path.endswith(build.so_name):
            ans.body += b"\0" * (4 << 20)
            ans.headers = [(k, v) for k, v in ans.headers if k.lower() != "content-length"]
            ans.close_delimited = True

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="as a body; .* bytes were declared for it"):
            _load(evil.url, keys)


def test_a_redirect_off_the_hub_over_plain_http_is_not_followed(published, hub, keys):
    from winattn.errors import RemoteValueError

    build, _ = published
    with Recorder() as other, HostileHub(hub.url) as evil:
        size = (build.variant_dir / build.so_name).stat().st_size

        def lie(ans):  # as the real Hub sends a file to its CDN: a 302 that carries the ETag and the size
            if ans.path.endswith(build.so_name):
                ans.status = 302
                ans.set_header("Location", f"{other.url}/stolen/{build.so_name}")
                ans.set_header("X-Linked-Size", str(size))
                ans.body = b""
                ans.headers = [(k, v) for k, v in ans.headers if k.lower() != "content-length"]

        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="a redirect leaves the Hub only for https"):
            _load(evil.url, keys)
    assert other.requests == [], "the loader followed the Hub's redirect to another server"


def test_a_trickled_body_is_cut_off_in_bounded_time(published, hub, keys, monkeypatch):
    """A body that keeps every read just under the client's timeout would hold the load for hours; it is cut once a
    time window brings too few bytes (the window is shortened here: 1 s, 4 KiB)."""
    from winattn import hub_guard
    from winattn.errors import DownloadError

    build, _ = published
    monkeypatch.setattr(hub_guard, "WINDOW_SECONDS", 1.0)
    monkeypatch.setattr(hub_guard, "MIN_BYTES_PER_WINDOW", 4096)

    def lie(ans):
        if ans.method == "GET" and ans.path.endswith(build.so_name):
            ans.trickle = (64, 0.1, 8.0)  # 640 B/s, for at most 8 s per attempt

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        start = time.monotonic()
        with pytest.raises(DownloadError, match="less than 4096 per 1 s: cut off"):
            _load(evil.url, keys)
    assert time.monotonic() - start < 6


def test_an_honest_hub_behind_the_proxy_still_loads(published, hub, keys):
    """The fixture itself: with no lie, the same load passes every check."""
    with HostileHub(hub.url) as evil:
        module = _load(evil.url, keys)
    info = module.__winattn_info__
    assert info.commit == published[1]
    assert {c.name: c.status for c in info.checks}["signature"] == "pass"


def test_a_deeply_nested_json_answer_is_refused_before_it_is_parsed(published, hub, keys):
    """huggingface_hub's `json.loads` of a Hub answer nested thousands of levels deep raised RecursionError."""
    from winattn.errors import RemoteValueError

    def lie(ans):
        if ans.path.endswith("/refs") and ans.status == 200:
            ans.body = b'{"branches": ' + b"[" * 5000 + b"]" * 5000 + b"}"

    with HostileHub(hub.url) as evil:
        evil.lie(lie)
        with pytest.raises(RemoteValueError, match="nests deeper than 64 levels"):
            _load(evil.url, keys)
