"""Offline EC signatures over metadata.json (winattn.signing), on hand-made variants."""

import json
import os
import stat

import pytest

from winattn.errors import VerificationError
from winattn.signing import (
    SIGNATURE_FILENAME,
    public_key_fingerprint,
    sign_variant,
    verify_variant_signature,
)


def test_generate_keypair_writes_private_key_readable_by_owner_only(keypair):
    private, public = keypair
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in private.read_bytes() and b"BEGIN PUBLIC KEY" in public.read_bytes()


def test_sign_then_verify_returns_the_key_that_verified(tmp_path, make_variant, keypair, other_keypair):
    v = make_variant(tmp_path)
    sig = sign_variant(v, keypair[0])
    assert sig == v / SIGNATURE_FILENAME
    bundle = json.loads(sig.read_text())
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == public_key_fingerprint(keypair[1])
    assert verify_variant_signature(v, [other_keypair[1], keypair[1]]) == str(keypair[1])


def test_signature_does_not_break_the_kernels_digest(tmp_path, make_variant, keypair):
    from kernels._rust import Digest, Metadata

    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    meta = Metadata.read_from_file(str(v / "metadata.json"))
    meta.digest.validate(Digest.hash_variant(meta.digest.algorithm, str(v)))  # raises on mismatch


def test_byte_flip_in_metadata_is_a_bad_signature(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    data = bytearray((v / "metadata.json").read_bytes())
    data[data.index(b'"version": 1') + len('"version": ')] = ord("2")
    (v / "metadata.json").write_bytes(bytes(data))
    with pytest.raises(VerificationError, match=f"variant {v.name}: bad signature"):
        verify_variant_signature(v, [keypair[1]])


def test_wrong_public_key_is_an_unknown_key(tmp_path, make_variant, keypair, other_keypair):
    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    with pytest.raises(VerificationError, match=f"variant {v.name}: unknown key") as e:
        verify_variant_signature(v, [other_keypair[1]])
    assert e.value.checks and e.value.checks[0][1] is False


def test_missing_signature(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    with pytest.raises(VerificationError, match=f"variant {v.name}: missing signature"):
        verify_variant_signature(v, [keypair[1]])


def test_corrupt_bundle_is_a_bad_signature(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    (v / SIGNATURE_FILENAME).write_text("not json")
    with pytest.raises(VerificationError, match="bad signature"):
        verify_variant_signature(v, [keypair[1]])


def test_tampered_file_behind_a_valid_signature_is_refused(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    (v / "helpers.py").write_text("evil = True\n")
    with pytest.raises(VerificationError, match="files do not match the signed metadata.json.*helpers.py"):
        verify_variant_signature(v, [keypair[1]])
    assert verify_variant_signature(v, [keypair[1]], check_files=False) == str(keypair[1])


def test_signing_a_variant_whose_digest_does_not_match_is_refused(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    (v / "helpers.py").write_text("changed = True\n")
    with pytest.raises(VerificationError, match="cannot sign variant .*digest mismatch"):
        sign_variant(v, keypair[0])
    assert not (v / SIGNATURE_FILENAME).exists()


def test_kernels_verify_signature_reports_the_key_bundle_as_invalid_offline(tmp_path, make_variant, keypair):
    """kernels' own sigstore check (CLI only, never at load) rejects the bundle before any network access."""
    from kernels.verify import VerificationResult, verify_variant

    v = make_variant(tmp_path)
    assert isinstance(verify_variant(v), VerificationResult.SignatureBundleMissing)
    sign_variant(v, keypair[0])
    result = verify_variant(v)
    assert isinstance(result, VerificationResult.SignatureBundleInvalid)
    assert "certificate" in result.reason


def test_verify_in_a_hub_cache_layout_where_files_are_symlinks(tmp_path, make_variant, keypair):
    """huggingface_hub's cache keeps files in blobs/ and symlinks them into snapshots/: model-signing refuses
    symlinks, so both sides work on the resolved file."""
    v = make_variant(tmp_path / "snapshot")
    sign_variant(v, keypair[0])
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for f in list(v.iterdir()):
        target = blobs / f.name
        f.rename(target)
        f.symlink_to(target)
    assert (v / "metadata.json").is_symlink()
    assert verify_variant_signature(v, [keypair[1]]) == str(keypair[1])


def test_keygen_cli(tmp_path, capsys):
    from winattn.cli import main

    assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")]) == 0
    assert f"sha256:{public_key_fingerprint(tmp_path / 'k.pub')}" in capsys.readouterr().out
    assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")]) == 1
    assert "exists (pass --force" in capsys.readouterr().err


def test_unreadable_trusted_key_is_named(tmp_path, make_variant, keypair):
    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    with pytest.raises(VerificationError, match=f"bad public key: cannot read trusted key {bad}"):
        verify_variant_signature(v, [bad, keypair[1]])


@pytest.mark.parametrize("hint", ["\x1b]0;owned\x07\x1b[2J" + "ab" * 32, "f" * 100_000, 12345])
def test_the_key_hint_of_a_signature_is_data_escaped_and_bounded_in_the_refusal(tmp_path, make_variant, keypair,
                                                                                 other_keypair, hint):
    """The bundle's `publicKey.hint` is written by whoever made the file; the "unknown key" refusal quoted it raw:
    terminal escapes reached the terminal through the message (the CLI prints it as is) and a 100 KB hint a 100 KB
    message. It is escaped (winattn.untrusted.shown) and cut."""
    v = make_variant(tmp_path)
    sig = sign_variant(v, keypair[0])
    bundle = json.loads(sig.read_text())
    bundle["verificationMaterial"]["publicKey"]["hint"] = hint
    sig.write_text(json.dumps(bundle))
    with pytest.raises(VerificationError, match="unknown key") as exc:
        verify_variant_signature(v, [other_keypair[1]])
    message = str(exc.value)
    assert "\x1b" not in message and "\x07" not in message and len(message) < 2000
    assert all("\x1b" not in str(c) for c in exc.value.checks)
