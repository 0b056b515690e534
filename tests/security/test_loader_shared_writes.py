"""Issue 27: writes into directories someone else can write (a shared HF cache, a vendored directory).

The attacker can write the shared cache (or the vendored directory) but not the victim's other files. On the original
loader the temporary file next to a cache ref (`refs/.v1.<pid>.tmp`), a verified-receipt (`.<variant>.json.<pid>.tmp`)
or a vendor lock (`window-attention.lock.tmp`) had a predictable name and was opened following links, and the variant
lock file was `touch`ed through a link: a link planted there made the victim overwrite (or create) any file it can
write. Now each is created exclusively under a random name without following links and renamed over its target
(`winattn.safe_fs`); a link in place of the target's directory means nothing is written.
"""

from __future__ import annotations

import os

import pytest

from ._loader_support import REPO, hf_cache, hub, make_build, publish_build  # noqa: F401  (fixtures)

VICTIM = b"the victim's own file\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    return path


def _repo_cache(hf_cache):
    return hf_cache / "kernels--winattn--window-attention"


def test_cache_ref_is_not_written_through_a_planted_link(hub, hf_cache, make_build, victim):
    import winattn

    commit = publish_build(hub, make_build())
    refs = _repo_cache(hf_cache) / "refs"
    refs.mkdir(parents=True)
    os.symlink(victim, refs / f".v1.{os.getpid()}.tmp")  # the old predictable temporary name
    winattn.load(REPO, endpoint=hub.url)
    assert victim.read_bytes() == VICTIM
    assert (refs / "v1").read_text() == commit and not (refs / "v1").is_symlink()


def test_cache_ref_link_is_replaced_not_followed(hub, hf_cache, make_build, victim):
    import winattn

    commit = publish_build(hub, make_build())
    refs = _repo_cache(hf_cache) / "refs"
    refs.mkdir(parents=True)
    os.symlink(victim, refs / "v1")
    winattn.load(REPO, endpoint=hub.url)
    assert victim.read_bytes() == VICTIM
    assert (refs / "v1").read_text() == commit and not (refs / "v1").is_symlink()


def test_refs_directory_that_is_a_link_gets_nothing_written(hub, hf_cache, make_build, tmp_path):
    import winattn

    publish_build(hub, make_build())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _repo_cache(hf_cache).mkdir(parents=True)
    os.symlink(elsewhere, _repo_cache(hf_cache) / "refs")
    winattn.load(REPO, endpoint=hub.url)  # the ref is a cache, not a requirement: the load still works
    assert list(elsewhere.iterdir()) == []


def test_receipt_is_not_written_through_a_planted_link(hub, hf_cache, make_build, victim):
    import winattn

    b = make_build()
    commit = publish_build(hub, b)
    receipts = _repo_cache(hf_cache) / ".winattn" / "receipts" / commit
    receipts.mkdir(parents=True)
    os.symlink(victim, receipts / f".{b.variant}.json.{os.getpid()}.tmp")
    winattn.load(REPO, endpoint=hub.url)
    assert victim.read_bytes() == VICTIM
    assert (receipts / f"{b.variant}.json").is_file() and not (receipts / f"{b.variant}.json").is_symlink()


def test_variant_lock_file_is_not_created_through_a_planted_link(hub, hf_cache, make_build, tmp_path):
    import winattn

    b = make_build()
    commit = publish_build(hub, b)
    locks = hf_cache / ".locks" / "kernels--winattn--window-attention"
    locks.mkdir(parents=True)
    target = tmp_path / "created-through-the-link"
    os.symlink(target, locks / f"winattn-{commit}-{b.variant}.lock")
    winattn.load(REPO, endpoint=hub.url)
    assert not target.exists()


def test_vendor_lock_is_not_written_through_a_planted_link(hub, hf_cache, make_build, victim, tmp_path):
    from winattn.vendor import vendor

    publish_build(hub, make_build())
    out = tmp_path / "vendored"
    out.mkdir()
    os.symlink(victim, out / "window-attention.lock.tmp")
    vendor(REPO, version=1, out_dir=out, endpoint=hub.url)
    assert victim.read_bytes() == VICTIM
    assert (out / "window-attention.lock").is_file() and not (out / "window-attention.lock").is_symlink()


def test_write_atomic_never_follows_links(tmp_path, victim):
    """The one helper behind the writes above: exclusive random temporary name, rename over the target."""
    from winattn.safe_fs import write_atomic

    d = tmp_path / "shared"
    d.mkdir()
    os.symlink(victim, d / "target")
    write_atomic(d / "target", b"new")
    assert victim.read_bytes() == VICTIM and (d / "target").read_bytes() == b"new"
    os.symlink(d, tmp_path / "link-to-dir")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "link-to-dir" / "other", b"x")
    assert sorted(p.name for p in d.iterdir()) == ["target"]
