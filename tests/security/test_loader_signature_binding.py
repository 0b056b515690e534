"""Issue 13, item 7: a signature vouches for one repository, version and variant, and the loader holds it to what it
asked for.

The attacker holds a Hub token (or writes the cache or a vendored directory) but not the signing key. On the original
loader a signature covered metadata.json only, so any genuinely signed build verified anywhere: copied to another
repository, pushed to another version's branch (rollback to an older build), or moved under another variant name.
Now each is refused with its own error. What stays open — an older signed build of the same repository, version and
variant — is the commit-pinning window the README's security section describes (a vendor lock pins the commit).
"""

from __future__ import annotations

import json

import pytest

from ._loader_support import (  # noqa: F401  (fixtures)
    REPO,
    hf_cache,
    hub,
    keys,
    make_build,
    publish_build,
    push,
    variant_files,
)


def _signed(keys) -> dict:
    return dict(public_keys=[keys["good"][1]], require_signature=True)


def test_build_signed_for_another_repository_is_refused(hub, hf_cache, make_build, keys):
    import winattn
    from winattn.errors import VerificationError

    b = make_build()
    publish_build(hub, b, "winattn/sig-original", signing_key=keys["good"][0])
    push(hub, "winattn/sig-copy", variant_files(b))  # the genuine signed files, in another repository
    with pytest.raises(VerificationError, match="signed for another repository") as e:
        winattn.load("winattn/sig-copy", endpoint=hub.url, **_signed(keys))
    assert "signed for repository 'winattn/sig-original', not 'winattn/sig-copy'" in str(e.value)
    assert "nothing was imported" in str(e.value)


def test_rollback_to_a_signed_build_of_another_version_is_refused(hub, hf_cache, make_build, keys):
    import winattn
    from winattn.errors import VerificationError

    b = make_build()
    publish_build(hub, b, "winattn/sig-rollback", signing_key=keys["good"][0])  # v1, signed
    push(hub, "winattn/sig-rollback", variant_files(b), revision="v2")  # v2 now serves the v1 build
    with pytest.raises(VerificationError, match="signed for another version") as e:
        winattn.load("winattn/sig-rollback", version=2, endpoint=hub.url, **_signed(keys))
    assert "signed for version 1, not the requested version 2" in str(e.value)
    assert winattn.load("winattn/sig-rollback", version=1, endpoint=hub.url, **_signed(keys))  # where it belongs


def test_signed_build_moved_to_another_variant_name_is_refused(hub, hf_cache, make_build, keys):
    import torch

    import winattn
    from winattn.errors import VerificationError

    b = make_build()
    publish_build(hub, b, "winattn/sig-variant-src", signing_key=keys["good"][0])
    major, minor = torch.__version__.split(".")[:2]
    other = f"torch{major}{minor}-cxx11-cpu-x86_64-linux"  # another name this machine accepts
    files = variant_files(b)
    moved = {p.replace(f"build/{b.variant}/", f"build/{other}/"): data for p, data in files.items()}
    push(hub, "winattn/sig-variant-src", moved, delete=list(files))  # same repository and version, renamed
    with pytest.raises(VerificationError, match="signed as another variant") as e:
        winattn.load("winattn/sig-variant-src", endpoint=hub.url, **_signed(keys))
    assert f"signed as variant '{b.variant}', not '{other}'" in str(e.value)


def test_substituted_build_in_a_vendored_directory_is_refused(hub, hf_cache, make_build, keys, tmp_path):
    import winattn
    from winattn.errors import VerificationError
    from winattn.vendor import vendor

    b = make_build()
    publish_build(hub, b, "winattn/sig-original", signing_key=keys["good"][0])
    push(hub, "winattn/sig-vendored", variant_files(b))
    out = vendor("winattn/sig-vendored", version=1, out_dir=tmp_path / "vendored", endpoint=hub.url)
    with pytest.raises(VerificationError, match="signed for another repository"):
        winattn.load("winattn/sig-vendored", vendored=out, **_signed(keys))


def test_signature_without_a_statement_is_refused(hub, hf_cache, make_build, keys):
    """A bundle over metadata.json alone (what winattn signed before, or plain model-signing) binds nothing."""
    import model_signing

    import winattn
    from winattn.errors import VerificationError
    from winattn.signing import SIGNATURE_FILENAME, _hashing_config

    b = make_build()
    (
        model_signing.signing.Config().set_hashing_config(_hashing_config())
        .use_elliptic_key_signer(private_key=keys["good"][0])
        .sign(b.variant_dir / "metadata.json", b.variant_dir / SIGNATURE_FILENAME)
    )
    push(hub, "winattn/sig-unbound", variant_files(b))
    with pytest.raises(VerificationError, match="unbound signature"):
        winattn.load("winattn/sig-unbound", endpoint=hub.url, **_signed(keys))


def test_the_signed_statement_is_reported(hub, hf_cache, make_build, keys, capsys):
    import winattn
    from winattn.cli import main

    b = make_build()
    publish_build(hub, b, signing_key=keys["good"][0])
    info = winattn.load(REPO, endpoint=hub.url, **_signed(keys)).__winattn_info__
    assert (info.statement["repo_id"], info.statement["version"], info.statement["variant"]) == (REPO, 1, b.variant)
    assert f"for {REPO} v1, variant {b.variant}" in info.check("signature").detail
    assert main(["verify", str(b.dir), "--public-key", str(keys["good"][1]), "--require-signature"]) == 0
    assert f"signed by {keys['good'][1]} for {REPO} v1, variant {b.variant}" in capsys.readouterr().out


def test_statement_numbers_and_fields_are_checked_after_the_signature(tmp_path, keys, make_build):
    """Binding errors come from the verified payload; a payload edited to claim another repository breaks the
    signature itself."""
    import base64

    from winattn.errors import VerificationError
    from winattn.signing import SIGNATURE_FILENAME, sign_variant, verify_variant_signature

    b = make_build()
    sign_variant(b.variant_dir, keys["good"][0], repo_id="winattn/a")
    assert verify_variant_signature(b.variant_dir, [keys["good"][1]], repo_id="winattn/a", version=1)
    sig = b.variant_dir / SIGNATURE_FILENAME
    bundle = json.loads(sig.read_text())
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["predicate"]["winattn"]["repo_id"] = "winattn/b"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    sig.write_text(json.dumps(bundle))
    with pytest.raises(VerificationError, match="bad signature"):
        verify_variant_signature(b.variant_dir, [keys["good"][1]], repo_id="winattn/b")
