"""Issue 27: what the loader takes from the local machine it does not own.

- The private import copy: only its last directory was checked, so a group- or world-writable parent of
  `$WINATTN_CACHE` let someone else swap `imports/` after the copy was made. Now every ancestor must be owned by this
  user or root and not writable by others unless sticky (as /tmp), or the load is refused.
- Offline, `revision=` was used as a path under the cache's `refs/` (any file could be read as a ref) and the ref's
  content as a path under `snapshots/`. Now the revision must be a ref name or a commit id before it is used, the ref is
  read without following a link, and its content must be a commit id.
- A vendored directory is written by whoever vendored it, and anyone who can write it can replace its lock with that
  of an older signed build: `winattn.load(vendored=..., lock_sha256=...)` pins the lock from outside the directory
  (the sha256 `winattn vendor` prints), and `revision=<commit>` the commit the lock names.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from ._loader_support import REPO, hf_cache, hub, make_build, offline, publish_build  # noqa: F401  (fixtures)


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_parent_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    from winattn import importer
    from winattn.errors import WinattnError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("WINATTN_CACHE", str(shared / "me" / "winattn"))
    with pytest.raises(WinattnError, match=f"{shared}, a parent of winattn's private import directory .* is "
                                           "writable by others"):
        importer.private_copy_dir("variant")
    assert not list((shared / "me" / "winattn" / "imports").glob("p*"))


def test_a_sticky_parent_is_accepted(tmp_path, monkeypatch):
    from winattn import importer

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    monkeypatch.setenv("WINATTN_CACHE", str(shared / "winattn"))
    copy = importer.private_copy_dir("variant")
    assert copy.is_dir()
    importer.discard(copy)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_a_parent_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    from winattn import importer
    from winattn.errors import WinattnError

    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 65534, -1)
    monkeypatch.setenv("WINATTN_CACHE", str(other / "winattn"))
    with pytest.raises(WinattnError, match="owned by uid 65534"):
        importer.private_copy_dir("variant")


@pytest.mark.parametrize("revision", ["../../../../../../../etc/hostname", "refs/../../x", "/etc/hostname", "a\x1bb"])
def test_offline_revision_is_checked_before_it_becomes_a_path(hf_cache, offline, revision):
    import winattn

    offline()
    with pytest.raises(ValueError, match="revision must be a branch, tag or 40-hex commit id"):
        winattn.load(REPO, revision=revision)


@pytest.mark.parametrize("content", ["../../../../outside", "not a commit", ""])
def test_offline_ref_file_must_hold_a_commit_id(hf_cache, offline, content):
    import winattn
    from winattn.errors import RemoteValueError

    refs = hf_cache / "kernels--winattn--window-attention" / "refs"
    refs.mkdir(parents=True)
    (refs / "v1").write_text(content)
    offline()
    with pytest.raises(RemoteValueError, match="as a commit id"):
        winattn.load(REPO, revision="v1")


def test_offline_ref_file_is_not_read_through_a_link(hf_cache, offline, tmp_path):
    import winattn
    from winattn.errors import RemoteValueError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("a" * 40)
    refs = hf_cache / "kernels--winattn--window-attention" / "refs"
    refs.mkdir(parents=True)
    os.symlink(elsewhere, refs / "main")
    offline()
    with pytest.raises(RemoteValueError, match="resolves to .*elsewhere, outside .*refs"):
        winattn.load(REPO, revision="main")


# ----------------------------------------------------------------------------------------------------------------------
# The vendor lock, pinned from outside


def _lock_sha256(directory) -> str:
    return hashlib.sha256((directory / "window-attention.lock").read_bytes()).hexdigest()


@pytest.fixture
def vendored_twice(hub, hf_cache, make_build, tmp_path):
    """The same build published twice (commits old, new) and vendored from each: (old dir, new dir, commits)."""
    from winattn.vendor import vendor

    old_commit = publish_build(hub, make_build())
    old = vendor(REPO, version=1, out_dir=tmp_path / "old", endpoint=hub.url)
    new_commit = _republish(hub)
    new = vendor(REPO, version=1, out_dir=tmp_path / "new", endpoint=hub.url)
    return old, new, old_commit, new_commit


def _republish(hub) -> str:
    """A new commit on v1 that leaves the variant as it was (a NOTES.md beside it)."""
    from ._loader_support import push

    return push(hub, REPO, {"NOTES.md": b"a later publication\n"})


def test_a_pinned_lock_refuses_a_swapped_directory(vendored_twice, tmp_path):
    import winattn
    from winattn.errors import VerificationError

    old, new, old_commit, new_commit = vendored_twice
    pinned = _lock_sha256(new)
    assert winattn.load(REPO, vendored=new, lock_sha256=pinned).__winattn_info__.commit == new_commit
    # the directory's writer puts the older vendored build back, with its own (valid) lock
    shutil.rmtree(new)
    shutil.copytree(old, new)
    assert winattn.load(REPO, vendored=new).__winattn_info__.commit == old_commit  # unpinned: the documented window
    with pytest.raises(VerificationError, match="not the pinned .* \\(lock_sha256=\\)"):
        winattn.load(REPO, vendored=new, lock_sha256=pinned)
    with pytest.raises(VerificationError, match=f"the lock pins commit {old_commit}, not revision {new_commit}"):
        winattn.load(REPO, vendored=new, revision=new_commit)


def test_winattn_vendor_prints_the_lock_sha256(hub, hf_cache, make_build, tmp_path, capsys):
    from winattn.cli import main

    publish_build(hub, make_build())
    assert main(["vendor", "--local-dir", str(tmp_path / "v"), "--endpoint", hub.url]) == 0
    assert f"lock sha256 {_lock_sha256(tmp_path / 'v')}" in capsys.readouterr().out


def test_lock_sha256_needs_a_vendored_directory():
    import winattn

    with pytest.raises(ValueError, match="lock_sha256= pins the lock of a vendored directory"):
        winattn.load(REPO, lock_sha256="0" * 64)


def test_offline_version_ref_is_not_read_through_a_link(hf_cache, offline, tmp_path):
    """Audit 3: `version=N` offline read `refs/v<N>` through kernels' `_get_available_versions_from_cache`, which
    follows links and reads the whole file: a cache writer's link to any file the victim can read (a secret,
    /proc/self/environ) got it read, and its first bytes quoted in the error. Now it is read as `revision=` is."""
    import winattn
    from winattn.errors import RemoteValueError

    secret = tmp_path / "secret"
    secret.write_text("HF_TOKEN=hf_victims_secret_token\n")
    refs = hf_cache / "kernels--winattn--window-attention" / "refs"
    refs.mkdir(parents=True)
    os.symlink(secret, refs / "v1")
    offline()
    with pytest.raises(RemoteValueError, match="resolves to .*secret, outside .*refs") as e:
        winattn.load(REPO, version=1)
    assert "victims_secret" not in str(e.value)


def test_offline_version_ref_must_hold_a_commit_id(hf_cache, offline):
    import winattn
    from winattn.errors import OfflineError, RemoteValueError

    refs = hf_cache / "kernels--winattn--window-attention" / "refs"
    refs.mkdir(parents=True)
    (refs / "v1").write_text("../../../../outside")
    offline()
    with pytest.raises(RemoteValueError, match="as a commit id"):
        winattn.load(REPO, version=1)
    with pytest.raises(OfflineError, match="version 2 of 'winattn/window-attention' is not in the local cache"):
        winattn.load(REPO, version=2)
