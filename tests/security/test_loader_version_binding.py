"""Issue 27: the version a signature names is checked for every way of asking for a build.

The attacker holds a Hub token (not the key) and moves a genuinely signed build of another version (v2, or an old v0)
onto branch `v1`. On the loader after issue 13 only `version=1` refused it: `revision="v1"`, `"refs/heads/v1"` or the
commit id loaded it, even with `require_signature=True`. Now a branch `v<N>` means version N however it is spelled,
and a commit id (or another ref) loads only a build signed for the version the caller names with `version=` (default
1).
"""

from __future__ import annotations

import json

import pytest

from ._loader_support import TOKEN, hf_cache, hub, keys, make_build, push, variant_files  # noqa: F401

REPO = "winattn/sig-version"


def _signed(keys) -> dict:
    return dict(public_keys=[keys["good"][1]], require_signature=True)


def _signed_for(make_build, keys, version: int):
    """The real build, its metadata.json saying `version`, signed for REPO (what a publisher of that version has)."""
    from winattn.signing import sign_variant

    b = make_build()
    meta = b.variant_dir / "metadata.json"
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), version=version), indent=2))
    sign_variant(b.variant_dir, keys["good"][0], repo_id=REPO)
    return b


@pytest.fixture
def commits(hub, hf_cache, make_build, keys):
    """Branch v1 of REPO holds a genuine v1 build; then the token holder pushes a v2- or v0-signed build onto it."""
    return {"v1": push(hub, REPO, variant_files(_signed_for(make_build, keys, 1))),
            **{f"v{n}-on-v1": push(hub, REPO, variant_files(_signed_for(make_build, keys, n))) for n in (2, 0)}}


def _point_v1_at(hub, commit: str) -> None:
    """Move branch v1 to `commit` (what a token holder can do)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=TOKEN)
    api.delete_branch(REPO, branch="v1", repo_type="kernel")
    api.create_branch(REPO, branch="v1", revision=commit, repo_type="kernel")


@pytest.mark.parametrize("signed", [2, 0])
@pytest.mark.parametrize("asked", ["v1", "refs/heads/v1", "commit"])
def test_build_signed_for_another_version_is_refused_however_v1_is_asked_for(hub, keys, commits, signed, asked):
    import winattn
    from winattn.errors import VerificationError

    commit = commits[f"v{signed}-on-v1"]
    _point_v1_at(hub, commit)
    revision = commit if asked == "commit" else asked
    with pytest.raises(VerificationError, match="signed for another version") as e:
        winattn.load(REPO, revision=revision, endpoint=hub.url, **_signed(keys))
    assert f"signed for version {signed}, not the requested version 1" in str(e.value)


def test_a_commit_id_loads_the_version_the_caller_names(hub, keys, commits):
    """`version=` with `revision=<commit>` says which version that commit must be signed for."""
    import winattn
    from winattn.errors import VerificationError

    with pytest.raises(VerificationError, match="not the requested version 1"):
        winattn.load(REPO, revision=commits["v2-on-v1"], endpoint=hub.url, **_signed(keys))
    module = winattn.load(REPO, revision=commits["v2-on-v1"], version=2, endpoint=hub.url, **_signed(keys))
    assert module.__winattn_info__.statement["version"] == 2
    with pytest.raises(ValueError, match="branch of version 1, not version 2"):
        winattn.load(REPO, revision="v1", version=2, endpoint=hub.url, **_signed(keys))


@pytest.mark.parametrize("asked", ["v1", "refs/heads/v1", "commit"])
def test_the_genuine_v1_build_loads_however_it_is_asked_for(hub, keys, commits, asked):
    import winattn

    _point_v1_at(hub, commits["v1"])
    revision = commits["v1"] if asked == "commit" else asked
    info = winattn.load(REPO, revision=revision, endpoint=hub.url, **_signed(keys)).__winattn_info__
    assert info.statement["version"] == 1 and info.commit == commits["v1"]
