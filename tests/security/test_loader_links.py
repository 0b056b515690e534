"""Issue 13, item 1: a link to a directory inside a verified variant must not make winattn import an attacker's
package — in a cached Hub variant (online, signed), in the offline cache, in a vendored lock, and for a local
directory (`winattn verify`). Plus the rest of "every entry the digest does not cover fails": links to files, FIFOs,
devices, extra files.

The attacker (anyone who can write the cache or the vendored directory) plants a link named like the variant, or
`build`, pointing at a working copy of the kernel whose `__init__.py` also writes to $WINATTN_PWNED. On the original
loader `kernels.get_local_kernel` followed it (every check passed); now the listing refuses it before anything is
read, and an online load heals the cache (downloads the variant again) instead.
"""

from __future__ import annotations

import os
import stat

import pytest

from ._loader_support import (  # noqa: F401  (fixtures)
    REPO,
    assert_nothing_imported,
    build_maker,
    evil_package,
    hf_cache,
    hub,
    isolate_cache,
    keys,
    make_build,
    publish_build,
    run_attack,
    start_hub,
)


@pytest.fixture(scope="module")
def link_attacks(built_variant, keys, tmp_path_factory):
    """One signed repo per attack, links planted, then every load attempted in one fresh interpreter."""
    import winattn
    from winattn.vendor import vendor

    root = tmp_path_factory.mktemp("links")
    good_pub = str(keys["good"][1])
    signed = dict(public_keys=[good_pub], require_signature=True)
    with pytest.MonkeyPatch.context() as mp:
        cache = isolate_cache(mp, root)
        srv = start_hub(root / "hub-root")
        make = build_maker(built_variant, root)
        try:
            builds = {}
            for name in ("link-cached", "link-offline", "link-vendored"):
                b = make()
                builds[name] = (b, publish_build(srv, b, f"winattn/{name}", signing_key=keys["good"][0]))
            variant = builds["link-cached"][0].variant

            # Cached (online): a link named like the variant inside the cached variant.
            winattn.load("winattn/link-cached", endpoint=srv.url, **signed)  # fills the cache (module reused here)
            cached = next(cache.glob("kernels--winattn--link-cached/snapshots/*/build")) / variant
            evil_package(built_variant, root / "evil-a" / variant)
            os.symlink(root / "evil-a" / variant, cached / variant)

            # Offline: a link named `build` (kernels' second lookup) in a cache entry verified and trusted online.
            winattn.load("winattn/link-offline", endpoint=srv.url, **signed)
            offline = next(cache.glob("kernels--winattn--link-offline/snapshots/*/build")) / variant
            evil_package(built_variant, root / "evil-b" / "build" / variant)
            os.symlink(root / "evil-b" / "build", offline / "build")

            # Vendored: a link named like the variant inside the vendored variant (the lock covers metadata.json only).
            vendored = root / "vendored"
            vendor("winattn/link-vendored", version=1, out_dir=vendored, endpoint=srv.url)
            evil_package(built_variant, root / "evil-c" / variant)
            os.symlink(root / "evil-c" / variant, vendored / variant / variant)

            cases = [
                {"name": "offline", "before": "from huggingface_hub import constants; constants.HF_HUB_OFFLINE = True",
                 "kwargs": {"repo_id": "winattn/link-offline", "version": 1, **signed}},
                {"name": "vendored", "before": "constants.HF_HUB_OFFLINE = False",
                 "kwargs": {"repo_id": "winattn/link-vendored", "vendored": str(vendored), **signed}},
                # Last, since it imports: the cached attack heals, and the genuine build loads.
                {"name": "cached", "run_attention": True,
                 "kwargs": {"repo_id": "winattn/link-cached", "version": 1, "endpoint": srv.url, **signed}},
            ]
            results = run_attack(cases, pwned=root / "pwned")
            yield {"results": {r["name"]: r for r in results}, "cached": cached, "offline": offline,
                   "vendored": vendored / variant, "variant": variant, "root": root}
        finally:
            srv.stop()


@pytest.mark.parametrize("name", ["offline", "vendored"])
def test_link_to_a_directory_is_refused_and_imports_nothing(link_attacks, name):
    r = link_attacks["results"][name]
    assert r["pwned"] == "", f"{name}: the attacker's package ran"
    assert not r["ok"], f"{name}: loaded ({r.get('info')})"
    assert r["error_type"] == "VerificationError", r.get("traceback")
    assert "symbolic link to" in r["error"] and "(a directory)" in r["error"], r["error"]
    assert_nothing_imported(r)


def test_link_in_the_cache_is_healed_online_and_the_genuine_build_loads(link_attacks):
    r = link_attacks["results"]["cached"]
    assert r["pwned"] == "", "the attacker's package ran"
    assert r["ok"], r.get("traceback")
    assert "failed verification" in r["stderr"] and "symbolic link to" in r["stderr"]
    assert r["attention_err"] < 1e-4
    assert "/winattn-cache/imports/" in r["module_file"]  # the private copy, not the cache
    statuses = {c[0]: c[3] for c in r["info"]["checks"]}
    assert statuses["files"] == "pass" and statuses["signature"] == "pass" and statuses["digest"] == "pass"
    assert not os.path.lexists(link_attacks["cached"] / link_attacks["variant"])  # the cache entry was replaced


def test_winattn_verify_fails_on_a_link_to_a_directory(link_attacks, capsys):
    """`winattn verify` of the vendored directory and of a local variant directory with a link in it."""
    from winattn.cli import main

    assert main(["verify", str(link_attacks["vendored"].parent)]) == 1
    out = capsys.readouterr().out
    assert "FAIL files" in out and "symbolic link to" in out and "FAILED" in out


def test_local_variant_with_a_link_to_a_directory_fails_verification(make_build, tmp_path):
    from winattn.verify import verify_variant

    b = make_build()
    os.symlink(tmp_path, b.variant_dir / "build")
    report = verify_variant(b.variant_dir)
    assert not report.ok
    assert report.check("files").status == "fail" and "build: symbolic link to" in report.check("files").detail


# ----------------------------------------------------------------------------------------------------------------------
# Every other entry the digest does not cover


def _verify(d):
    from winattn.verify import verify_variant

    return verify_variant(d, use_receipt=False)


def test_link_to_a_file_outside_the_cache_blobs_fails(make_build, tmp_path):
    """Outside an HF snapshot no link is accepted, even one to a file with the right bytes."""
    b = make_build()
    layers = b.variant_dir / "layers.py"
    moved = tmp_path / "layers.py"
    layers.rename(moved)
    os.symlink(moved, layers)
    report = _verify(b.variant_dir)
    assert not report.ok and "layers.py: symbolic link to" in report.check("files").detail
    assert report.check("digest").status == "fail"  # not hashed at all


def test_link_out_of_a_cache_snapshot_is_refused_but_blob_links_are_files(make_build, tmp_path):
    """In `<repo>/snapshots/<commit>/build/<variant>` a link to a regular file in `<repo>/blobs/` is a file (that is
    the cache's layout); a link to anything else is not."""
    b = make_build()
    repo = tmp_path / "kernels--o--n"
    snap = repo / "snapshots" / ("c" * 40) / "build" / b.variant
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, f in enumerate(sorted(b.variant_dir.iterdir())):
        (repo / "blobs" / str(i)).write_bytes(f.read_bytes())
        os.symlink(os.path.relpath(repo / "blobs" / str(i), snap), snap / f.name)
    assert _verify(snap).ok
    outside = tmp_path / "elsewhere.py"
    outside.write_bytes((snap / "layers.py").read_bytes())
    (snap / "layers.py").unlink()
    os.symlink(outside, snap / "layers.py")
    report = _verify(snap)
    assert not report.ok and "layers.py: symbolic link to" in report.check("files").detail


def test_fifo_is_refused_without_blocking(make_build):
    b = make_build()
    os.mkfifo(b.variant_dir / "pipe")
    report = _verify(b.variant_dir)  # a read would block forever
    assert not report.ok and "pipe: a FIFO, not a regular file" in report.check("files").detail


@pytest.mark.skipif(os.getuid() != 0, reason="creating a device node needs root")
def test_device_node_is_refused(make_build):
    b = make_build()
    os.mknod(b.variant_dir / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: endless bytes
    report = _verify(b.variant_dir)
    assert not report.ok and "zero: a character device" in report.check("files").detail


def test_fifo_as_metadata_json_is_refused_without_blocking(make_build):
    b = make_build()
    (b.variant_dir / "metadata.json").unlink()
    os.mkfifo(b.variant_dir / "metadata.json")
    report = _verify(b.variant_dir)
    assert not report.ok and "metadata.json: a FIFO" in report.check("files").detail


def test_extra_file_fails_and_is_never_read(make_build, monkeypatch):
    import winattn.file_reader as file_reader

    b = make_build()
    (b.variant_dir / "sitecustomize.py").write_text("print('owned')\n")
    read = []
    real = file_reader.hash_entry
    monkeypatch.setattr(file_reader, "hash_entry", lambda entry, *a: read.append(entry.rel) or real(entry, *a))
    report = _verify(b.variant_dir)
    assert not report.ok and "Unknown file: sitecustomize.py (not read)" in report.check("digest").detail
    assert "sitecustomize.py" not in read and read  # the listed files were hashed, the extra one never opened


def test_the_variant_directory_itself_may_not_be_a_link(make_build, tmp_path):
    b = make_build()
    link = tmp_path / "linked-variant"
    os.symlink(b.variant_dir, link)
    report = _verify(link)
    assert not report.ok and "is a symbolic link" in report.check("files").detail


def test_pycache_link_is_stray_bytecode_and_purging_never_follows_it(make_build, tmp_path):
    from winattn.verify import verify_variant

    b = make_build()
    keep = tmp_path / "somebody-elses-dir"
    keep.mkdir()
    (keep / "precious").write_text("x")
    os.symlink(keep, b.variant_dir / "__pycache__")
    assert verify_variant(b.variant_dir, bytecode="fail", use_receipt=False).check("files").status == "fail"
    report = verify_variant(b.variant_dir, bytecode="purge", use_receipt=False)
    assert report.ok, report.summary()
    assert not os.path.lexists(b.variant_dir / "__pycache__") and (keep / "precious").exists()


def test_purging_never_follows_a_parent_swapped_for_a_link_after_the_listing(make_build, tmp_path, monkeypatch):
    """Audit 3: stray bytecode was purged by path (`variant/sub/__pycache__/x.pyc`, then `rmtree` of
    `variant/sub/__pycache__`), so a cache writer who swaps `sub` for a link between the listing and the purge made
    the loader delete `__pycache__` directories (whatever they hold) and `.pyc` files anywhere it can write. Now each
    removal walks down from the variant by file descriptor without following a link: the swapped link stops it."""
    import shutil

    from winattn import file_reader
    from winattn.verify import verify_variant

    b = make_build()
    sub = b.variant_dir / "sub"
    (sub / "__pycache__").mkdir(parents=True)
    (sub / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"stray")
    victim = tmp_path / "victims-project"
    (victim / "__pycache__").mkdir(parents=True)
    (victim / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"the victim's")
    (victim / "__pycache__" / "precious").write_text("x")
    real_scan = file_reader.scan_variant

    def scan_then_swap(path, **kwargs):
        listing = real_scan(path, **kwargs)
        if listing.bytecode and sub.is_dir() and not sub.is_symlink():
            shutil.rmtree(sub)
            os.symlink(victim, sub)  # the writer's move, right after the listing
        return listing

    monkeypatch.setattr(file_reader, "scan_variant", scan_then_swap)
    verify_variant(b.variant_dir, bytecode="purge", use_receipt=False)
    assert (victim / "__pycache__" / "precious").exists()
    assert (victim / "__pycache__" / "x.cpython-311.pyc").read_bytes() == b"the victim's"
