"""Offline signatures for kernel variants: an EC P-256 key pair and OpenSSF `model-signing` (1.1.1).

What is signed is the variant's `metadata.json`. It carries the sha256 of every other file of the variant
(`digest`, checked with `kernels._rust.Digest.hash_variant`), so a valid signature plus a matching digest covers the
whole variant. The signature is a `model-signing` bundle (Sigstore bundle v0.3, DSSE envelope, public-key hint, no
transparency log) written *inside* the variant as `metadata.json.sigstore`:

- it is one of the only two names `kernels`' digest skips (`metadata.json`, `metadata.json.sigstore`, plus
  `__pycache__/`), so signing does not invalidate the digest, and it travels with the variant through
  `snapshot_download(allow_patterns=["build/<variant>/*"])`, `kernels download` and vendoring;
- `kernels` 0.17.2 only reads that file in `kernels verify-signature` / `kernels.verify.verify_variant`; loading
  (`get_kernel`, `get_local_kernel`, `load_kernel`) never looks at it. There, `sigstore.models.Bundle.from_json`
  rejects a key-signed bundle ("expected certificate in bundle") before any network access, so `kernels
  verify-signature` reports `SignatureBundleInvalid` instead of `SignatureBundleMissing`: the same refusal it gives
  any kernel not signed by kernels-community's GitHub workflows, and no change to what loads.

`import model_signing` costs ~0.5 s and pulls sigstore, so it is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import VerificationError

SIGNATURE_FILENAME = "metadata.json.sigstore"
METADATA_FILENAME = "metadata.json"


def generate_keypair(private_key_path: Path, public_key_path: Path) -> None:
    """Write a new EC P-256 key pair: PKCS#8 PEM private key (mode 0600) and SubjectPublicKeyInfo PEM public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_key_path, public_key_path = Path(private_key_path), Path(public_key_path)
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    private_key_path.parent.mkdir(parents=True, exist_ok=True)
    public_key_path.parent.mkdir(parents=True, exist_ok=True)
    private_key_path.touch(mode=0o600, exist_ok=True)
    private_key_path.chmod(0o600)
    private_key_path.write_bytes(private_pem)
    public_key_path.write_bytes(public_pem)


def public_key_fingerprint(public_key_path: Path) -> str:
    """sha256 (hex) of the key's SubjectPublicKeyInfo PEM: the `publicKey.hint` model-signing puts in the bundle."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(Path(public_key_path).read_bytes())
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _hashing_config():
    """The hashing settings, fixed on both sides (the verifier does not guess them from the signature)."""
    import model_signing

    return model_signing.hashing.Config().use_file_serialization(hashing_algorithm="sha256")


def check_digest(variant_dir: Path) -> None:
    """Check the variant's files against the `digest` in its metadata.json.

    Raises:
        ValueError: metadata.json is missing or unparsable, has no digest, or the files do not match it; the message
            lists every violation (`File hash mismatch for x`, `Unknown file: y`, ...).
    """
    from kernels._rust import Digest, DigestValidationError, Metadata

    metadata = Metadata.read_from_file(str(Path(variant_dir) / METADATA_FILENAME))
    if metadata.digest is None:
        raise ValueError("metadata.json has no `digest`, so it does not cover the variant's files")
    actual = Digest.hash_variant(metadata.digest.algorithm, str(variant_dir))
    try:
        metadata.digest.validate(actual)
    except DigestValidationError as e:
        raise ValueError("digest mismatch: " + "; ".join(str(v) for v in e.violations)) from None


def sign_variant(variant_dir: Path, private_key_path: Path) -> Path:
    """Sign `variant_dir/metadata.json` with an EC private key; return the signature path (`metadata.json.sigstore`).

    The variant's digest is checked first: signing a metadata.json that does not describe the files next to it
    would certify the wrong bytes.

    Raises:
        VerificationError: metadata.json is missing/invalid or its digest does not match the files.
        FileNotFoundError: the private key does not exist.
    """
    import model_signing

    variant_dir, private_key_path = Path(variant_dir), Path(private_key_path)
    metadata = variant_dir / METADATA_FILENAME
    if not metadata.is_file():
        raise VerificationError(f"cannot sign variant {variant_dir.name}: {metadata} is missing")
    try:
        check_digest(variant_dir)
    except ValueError as e:
        raise VerificationError(f"cannot sign variant {variant_dir.name}: {e}") from None
    if not private_key_path.is_file():
        raise FileNotFoundError(f"signing key {private_key_path} does not exist (create one with `winattn keygen`)")
    signature = variant_dir / SIGNATURE_FILENAME
    tmp = signature.with_name(SIGNATURE_FILENAME + ".tmp")  # never left behind: it would break the digest
    try:
        (
            model_signing.signing.Config()
            .set_hashing_config(_hashing_config())
            .use_elliptic_key_signer(private_key=private_key_path)
            .sign(metadata.resolve(strict=True), tmp)
        )
        tmp.replace(signature)
    finally:
        tmp.unlink(missing_ok=True)
    return signature


def signed_metadata_sha256(variant_dir: Path) -> str | None:
    """sha256 (hex) of the metadata.json the variant's signature claims to cover, read WITHOUT verifying it.

    For spotting a stale signature (metadata.json rebuilt after signing) where no public key is at hand, e.g. before
    publishing. Returns None when there is no signature; raises ValueError when it is not a model-signing bundle.
    Never use it as a verification: anyone can write this value.
    """
    import base64

    signature = Path(variant_dir) / SIGNATURE_FILENAME
    if not signature.is_file():
        return None
    try:
        bundle = json.loads(signature.read_bytes())
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        (resource,) = statement["predicate"]["resources"]
        return resource["digest"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{signature} is not a model-signing bundle over one file ({type(e).__name__}: {e})") from None


def _bundle_key_hint(signature: Path, variant: str) -> str | None:
    try:
        bundle = json.loads(signature.read_bytes())
        return bundle["verificationMaterial"]["publicKey"].get("hint") or None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise VerificationError(
            f"variant {variant}: bad signature: {SIGNATURE_FILENAME} is not a model-signing key bundle"
        ) from None


def verify_variant_signature(variant_dir: Path, public_key_paths: list[Path], *, check_files: bool = True) -> str:
    """Verify the variant's `metadata.json.sigstore` against trusted public keys; return the key that verified.

    The signature must be over the exact bytes of metadata.json and made by one of `public_key_paths`. With
    `check_files` (default) the variant's files are then checked against metadata.json's digest, so success means
    every file is as signed.

    Returns:
        str: the path (as given) of the public key that verified the signature.

    Raises:
        VerificationError: naming the variant and the cause — missing signature, unknown key (signed by a key not in
            `public_key_paths`), bad signature (metadata.json changed or the bundle is corrupt), or files not
            matching the signed digest. `checks` holds the (check, passed, detail) tuples.
    """
    import model_signing

    variant_dir = Path(variant_dir)
    variant = variant_dir.name
    signature = variant_dir / SIGNATURE_FILENAME
    metadata = variant_dir / METADATA_FILENAME

    def fail(cause: str, detail: str):
        raise VerificationError(f"variant {variant}: {cause}: {detail}", checks=[("signature", False, detail)])

    if not signature.is_file():
        fail("missing signature", f"{signature} does not exist (publish with `--signing-key` to sign)")
    if not metadata.is_file():
        fail("missing metadata", f"{metadata} does not exist")
    keys = [Path(p) for p in public_key_paths]
    if not keys:
        fail("unknown key", "no trusted public keys were given")

    hint = _bundle_key_hint(signature, variant)
    if hint is None:
        candidates = keys  # pre-1.0 bundles carry no hint: try every key
    else:
        fingerprints = {}
        for k in keys:
            try:
                fingerprints[k] = public_key_fingerprint(k)
            except (OSError, ValueError, TypeError) as e:
                fail("bad public key", f"cannot read trusted key {k}: {e}")
        candidates = [k for k in keys if fingerprints[k] == hint]
        if not candidates:
            fail(
                "unknown key",
                f"signed by key sha256:{hint}, which is none of the trusted keys "
                f"({', '.join(str(k) for k in keys)})",
            )

    errors = []
    for key in candidates:
        config = (
            model_signing.verifying.Config()
            .set_hashing_config(_hashing_config())
            .use_elliptic_key_verifier(public_key=key)
        )
        try:
            # resolve(): in the HF cache metadata.json is a symlink into blobs/, which model-signing refuses.
            config.verify(metadata.resolve(strict=True), signature)
        except Exception as e:  # model-signing raises ValueError, cryptography InvalidSignature, protobuf errors
            errors.append(f"{key}: {type(e).__name__}: {e}".strip())
            continue
        if check_files:
            try:
                check_digest(variant_dir)
            except ValueError as e:
                raise VerificationError(
                    f"variant {variant}: files do not match the signed metadata.json: {e}",
                    checks=[("signature", True, str(key)), ("digest", False, str(e))],
                ) from None
        return str(key)
    fail("bad signature", "metadata.json does not match its signature (" + "; ".join(errors) + ")")
    raise AssertionError("unreachable")
