"""Issue 27, "remote words as paths": the rules every word from outside must meet, and a vendor lock's words.

The loader-level attacks (a lying Hub, forged ref files) are in test_loader_hostile_hub.py and
test_loader_local_trust.py; this file pins the rules themselves (`winattn.untrusted`), so that a change to them is
seen here and not only through one attack, and covers the vendor lock's variant names. A vendored directory is
written by whoever a deployment lets write it; on the original code `winattn vendor` into such a directory removed
every directory its old lock named, `../<anything>` included (`shutil.rmtree(out_dir / name)`).
"""

from __future__ import annotations

import json
import os

import pytest

from ._loader_support import REPO, hf_cache, hub, make_build, publish_build  # noqa: F401  (fixtures)

GOOD_REFS = ["v1", "main", "refs/heads/v1", "refs/pr/1", "release-1.0", "a.b/c_d", "ä"]
# One line per rule of `git check-ref-format --allow-onelevel` (plus printable-only and a length bound).
BAD_REFS = ["", "..", "a/../b", "a..b", "/x", "x/", "a//b", ".x", "a/.x", "x.lock", "a/x.lock/b", "x.", "@", "a@{1}",
            "a b", "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b", "a\x7f", "a\x1b[2J", "a\u202eb", "a" * 256]


@pytest.mark.parametrize("value", GOOD_REFS)
def test_ref_names_that_git_accepts_are_accepted(value):
    from winattn.untrusted import is_ref_name, is_revision

    assert is_ref_name(value) and is_revision(value)


@pytest.mark.parametrize("value", BAD_REFS, ids=repr)
def test_ref_names_that_git_refuses_are_refused(value):
    from winattn.errors import RemoteValueError
    from winattn.untrusted import is_ref_name, ref_name

    assert not is_ref_name(value)
    with pytest.raises(RemoteValueError, match="as a ref name"):
        ref_name(value, source="a test")


@pytest.mark.parametrize("value", ["0" * 39, "0" * 41, "A" * 40, "g" * 40, "../" + "0" * 37, 40, None])
def test_a_commit_id_is_exactly_40_lowercase_hex(value):
    from winattn.errors import RemoteValueError
    from winattn.untrusted import commit_id, is_commit

    assert is_commit("0123456789abcdef" * 2 + "01234567")
    assert not is_commit(value)
    with pytest.raises(RemoteValueError, match="as a commit id"):
        commit_id(value, source="a test")


@pytest.mark.parametrize("value", ["../x", "a/../../x", "/etc/passwd", "a\\b", "a//b", "a/./b", "./a", "a/",
                                   "a\x00b", "a\nb", "a\u202eb", "", "a" * 1025, "a/" + "b" * 256])
def test_a_file_name_is_a_relative_path_inside_its_root(value):
    from winattn.errors import RemoteValueError
    from winattn.untrusted import path_problem, repo_path

    assert path_problem(value) is not None
    with pytest.raises(RemoteValueError, match="as a file name"):
        repo_path(value, source="a test")


def test_a_file_outside_the_asked_directory_is_refused():
    from winattn.errors import RemoteValueError
    from winattn.untrusted import repo_path

    assert repo_path("build/v/a.py", source="a test", under="build/v") == "build/v/a.py"
    with pytest.raises(RemoteValueError, match="only files under build/v/"):
        repo_path("build/w/a.py", source="a test", under="build/v")


def test_a_path_is_contained_only_once_links_are_resolved(tmp_path):
    from winattn.errors import RemoteValueError
    from winattn.untrusted import contained

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    os.symlink(tmp_path, root / "out")
    assert contained(root, root / "sub" / "x", source="a test") == root / "sub" / "x"
    for path in (root / "out" / "x", root / ".." / "x"):
        with pytest.raises(RemoteValueError, match="outside"):
            contained(root, path, source="a test")


@pytest.mark.parametrize("name", ["../victim", "<absolute path of the victim>"])
def test_vendor_never_removes_a_directory_an_old_lock_names_outside_its_own(hub, hf_cache, make_build, tmp_path,
                                                                            name):
    """A vendored directory's writer plants a lock naming a path; the next `winattn vendor` into the directory
    replaces the lock and removes nothing outside it (the planted lock is not one winattn can read)."""
    from winattn.vendor import LOCK_FORMAT, read_lock, vendor

    publish_build(hub, make_build())
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    out = tmp_path / "vendored"
    out.mkdir()
    target = str(victim) if name.startswith("<") else name
    lock = {"format": LOCK_FORMAT, "repo": REPO, "version": 1, "revision": "v1", "commit": "1" * 40,
            "variants": {target: {"metadata_sha256": "0" * 64, "signature_sha256": None}}}
    (out / "window-attention.lock").write_text(json.dumps(lock))
    vendor(REPO, version=1, out_dir=out, endpoint=hub.url)
    assert (victim / "keep").is_dir(), "vendor removed a directory outside the vendored one"
    assert target not in read_lock(out)["variants"]
