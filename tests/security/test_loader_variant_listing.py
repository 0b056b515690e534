"""Issue 27: the variant listing against trees and names someone else made.

- A directory tree 1,100 levels deep in a variant crashed the listing with `RecursionError` (the walk, the private
  copy's finder registration and the removal of a copy recursed once per level): now every walk is iterative and the
  deep tree is one more entry the digest does not list.
- File names with ANSI escapes or bidi overrides were printed raw by errors and `winattn verify`, so a file could
  rewrite the terminal or reorder the report: now every name is escaped (`\\x1b`, `\\u202e`).
- With a forged metadata.json and an invalid signature under `require_signature`, a listed 2 GiB sparse file was
  hashed and copied in full before the refusal: now nothing but metadata.json and its signature is read when the
  signature (or the vendor lock) does not hold.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

from ._loader_support import REPO, hf_cache, keys, make_build  # noqa: F401  (fixtures)

DEPTH = 1100


@pytest.fixture
def deep_tree():
    """`make(base)`: `base/d/d/.../d/leaf.py`, DEPTH levels, made one level at a time (os.makedirs recurses too);
    removed after the test (pytest's own clean-up of old temporary directories would hit the recursion limit)."""
    from winattn.safe_fs import remove_tree

    made = []

    def make(base) -> str:
        path = str(base)
        for _ in range(DEPTH):
            path = os.path.join(path, "d")
            os.mkdir(path)
        with open(os.path.join(path, "leaf.py"), "w") as f:
            f.write("X = 1\n")
        made.append(os.path.join(str(base), "d"))
        return path

    yield make
    for top in made:
        remove_tree(top)


def test_a_tree_1100_levels_deep_is_listed_and_refused_without_recursion(make_build, tmp_path, deep_tree):
    from winattn.file_reader import scan_variant
    from winattn.verify import verify_variant

    b = make_build()
    deep_tree(b.variant_dir)
    listing = scan_variant(b.variant_dir)
    assert "/".join(["d"] * DEPTH + ["leaf.py"]) in listing.files
    report = verify_variant(b.variant_dir, use_receipt=False, copy_to=tmp_path / "copy")
    assert not report.ok and "Unknown file: d/d/d" in report.check("digest").detail


def test_deep_private_copy_is_imported_and_removed_without_recursion(tmp_path, deep_tree):
    """What a verified copy with a deep (listed) tree goes through: the importer's finders, then its removal."""
    from winattn import importer, safe_fs

    copy = tmp_path / "p1-x" / "variant"
    copy.mkdir(parents=True)
    (copy.parent / "pycache").mkdir()
    deep_tree(copy)
    (copy / "__init__.py").write_text("VALUE = 3\n")
    module_id = f"_winattn_sectest_deep_{id(tmp_path)}"
    assert importer.import_package(copy, module_id).VALUE == 3
    safe_fs.remove_tree(copy.parent)
    assert not copy.parent.exists()


EVIL_NAME = "evil\x1b[2J\x1b[31m\u202egnp.py"


def test_file_names_are_escaped_in_errors_and_in_winattn_verify(make_build, capsys):
    from winattn.cli import main
    from winattn.verify import verify_variant

    b = make_build()
    (b.variant_dir / EVIL_NAME).write_text("x = 1\n")
    detail = verify_variant(b.variant_dir, use_receipt=False).check("digest").detail
    assert "Unknown file: evil\\x1b[2J\\x1b[31m\\u202egnp.py" in detail
    assert "\x1b" not in detail and "\u202e" not in detail
    assert main(["verify", str(b.variant_dir)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "evil\\x1b[2J" in out


def test_a_forged_metadata_with_a_bad_signature_reads_no_other_file(make_build, keys, monkeypatch):
    from winattn import file_reader, verify
    from winattn.signing import sign_variant

    b = make_build()
    sign_variant(b.variant_dir, keys["good"][0], repo_id=REPO)
    # the forger: a 2 GiB sparse file (no disk used), listed in a metadata.json the signature no longer covers
    with open(b.variant_dir / "big.bin", "wb") as f:
        f.truncate(2 << 30)
    meta = json.loads((b.variant_dir / "metadata.json").read_text())
    meta["digest"]["files"]["big.bin"] = base64.b64encode(b"\0" * 32).decode()
    (b.variant_dir / "metadata.json").write_text(json.dumps(meta))

    def hashed(entry, *args):
        raise AssertionError(f"{entry.rel} was read although the signature over metadata.json failed")

    monkeypatch.setattr(file_reader, "hash_entry", hashed)
    report = verify.verify_variant(b.variant_dir, public_keys=[keys["good"][1]], require_signature=True,
                                   use_receipt=False)
    assert not report.ok and "bad signature" in report.check("signature").detail
    assert report.check("digest").status == "skip" and "not hashed" in report.check("digest").detail


def test_a_vendor_lock_mismatch_reads_no_other_file(make_build, monkeypatch):
    from winattn import file_reader, verify

    b = make_build()
    monkeypatch.setattr(file_reader, "hash_entry", lambda entry, *a: pytest.fail(f"{entry.rel} was read"))
    report = verify.verify_variant(b.variant_dir, lock_entry={"metadata_sha256": "0" * 64, "signature_sha256": None},
                                   use_receipt=False)
    assert not report.ok and report.check("lock").status == "fail" and report.check("digest").status == "skip"
