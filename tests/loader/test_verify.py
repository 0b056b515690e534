"""winattn.verify on local copies of the real CPU build (no server, nothing imported), receipts, the reference
fallback module, argument checking, and `import winattn` staying free of tooling."""

import json
import os
import subprocess
import sys

import pytest

from winattn.file_reader import list_files
from winattn.receipts import receipt_path
from winattn.verify import verify_variant

from .conftest import REPO_ROOT


@pytest.fixture
def variant(make_build, monkeypatch, tmp_path):
    monkeypatch.setenv("WINATTN_CACHE", str(tmp_path / "winattn-cache"))
    return make_build()


def _status(report) -> dict:
    return {c.name: c.status for c in report.checks}


def test_clean_build_passes_every_check(variant):
    report = verify_variant(variant.variant_dir, check_abi=True)
    assert report.ok, report.summary()
    assert [c.name for c in report.checks] == [
        "files", "signature", "metadata", "digest", "kernels-minver", "arch", "python-depends", "abi3"]
    assert _status(report)["signature"] == "skip" and _status(report)["arch"] == "skip"
    assert report.metadata.id.startswith("_window_attention_cpu_")
    for check in report.checks:  # VerificationError.checks documents (name, passed, detail) tuples
        name, passed, detail = check
        assert passed is True and isinstance(detail, str)


@pytest.mark.parametrize("tamper, violation", [
    ("so", "File hash mismatch for {so}"),
    ("init", "File hash mismatch for __init__.py"),
    ("extra", "Unknown file: extra.py"),
    ("missing", "Missing file: reference.py"),
])
def test_digest_violations(variant, tamper, violation):
    d = variant.variant_dir
    if tamper == "so":
        data = bytearray((d / variant.so_name).read_bytes())
        data[100] ^= 1
        (d / variant.so_name).write_bytes(bytes(data))
    elif tamper == "init":
        (d / "__init__.py").write_text((d / "__init__.py").read_text() + "\n# edited\n")
    elif tamper == "extra":
        (d / "extra.py").write_text("x = 1\n")
    else:
        (d / "reference.py").unlink()
    report = verify_variant(d)
    assert not report.ok
    assert [c.name for c in report.failures] == ["digest"]
    assert violation.format(so=variant.so_name) in report.check("digest").detail


def test_missing_digest_fails(variant):
    meta = json.loads((variant.variant_dir / "metadata.json").read_text())
    del meta["digest"]
    (variant.variant_dir / "metadata.json").write_text(json.dumps(meta))
    report = verify_variant(variant.variant_dir)
    assert "has no `digest`" in report.check("digest").detail and not report.ok


def test_invalid_metadata_fails(variant):
    (variant.variant_dir / "metadata.json").write_text("{not json")
    report = verify_variant(variant.variant_dir)
    assert report.check("metadata").status == "fail" and report.check("digest") is None


def test_stray_bytecode(variant):
    d = variant.variant_dir
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "interface.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert list_files(d)[1] == ["__pycache__/interface.cpython-311.pyc"]
    assert verify_variant(d).check("files").status == "fail"
    assert verify_variant(d, bytecode="warn").check("files").status == "warn"
    report = verify_variant(d, bytecode="purge")
    assert report.ok and "removed 1 stray bytecode" in report.check("files").detail
    assert not (d / "__pycache__").exists()


def test_receipt_skips_rehash_and_notices_changes(variant):
    d = variant.variant_dir
    first = verify_variant(d)
    assert first.ok and not first.receipt_hit and receipt_path(d).is_file()
    second = verify_variant(d)
    assert second.ok and second.receipt_hit

    # touched but identical: re-hashed, still fine, receipt refreshed
    st = os.stat(d / variant.so_name)
    os.utime(d / variant.so_name, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = verify_variant(d)
    assert third.ok and not third.receipt_hit
    assert verify_variant(d).receipt_hit

    # rewritten in place with the same size and the old mtime put back: ctime still changes -> re-hashed, caught
    so = d / variant.so_name
    st = os.stat(so)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(so, "r+b") as f:
        f.write(bytes(data))
    os.utime(so, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = verify_variant(d)
    assert not report.ok and not report.receipt_hit
    assert f"File hash mismatch for {variant.so_name}" in report.check("digest").detail
    assert not receipt_path(d).exists()  # a failed digest drops the receipt


def test_receipt_notices_extra_file_and_edited_metadata(variant):
    d = variant.variant_dir
    assert verify_variant(d).ok
    (d / "extra.py").write_text("")
    assert verify_variant(d).check("digest").status == "fail"
    (d / "extra.py").unlink()
    assert verify_variant(d).ok and verify_variant(d).receipt_hit
    meta = json.loads((d / "metadata.json").read_text())
    meta["license"] = "other"
    (d / "metadata.json").write_text(json.dumps(meta))
    report = verify_variant(d)  # new metadata bytes: the receipt does not apply, files re-hashed (and still match)
    assert report.ok and not report.receipt_hit


def test_lock_entry(variant):
    from winattn.vendor import variant_lock_entry

    entry = variant_lock_entry(variant.variant_dir)
    assert verify_variant(variant.variant_dir, lock_entry=entry).check("lock").status == "pass"
    bad = dict(entry, metadata_sha256="0" * 64)
    assert verify_variant(variant.variant_dir, lock_entry=bad).check("lock").status == "fail"
    bad = dict(entry, signature_sha256="1" * 64)
    assert "missing but the lock records" in verify_variant(variant.variant_dir, lock_entry=bad).check("lock").detail


def test_signature_policy(variant, keys, caplog):
    from winattn.signing import sign_variant

    d = variant.variant_dir
    good, other = keys["good"], keys["other"]
    # unsigned
    assert verify_variant(d, public_keys=[good[1]]).check("signature").status == "warn"
    assert "unsigned" in caplog.text
    assert verify_variant(d, public_keys=[good[1]], require_signature=True).check("signature").status == "fail"
    assert verify_variant(d, require_signature=True).check("signature").status == "fail"  # no keys to check with
    # signed with the trusted key
    sign_variant(d, good[0])
    report = verify_variant(d, public_keys=[good[1]], require_signature=True)
    assert report.ok and report.signer == str(good[1])
    assert verify_variant(d).check("signature").status == "skip"  # present, no keys given
    # signed with another key
    sign_variant(d, other[0])
    check = verify_variant(d, public_keys=[good[1]]).check("signature")
    assert check.status == "fail" and "unknown key" in check.detail
    # metadata.json edited after signing
    sign_variant(d, good[0])
    meta = json.loads((d / "metadata.json").read_text())
    meta["license"] = "other"
    (d / "metadata.json").write_text(json.dumps(meta))
    check = verify_variant(d, public_keys=[good[1]]).check("signature")
    assert check.status == "fail" and "bad signature" in check.detail


def test_signature_verified_through_symlinks(variant, keys, tmp_path):
    """HF cache snapshots are symlinks to blobs; signature and digest checks follow them."""
    from winattn.signing import sign_variant

    sign_variant(variant.variant_dir, keys["good"][0])
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    linked = tmp_path / "snapshots" / "c0ffee" / "build" / variant.variant
    linked.mkdir(parents=True)
    for i, f in enumerate(sorted(variant.variant_dir.iterdir())):
        (blobs / str(i)).write_bytes(f.read_bytes())
        (linked / f.name).symlink_to(blobs / str(i))
    report = verify_variant(linked, public_keys=[keys["good"][1]], require_signature=True)
    assert report.ok, report.summary()
    assert receipt_path(linked).parts[-4:] == (".winattn", "receipts", "c0ffee", f"{variant.variant}.json")


# ----------------------------------------------------------------------------------------------------------------------


def test_reference_module_does_not_run_the_kernel_package_init():
    from winattn.reference_kernel import PACKAGE_NAME, load_reference

    module = load_reference()
    assert module.attention is module.reference.attention
    assert f"{PACKAGE_NAME}.reference" in sys.modules and f"{PACKAGE_NAME}._args" in sys.modules
    assert f"{PACKAGE_NAME}._ops" not in sys.modules and f"{PACKAGE_NAME}.interface" not in sys.modules
    assert load_reference() is module


def test_load_argument_errors(tmp_path):
    import winattn

    with pytest.raises(ValueError, match="require_signature=True needs public_keys"):
        winattn.load(require_signature=True)
    with pytest.raises(ValueError, match="fallback"):
        winattn.load(fallback="cpu")
    with pytest.raises(FileNotFoundError, match="public key"):
        winattn.load(public_keys=[tmp_path / "nope.pub"])
    # version= with revision= names the version the revision's signature must be made for: it cannot contradict
    # a version branch (issue 27: tests/security/test_loader_version_binding.py)
    with pytest.raises(ValueError, match="branch of version 2, not version 1"):
        winattn.load(version=1, revision="v2", vendored=tmp_path, endpoint="http://127.0.0.1:9")


def test_vendored_dir_without_lock_is_refused(variant, tmp_path):
    import winattn
    from winattn.errors import VerificationError

    with pytest.raises(VerificationError, match="window-attention.lock"):
        winattn.load(vendored=variant.dir)


def test_import_winattn_imports_no_tooling():
    code = "import json, sys, winattn; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    modules = set(json.loads(out.stdout))
    assert "winattn" in modules and callable(__import__("winattn").load)
    tooling = {"winattn.build", "winattn.hub", "winattn.publish", "winattn.signing", "winattn.vendor",
               "winattn.inspect_cmd", "winattn.cli", "model_signing", "sigstore", "kernel_abi_check"}
    leaked = sorted(m for m in modules if m in tooling or any(m.startswith(t + ".") for t in tooling))
    assert leaked == []


@pytest.mark.parametrize("capability, status", [((9, 0), "pass"), ((8, 9), "pass"), ((12, 0), "fail")])
def test_cuda_arch_check(variant, monkeypatch, capability, status):
    """A CUDA variant on a GPU whose capability is not in metadata.json's backend.archs is refused (kernels'
    ArchValidator), simulated here on the CPU machine."""
    import torch

    meta = json.loads((variant.variant_dir / "metadata.json").read_text())
    meta["backend"] = {"type": "cuda", "archs": ["8.0", "9.0"]}
    (variant.variant_dir / "metadata.json").write_text(json.dumps(meta))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    check = verify_variant(variant.variant_dir).check("arch")
    assert check.status == status, check
    if status == "fail":
        assert "CUDA capability 12.0" in check.detail and "8.0, 9.0" in check.detail


def test_unknown_python_dependency_is_refused(variant):
    meta = json.loads((variant.variant_dir / "metadata.json").read_text())
    meta["python-depends"] = ["no-such-dependency"]
    (variant.variant_dir / "metadata.json").write_text(json.dumps(meta))
    check = verify_variant(variant.variant_dir).check("python-depends")
    assert check.status == "fail" and "no-such-dependency" in check.detail


def test_unreachable_hub_is_a_download_error():
    import socket

    import winattn
    from winattn.errors import DownloadError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    with pytest.raises(DownloadError, match="winattn/window-attention.*Nothing was imported"):
        winattn.load(endpoint=f"http://127.0.0.1:{port}")
