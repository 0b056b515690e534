"""Offline signatures for kernel variants: an EC P-256 key pair and OpenSSF `model-signing` (1.1.1).

What is signed is the variant's `metadata.json` together with a winattn statement of what the signature vouches
for. metadata.json carries the sha256 of every other file of the variant (`digest`), so a valid signature plus a
matching digest covers the whole variant. The statement (`STATEMENT_KEY` in the in-toto predicate) binds it to a
place: `{"format", "repo_id", "version", "variant", "metadata_sha256", "digest"}`. A loader checks the statement
against what it asked for, so a build signed for another repository, another major version or another variant is
refused (`check_binding`), not only a build signed by another key. What it cannot bind is the commit (it does not
exist yet when the build is signed): an older signed build of the *same* repository, version and variant still
verifies; a vendor lock or `revision=<commit>` pins that (README, security section).

The signature is a `model-signing` bundle (Sigstore bundle v0.3, DSSE envelope, public-key hint, no transparency
log) written *inside* the variant as `metadata.json.sigstore`:

- it is one of the only two names `kernels`' digest skips (`metadata.json`, `metadata.json.sigstore`, plus
  `__pycache__/`), so signing does not invalidate the digest, and it travels with the variant through
  `snapshot_download(allow_patterns=["build/<variant>/*"])`, `kernels download` and vendoring;
- `kernels` 0.17.2 only reads that file in `kernels verify-signature` / `kernels.verify.verify_variant`; loading
  (`get_kernel`, `get_local_kernel`, `load_kernel`) never looks at it. There, `sigstore.models.Bundle.from_json`
  rejects a key-signed bundle ("expected certificate in bundle") before any network access, so `kernels
  verify-signature` reports `SignatureBundleInvalid` instead of `SignatureBundleMissing`: the same refusal it gives
  any kernel not signed by kernels-community's GitHub workflows, and no change to what loads.

Why the statement sits in the predicate: model-signing's v1.0 predicate reserves that place for extensions
("other properties can go here"; verifiers ignore unknown fields), so the bundle stays a plain model-signing bundle
that `model_signing.verifying` verifies unchanged. Its public `signing.Config` has no hook to add a field, so signing
builds the payload with model-signing's own `Payload` and EC `Signer` (private modules, pinned by model-signing==1.1.1).
Verification uses only the public API, then reads the statement from the same bundle bytes it just verified.

`import model_signing` costs ~0.5 s and pulls sigstore, so it is imported inside the functions.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import bounded_json
from .digest import check_digest  # the one digest check (also importable from here, as before)
from .errors import VerificationError
from .variant import METADATA_FILENAME, SIGNATURE_FILENAME

STATEMENT_KEY = "winattn"  # the predicate field holding the statement
STATEMENT_FORMAT = 1
MAX_BUNDLE_BYTES = 4 << 20  # as winattn.file_reader.MAX_SIGNATURE_BYTES: a key bundle is a few KiB


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


def statement_for(variant_dir: Path, metadata_bytes: bytes, *, repo_id: str | None, version: int | None = None,
                  variant: str | None = None) -> dict:
    """The statement a signature of this variant carries: where it belongs and what it covers.

    `version` defaults to metadata.json's; `variant` to the directory name. `repo_id=None` makes a statement for no
    repository, which every winattn load refuses (loads always know the repository they asked for).
    """
    from kernels import Metadata

    metadata = Metadata.from_bytes(metadata_bytes)
    if version is not None and version != metadata.version:
        raise VerificationError(f"cannot sign variant {Path(variant_dir).name} for version {version}: its "
                                f"metadata.json says version {metadata.version}")
    if metadata.digest is None:
        raise VerificationError(f"cannot sign variant {Path(variant_dir).name}: metadata.json has no `digest`")
    return {
        "format": STATEMENT_FORMAT,
        "repo_id": repo_id,
        "version": int(metadata.version),
        "variant": variant or Path(variant_dir).name,
        "metadata_sha256": hashlib.sha256(metadata_bytes).hexdigest(),
        "digest": {"algorithm": str(metadata.digest.algorithm).lower(), "files": dict(metadata.digest.files)},
    }


def sign_variant(variant_dir: Path, private_key_path: Path, *, repo_id: str | None = None,
                 version: int | None = None) -> Path:
    """Sign `variant_dir/metadata.json` and its statement (`statement_for`) with an EC private key; return the
    signature path (`metadata.json.sigstore`).

    The variant's digest is checked first: signing a metadata.json that does not describe the files next to it
    would certify the wrong bytes. `winattn publish` passes the repository and version it uploads to.

    Raises:
        VerificationError: metadata.json is missing/invalid, its digest does not match the files, or `version` is not
            metadata.json's.
        FileNotFoundError: the private key does not exist.
    """
    from model_signing._signing import sign_ec_key
    from model_signing._signing import signing as ms_signing

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
    statement = statement_for(variant_dir, metadata.read_bytes(), repo_id=repo_id, version=version)
    signature = variant_dir / SIGNATURE_FILENAME
    tmp = signature.with_name(SIGNATURE_FILENAME + ".tmp")  # never left behind: it would break the digest
    try:
        # model_signing.signing.Config.sign, plus the statement in the predicate (see the module docstring).
        manifest = _hashing_config().hash(metadata.resolve(strict=True))
        payload = ms_signing.Payload(manifest)
        payload.statement.pb.predicate.update({STATEMENT_KEY: statement})
        sign_ec_key.Signer(private_key_path).sign(payload).write(tmp)
        if signed_metadata_sha256(variant_dir, signature=tmp) != statement["metadata_sha256"]:
            raise VerificationError(f"cannot sign variant {variant_dir.name}: metadata.json changed while signing")
        tmp.replace(signature)
    finally:
        tmp.unlink(missing_ok=True)
    return signature


def _payload(bundle_bytes: bytes) -> dict:
    """The in-toto statement of a model-signing bundle, decoded strictly (canonical base64 only, so that this decoder
    and model-signing's cannot read two different payloads out of one bundle)."""
    import base64

    bundle = bounded_json.loads(bundle_bytes, max_bytes=MAX_BUNDLE_BYTES, what=SIGNATURE_FILENAME)
    encoded = bundle["dsseEnvelope"]["payload"]
    raw = base64.b64decode(encoded, validate=True)
    if base64.b64encode(raw).decode() != encoded:
        raise ValueError("the DSSE payload is not canonical base64")
    statement = bounded_json.loads(raw, max_bytes=MAX_BUNDLE_BYTES, what="the DSSE payload")
    if not isinstance(statement, dict):
        raise ValueError("the DSSE payload is not a JSON object")
    return statement


def signed_metadata_sha256(variant_dir: Path, *, signature: Path | None = None) -> str | None:
    """sha256 (hex) of the metadata.json the variant's signature claims to cover, read WITHOUT verifying it.

    For spotting a stale signature (metadata.json rebuilt after signing) where no public key is at hand, e.g. before
    publishing. Returns None when there is no signature; raises ValueError when it is not a model-signing bundle.
    Never use it as a verification: anyone can write this value.
    """
    signature = signature or Path(variant_dir) / SIGNATURE_FILENAME
    if not signature.is_file():
        return None
    try:
        (resource,) = _payload(signature.read_bytes())["predicate"]["resources"]
        return resource["digest"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{signature} is not a model-signing bundle over one file ({type(e).__name__}: {e})") from None


def _as_int(value):
    """Statement numbers come back as floats (protobuf Struct); only integral values are integers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def check_binding(statement: dict | None, *, variant: str, metadata_bytes: bytes, repo_id: str | None = None,
                  version: int | None = None) -> dict:
    """Check a verified statement against the variant it came with and what the loader asked for.

    Args:
        statement: the `STATEMENT_KEY` field of a verified payload (None for a signature made without one).
        variant: the variant directory name the signature was found in.
        metadata_bytes: the metadata.json bytes the signature verified.
        repo_id / version: what was asked for (None: not checked, e.g. `winattn verify DIR`; loads always pass
            the repository, and the version when one was requested).

    Returns:
        the statement, normalized (`version` an int).

    Raises:
        VerificationError: naming the binding that does not hold ("signed for repository ...", "signed for version
            ...", "signed as variant ...") or a signature that binds nothing.
    """
    from kernels import Metadata

    def refuse(cause: str, detail: str):
        raise VerificationError(f"variant {variant}: {cause}: {detail}", checks=[("signature", False, detail)])

    if not isinstance(statement, dict) or _as_int(statement.get("format")) != STATEMENT_FORMAT:
        refuse("unbound signature", "the signature binds no repository, version or variant (signed by a winattn "
               "older than this check, or by plain model-signing); re-publish with --signing-key to sign it again")
    statement = dict(statement, version=_as_int(statement.get("version")))
    try:
        metadata = Metadata.from_bytes(metadata_bytes)
    except ValueError as e:
        refuse("signature binding", f"the signed metadata.json does not parse: {e}")
    files = dict(metadata.digest.files) if metadata.digest is not None else None
    if statement.get("metadata_sha256") != hashlib.sha256(metadata_bytes).hexdigest() or \
            (statement.get("digest") or {}).get("files") != files:
        refuse("signature binding", "the signed statement does not describe this metadata.json and digest")
    if statement["version"] != metadata.version:
        refuse("signature binding", f"the statement says version {statement['version']} but metadata.json says "
               f"{metadata.version}")
    if repo_id is not None and statement.get("repo_id") != repo_id:
        signed_for = f"repository '{statement['repo_id']}'" if statement.get("repo_id") else "no repository"
        refuse("signed for another repository", f"signed for {signed_for}, not '{repo_id}': refusing a signed build "
               "substituted from another repository")
    if version is not None and statement["version"] != version:
        refuse("signed for another version", f"signed for version {statement['version']}, not the requested version "
               f"{version}: refusing a signed build of another version (rollback or substitution)")
    if statement.get("variant") != variant:
        refuse("signed as another variant", f"signed as variant '{statement.get('variant')}', not '{variant}': "
               "refusing a signed build moved to another variant directory")
    return statement


def describe_statement(statement: dict) -> str:
    """e.g. "winattn/window-attention v1, variant torch-stable-abi210-cpu-x86_64-linux"."""
    return f"{statement.get('repo_id')} v{statement.get('version')}, variant {statement.get('variant')}"


def _bundle_key_hint(signature_bytes: bytes, variant: str) -> str | None:
    try:
        bundle = bounded_json.loads(signature_bytes, max_bytes=MAX_BUNDLE_BYTES, what=SIGNATURE_FILENAME)
        return bundle["verificationMaterial"]["publicKey"].get("hint") or None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        detail = f" ({e})" if isinstance(e, bounded_json.JSONLimitError) else ""
        raise VerificationError(
            f"variant {variant}: bad signature: {SIGNATURE_FILENAME} is not a model-signing key bundle{detail}",
            checks=[("signature", False, f"not a model-signing key bundle{detail}")],
        ) from None


def verify_signed_statement(metadata_bytes: bytes, signature_bytes: bytes, public_key_paths: list[Path], *,
                            variant: str) -> tuple[str, dict | None]:
    """Verify a `metadata.json.sigstore` (bytes) over metadata.json (bytes); return (key that verified, statement).

    Works on private copies of the bytes given, so the bytes verified are the bytes the caller parses next. The
    statement (None when the signature carries none) comes from the payload just verified; nothing is checked against
    it here (`check_binding` does that).

    Raises:
        VerificationError: unknown key, bad public key, bad signature (naming `variant`).
    """
    import tempfile

    import model_signing

    def fail(cause: str, detail: str):
        raise VerificationError(f"variant {variant}: {cause}: {detail}", checks=[("signature", False, detail)])

    keys = [Path(p) for p in public_key_paths]
    if not keys:
        fail("unknown key", "no trusted public keys were given")
    hint = _bundle_key_hint(signature_bytes, variant)
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
            # The hint is the bundle's word, not a checked fingerprint: escaped and cut before it is quoted (raw, a
            # hint with terminal escapes reached the terminal through this message; a 100 KB one made it 100 KB).
            from .untrusted import shown

            text = str(hint)
            quoted = shown(text[:80] + ("..." if len(text) > 80 else ""))
            fail(
                "unknown key",
                f"signed by key sha256:{quoted}, which is none of the trusted keys "
                f"({', '.join(str(k) for k in keys)})",
            )

    errors = []
    with tempfile.TemporaryDirectory(prefix="winattn-sig-") as tmp:
        metadata, signature = Path(tmp) / METADATA_FILENAME, Path(tmp) / SIGNATURE_FILENAME
        metadata.write_bytes(metadata_bytes)
        signature.write_bytes(signature_bytes)
        for key in candidates:
            config = (
                model_signing.verifying.Config()
                .set_hashing_config(_hashing_config())
                .use_elliptic_key_verifier(public_key=key)
            )
            try:
                config.verify(metadata, signature)
                payload = _payload(signature_bytes)  # the bytes model-signing just verified
            except Exception as e:  # model-signing raises ValueError, cryptography InvalidSignature, protobuf errors
                errors.append(f"{key}: {type(e).__name__}: {e}".strip())
                continue
            return str(key), (payload.get("predicate") or {}).get(STATEMENT_KEY)
    fail("bad signature", "metadata.json does not match its signature (" + "; ".join(errors) + ")")
    raise AssertionError("unreachable")


def verify_variant_signature(variant_dir: Path, public_key_paths: list[Path], *, check_files: bool = True,
                             repo_id: str | None = None, version: int | None = None) -> str:
    """Verify the variant's `metadata.json.sigstore` against trusted public keys; return the key that verified.

    The signature must be over the exact bytes of metadata.json, made by one of `public_key_paths`, and its statement
    must hold (`check_binding`: this variant directory's name, and `repo_id` / `version` when given). With
    `check_files` (default) the variant's files are then checked against metadata.json's digest, so success means
    every file is as signed.

    Returns:
        str: the path (as given) of the public key that verified the signature.

    Raises:
        VerificationError: naming the variant and the cause — missing signature, unknown key (signed by a key not in
            `public_key_paths`), bad signature (metadata.json changed or the bundle is corrupt), a binding that does
            not hold (signed for another repository, version or variant), or files not matching the signed digest.
            `checks` holds the (check, passed, detail) tuples.
    """
    variant_dir = Path(variant_dir)
    signature, metadata = variant_dir / SIGNATURE_FILENAME, variant_dir / METADATA_FILENAME
    if not signature.is_file():
        raise VerificationError(f"variant {variant_dir.name}: missing signature: {signature} does not exist (publish "
                                "with `--signing-key` to sign)", checks=[("signature", False, "missing")])
    if not metadata.is_file():
        raise VerificationError(f"variant {variant_dir.name}: missing metadata: {metadata} does not exist",
                                checks=[("signature", False, "metadata.json missing")])
    metadata_bytes = metadata.read_bytes()
    key, statement = verify_signed_statement(metadata_bytes, signature.read_bytes(), public_key_paths,
                                             variant=variant_dir.name)
    check_binding(statement, variant=variant_dir.name, metadata_bytes=metadata_bytes, repo_id=repo_id,
                  version=version)
    if check_files:
        try:
            check_digest(variant_dir)
        except ValueError as e:
            raise VerificationError(
                f"variant {variant_dir.name}: files do not match the signed metadata.json: {e}",
                checks=[("signature", True, key), ("digest", False, str(e))],
            ) from None
    return key
