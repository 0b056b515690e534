"""Verification of one kernel variant directory, before anything in it is imported.

`verify_variant(path, ...)` returns a `VerificationReport` (outcomes as data); `winattn.load` raises
`VerificationError` from it, `winattn verify` prints it. Checks, in order:

1. `files`     the directory is listed without following links (`scan_variant`): every entry must be a real
               directory or a regular file; a symbolic link (to a file or a directory), FIFO, socket or device
               fails, with one exception: in a Hugging Face cache snapshot (`.../snapshots/<commit>/build/<variant>`)
               a file may be a link to a regular file in that repository's `blobs/` (that is how the cache stores
               files). Stray bytecode (`__pycache__/`, `*.pyc`) is purged or reported; it is never imported either way.
2. `lock`      (vendored variants) sha256 of metadata.json and of its signature equal the lock file's.
3. `signature` metadata.json's `metadata.json.sigstore` verifies with one of the trusted public keys, and its signed
               statement names this variant and the repository / version asked for (`winattn.signing`), checked on
               the raw bytes before metadata.json is parsed. When it (or the lock) fails, no other file is read:
               the digest is skipped.
4. `metadata`  metadata.json parses (`kernels.Metadata`).
5. `digest`    the listing equals metadata.json's `digest` (no missing, no extra file: checked on names and lstat
               sizes before anything is read), then every file is hashed, streamed in 1 MiB chunks, and compared.
               With `copy_to`, each file is copied into that private directory while it is hashed: the copy holds
               exactly the bytes that were hashed, and it is what `winattn.load` imports, so a file changed after
               verification (or during it) cannot be imported.
6. `kernels-minver`, `arch` (CUDA/ROCm device vs `backend.archs`), `python-depends`: kernels' own validators.
7. `abi3`      (optional, CLI) the shared objects only use the Python 3.9 stable ABI (`kernel_abi_check`).

This module makes the decisions; files are read only through `winattn.file_reader` (listing, bounded reads, streamed
hashing, private copies), the digest is compared by `winattn.digest`, and receipts are kept by `winattn.receipts`.

Verified receipts: hashing a variant (the .so dominates) on every `winattn verify` is avoided by a JSON receipt written
after a fully successful verification, keyed by the variant path. It holds the sha256 of metadata.json and, for each
file of the digest, (size, mtime_ns, ctime_ns, inode, device) of the file it resolves to (HF cache snapshots are
symlinks to blobs), taken before the file was read. A later verification re-lists the directory (so extra or missing
files are always noticed), re-hashes metadata.json (small), and re-hashes the whole variant unless every file's stat
tuple is unchanged. ctime cannot be set back by a user, so an in-place rewrite that restores mtime is still noticed.
A verification with `copy_to` (every load) always hashes, since the copy must be hashed as it is made; it still
writes the receipt, which also records the origin (repository, commit, publisher verdict) that offline loads rely on.
Receipts live next to the snapshot (`<repo cache>/.winattn/receipts/<commit>/<variant>.json`) or, for other
directories, under `$WINATTN_CACHE` (default `~/.cache/winattn`). They are a cache, not a trust anchor: someone who
can rewrite the cache can rewrite the receipt too; they guard against accidental change and tampering at rest by
anyone without that access.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from . import digest, file_reader
from .file_reader import MAX_METADATA_BYTES, MAX_SIGNATURE_BYTES, FileChanged, Listing
from .receipts import invalidate_receipt, read_receipt, receipt_matches, write_receipt
from .untrusted import shown
from .variant import ABI3_TARGET, METADATA_FILENAME, SIGNATURE_FILENAME, abi3_violations

logger = logging.getLogger(__name__)


class Check(tuple):
    """One verification result: a `(name, passed, detail)` 3-tuple (as `VerificationError.checks` documents) with a
    `status` attribute: "pass", "fail", "warn" (passed, with a caveat) or "skip" (not applicable, counts as passed)."""

    def __new__(cls, name: str, passed: bool, detail: str = "", status: Optional[str] = None):
        # Details quote file names from the variant: control and bidi characters are escaped, so that a name cannot
        # rewrite the terminal or reorder the line it is printed in (`winattn verify`, every VerificationError).
        self = super().__new__(cls, (name, bool(passed), shown(detail)))
        self.status = status or ("pass" if passed else "fail")
        return self

    name = property(lambda self: self[0])
    passed = property(lambda self: self[1])
    detail = property(lambda self: self[2])

    def __repr__(self) -> str:
        return f"Check({self.name!r}, {self.status}, {self.detail!r})"

    def line(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.detail}"


def _pass(name, detail=""):
    return Check(name, True, detail, "pass")


def _fail(name, detail):
    return Check(name, False, detail, "fail")


def _warn(name, detail):
    return Check(name, True, detail, "warn")


def _skip(name, detail):
    return Check(name, True, detail, "skip")


@dataclass
class VerificationReport:
    """Outcome of `verify_variant`.

    Attributes:
        variant_path: the directory verified.
        checks: every check in order.
        metadata: the parsed `kernels.Metadata`, or None when it could not be read.
        metadata_sha256 / signature_sha256: hex sha256 of metadata.json / metadata.json.sigstore (None if absent).
        receipt_hit: the digest check was answered by an unchanged verified-receipt (no re-hash).
        origin: the origin recorded by an earlier successful verification of this same metadata.json (repo id,
            commit, trust reason), or the one given to this verification. Only meaningful when `ok`.
        signer: the public key that verified the signature, if any.
        statement: what the verified signature vouches for (`winattn.signing.check_binding`), if any.
        copy_path: the private copy made while hashing (`copy_to`), once every file of it matched.
        file_status: per file of the listing and the digest: "ok", "MISMATCH", "MISSING", "EXTRA" (never read) or
            "UNREAD" (not hashed: the check stopped first).
    """

    variant_path: Path
    checks: list = field(default_factory=list)
    metadata: object = None
    metadata_sha256: Optional[str] = None
    signature_sha256: Optional[str] = None
    receipt_hit: bool = False
    origin: Optional[dict] = None
    signer: Optional[str] = None
    statement: Optional[dict] = None
    copy_path: Optional[Path] = None
    file_status: dict = field(default_factory=dict)

    @property
    def variant(self) -> str:
        return self.variant_path.name

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list:
        return [c for c in self.checks if not c.passed]

    def check(self, name: str) -> Optional[Check]:
        return next((c for c in self.checks if c.name == name), None)

    def summary(self) -> str:
        return "; ".join(f"{c.name} {c.status}" + (f" ({c.detail})" if not c.passed else "") for c in self.checks)

    def lines(self) -> list:
        return [c.line() for c in self.checks]


# ----------------------------------------------------------------------------------------------------------------------
# Individual checks


def _check_signature(variant: str, public_keys, require_signature: bool, has_signature: bool,
                     metadata_bytes: bytes = b"", signature_bytes: bytes = b"", expect: Optional[dict] = None):
    """(Check, signer, statement). The signature is verified over the exact bytes read (`winattn.signing` works on
    private copies of them): the same bytes that are then parsed and whose digest is checked. Its statement must name
    this variant, and the repository and version in `expect` when given."""
    if not public_keys:
        if require_signature:
            return _fail("signature", "require_signature=True but no trusted public keys were given"), None, None
        if has_signature:
            return _skip("signature", f"{SIGNATURE_FILENAME} present, not checked (no public keys given)"), None, None
        return _skip("signature", "unsigned, not required (no public keys given)"), None, None
    if not has_signature:
        detail = f"no {SIGNATURE_FILENAME} in the variant (unsigned)"
        if require_signature:
            return _fail("signature", detail + " and require_signature=True"), None, None
        logger.warning(
            "variant %s is unsigned although public keys were given (pass require_signature=True to refuse it)",
            variant,
        )
        return _warn("signature", detail + "; loading anyway because require_signature=False"), None, None
    try:
        from . import signing
    except ImportError as e:  # model-signing missing
        return _fail("signature", f"cannot verify signatures: {e} (install winattn[tools])"), None, None
    from .errors import VerificationError

    expect = expect or {}
    try:
        signer, statement = signing.verify_signed_statement(metadata_bytes, signature_bytes,
                                                            [Path(k) for k in public_keys], variant=variant)
        statement = signing.check_binding(statement, variant=variant, metadata_bytes=metadata_bytes,
                                          repo_id=expect.get("repo_id"), version=expect.get("version"))
    except VerificationError as e:
        return _fail("signature", str(e)), None, None
    except ImportError as e:
        return _fail("signature", f"cannot verify signatures: {e} (install winattn[tools])"), None, None
    return (_pass("signature", f"metadata.json signed by {signer} for {signing.describe_statement(statement)}"),
            signer, statement)


def _check_lock(lock_entry: dict, metadata_sha256: str, signature_sha256: Optional[str]):
    problems = []
    want_meta = lock_entry.get("metadata_sha256")
    if want_meta != metadata_sha256:
        problems.append(f"metadata.json sha256 {metadata_sha256} != locked {want_meta}")
    want_sig = lock_entry.get("signature_sha256")
    if want_sig != signature_sha256:
        if want_sig is None:
            problems.append(f"{SIGNATURE_FILENAME} present but the lock records none")
        elif signature_sha256 is None:
            problems.append(f"{SIGNATURE_FILENAME} missing but the lock records {want_sig}")
        else:
            problems.append(f"{SIGNATURE_FILENAME} sha256 {signature_sha256} != locked {want_sig}")
    if problems:
        return _fail("lock", "; ".join(problems))
    return _pass("lock", "metadata.json" + (" and signature" if want_sig else "") + " match the lock file")


def _check_digest(metadata, listing: Listing, receipt: Optional[dict], metadata_sha256: str,
                  copy_to: Optional[Path]):
    """(Check, receipt_hit, {rel: "ok" | "MISMATCH" | "MISSING" | "EXTRA" | "UNREAD"}, violations). Names and sizes
    first (`digest.compare_names`); an unchanged receipt answers without reading; else every listed file is hashed and
    copied into `copy_to` while hashed (no copy once a violation is known: it could not be imported anyway)."""
    comparison = digest.compare_names(metadata, listing)
    if comparison.refusal is not None:
        return _fail("digest", comparison.refusal), False, comparison.statuses, []
    n, algorithm = len(comparison.expected), comparison.algorithm
    if comparison.violations:
        copy_to = None
    if not comparison.violations and copy_to is None and receipt is not None \
            and receipt_matches(receipt, listing, metadata_sha256):
        since = receipt.get("verified_at")
        return (_pass("digest", f"{n} files match ({algorithm}, unchanged since verified {since})"), True,
                dict.fromkeys(comparison.expected, "ok"), [])
    digest.compare_contents(comparison, listing, copy_to)
    if comparison.refusal is not None:
        return _fail("digest", comparison.refusal), False, comparison.statuses, []
    violations = comparison.violations
    if violations:
        return (_fail("digest", f"{len(violations)} violation(s): " + "; ".join(violations)), False,
                comparison.statuses, violations)
    return (_pass("digest", f"{n} files match ({algorithm})" + (", copied while hashed" if copy_to else "")), False,
            comparison.statuses, [])


def _check_validator(name: str, validator, metadata, variant: str):
    try:
        validator.validate_metadata(metadata=metadata, variant=variant)
    except (ValueError, ImportError, RuntimeError) as e:
        return _fail(name, str(e))
    return None


def _check_arch(metadata, variant: str):
    from ._kernels_private import Backend
    from kernels.validate import ArchValidator

    backend = metadata.backend.backend_type
    archs = metadata.backend.archs
    if backend not in (Backend.CUDA, Backend.ROCm):
        return _skip("arch", f"{str(backend).lower()} variant, no device architecture to match")
    import torch

    if not torch.cuda.is_available():
        return _skip("arch", "no GPU visible, nothing to match")
    failed = _check_validator("arch", ArchValidator(), metadata, variant)
    if failed:
        return failed
    if not archs:
        return _warn("arch", "the variant declares no architectures")
    if backend == Backend.CUDA:
        major, minor = torch.cuda.get_device_capability()
        return _pass("arch", f"CUDA capability {major}.{minor} in {', '.join(archs)}")
    return _pass("arch", f"device architecture in {', '.join(archs)}")


def _check_python_depends(metadata, variant: str):
    from kernels.validate import DependencyValidator

    deps = list(metadata.python_depends)
    failed = _check_validator("python-depends", DependencyValidator(), metadata, variant)
    if failed:
        return failed
    return _pass("python-depends", ", ".join(deps) + " importable" if deps else "none")


def _check_minver(metadata, variant: str):
    from kernels.validate import MinverValidator

    failed = _check_validator("kernels-minver", MinverValidator(), metadata, variant)
    if failed:
        return failed
    minver = metadata.kernels_minver
    return _pass("kernels-minver", f"kernels>={minver} satisfied" if minver else "no minimum")


def _check_abi3(variant_path: Path, files: list):
    try:
        import kernel_abi_check  # noqa: F401
    except ImportError:
        return _skip("abi3", "kernel-abi-check not installed")
    objects = [rel for rel in files if rel.endswith((".so", ".pyd"))]
    if not objects:
        return _skip("abi3", "no shared object")
    problems = []
    for rel in objects:
        try:
            problems += [f"{rel}: {v}" for v in abi3_violations(variant_path / rel)]
        except Exception as e:  # unreadable or not an object file
            problems.append(f"{rel}: {e}")
    if problems:
        return _fail("abi3", f"{len(problems)} symbol(s) outside the Python {ABI3_TARGET} stable ABI: "
                     + "; ".join(problems[:10]))
    return _pass("abi3", f"{', '.join(objects)} use only the Python {ABI3_TARGET} stable ABI")


# ----------------------------------------------------------------------------------------------------------------------


def verify_variant(
    variant_path,
    *,
    public_keys: Optional[Sequence] = None,
    require_signature: bool = False,
    lock_entry: Optional[dict] = None,
    bytecode: str = "fail",
    check_arch: bool = True,
    check_deps: bool = True,
    check_abi: bool = False,
    use_receipt: bool = True,
    origin: Optional[dict] = None,
    expect: Optional[dict] = None,
    copy_to: Optional[Path] = None,
) -> VerificationReport:
    """Verify a variant directory without importing anything from it.

    Args:
        variant_path: the variant directory (`.../build/<variant>`).
        public_keys: trusted public key files; a present signature must verify with one of them.
        require_signature: refuse an unsigned variant (needs `public_keys`).
        lock_entry: `{"metadata_sha256": hex, "signature_sha256": hex | None}` from a vendor lock file.
        bytecode: what to do with stray `__pycache__`/`*.pyc`: "purge" (delete, fail if impossible), "fail", "warn".
        check_arch / check_deps: run kernels' arch and python-depends validators.
        check_abi: check the shared objects with kernel-abi-check (slow-ish; the CLI uses it).
        use_receipt: use and update the verified-receipt (see the module docstring).
        origin: stored in the receipt on success (`{"repo_id", "commit", "trust"}`), so offline loads can tell an
            already-verified, trusted cache entry.
        expect: `{"repo_id": str, "version": int | None}`: what the signature's statement must name (loads pass
            what they asked for; without it only the variant name is checked).
        copy_to: an empty private directory: every file is copied there while it is hashed (`report.copy_path`
            once all matched), with metadata.json and its signature as read. Always hashes (no receipt shortcut).
    """
    variant_path = Path(variant_path)
    report = VerificationReport(variant_path=variant_path)
    checks = report.checks

    try:
        st = os.lstat(variant_path)
    except OSError as e:
        checks.append(_fail("files", f"{variant_path} cannot be read: {e}"))
        return report
    if stat.S_ISLNK(st.st_mode):
        checks.append(_fail("files", f"{variant_path} is a symbolic link to {os.readlink(variant_path)!r}: verify "
                            "and load the directory itself"))
        return report
    if not stat.S_ISDIR(st.st_mode):
        checks.append(_fail("files", f"{variant_path} is not a directory"))
        return report
    try:
        listing = file_reader.scan_variant(variant_path)
    except OSError as e:
        checks.append(_fail("files", f"cannot list {variant_path}: {e}"))
        return report
    if listing.metadata is None:
        problem = next((p for p in listing.problems if p.startswith(METADATA_FILENAME + ":")), None)
        checks.append(_fail("files", problem or f"{METADATA_FILENAME} is missing"))
        return report

    stray = listing.bytecode
    notes = []
    if stray and bytecode == "purge":
        left = file_reader.purge_bytecode(variant_path, stray)
        if left:
            listing.problems.append(f"cannot remove stray bytecode not covered by the digest: {', '.join(left)}")
        else:
            logger.info("removed stray bytecode from %s: %s", variant_path, ", ".join(stray))
            notes.append(f"removed {len(stray)} stray bytecode file(s)")
        stray = left
    if listing.problems:
        checks.append(_fail("files", f"{len(listing.problems)} entr{'y' if len(listing.problems) == 1 else 'ies'} "
                            "the digest does not cover: " + "; ".join(listing.problems)))
    elif stray and bytecode == "warn":
        checks.append(_warn("files", f"stray bytecode not covered by the digest (never imported; Python may execute "
                            f"it elsewhere): {', '.join(stray)}"))
    elif stray:
        checks.append(_fail("files", f"stray bytecode not covered by the digest (Python would execute it): "
                            f"{', '.join(stray)}"))
    else:
        checks.append(_pass("files", "; ".join([f"{len(listing.files)} files besides metadata.json"] + notes)))

    try:
        metadata_bytes = file_reader.read_entry(listing.metadata, MAX_METADATA_BYTES)
        signature_bytes = file_reader.read_entry(listing.signature, MAX_SIGNATURE_BYTES) if listing.signature else b""
    except (OSError, FileChanged) as e:
        checks.append(_fail("files", f"cannot read {METADATA_FILENAME} / {SIGNATURE_FILENAME}: {e}"))
        return report
    has_signature = listing.signature is not None
    report.metadata_sha256 = hashlib.sha256(metadata_bytes).hexdigest()
    report.signature_sha256 = hashlib.sha256(signature_bytes).hexdigest() if has_signature else None

    if lock_entry is not None:
        checks.append(_check_lock(lock_entry, report.metadata_sha256, report.signature_sha256))

    # The signature is checked on the raw bytes, before metadata.json is parsed.
    sig_check, report.signer, report.statement = _check_signature(
        variant_path.name, public_keys, require_signature, has_signature, metadata_bytes, signature_bytes, expect
    )
    checks.append(sig_check)

    from kernels import Metadata

    try:
        metadata = Metadata.from_bytes(metadata_bytes)
    except ValueError as e:
        checks.append(_fail("metadata", f"{METADATA_FILENAME} is invalid: {e}"))
        return report
    report.metadata = metadata
    checks.append(_pass("metadata", f"{metadata.name} v{metadata.version}, id {metadata.id}, "
                        f"backend {str(metadata.backend.backend_type).lower()}"))

    receipt = read_receipt(variant_path) if use_receipt else None
    if receipt is not None and receipt.get("metadata_sha256") != report.metadata_sha256:
        receipt = None
    # The lock and the signature vouch for metadata.json, which lists every other file: when they do not hold, no
    # other file is read (a forged metadata.json could list a huge file, hashed and copied in full for nothing).
    refused = next((c for c in checks if c.name in ("lock", "signature") and not c.passed), None)
    if listing.problems:
        checks.append(_fail("digest", "not hashed: the variant has entries the digest cannot cover (see files)"))
    elif refused is not None:
        checks.append(_skip("digest", f"not hashed: the {refused.name} check failed, so no file besides "
                            f"{METADATA_FILENAME} and its signature was read"))
    else:
        digest_check, report.receipt_hit, report.file_status, _ = _check_digest(
            metadata, listing, None if stray else receipt, report.metadata_sha256, copy_to
        )
        checks.append(digest_check)

    checks.append(_check_minver(metadata, variant_path.name))
    checks.append(_check_arch(metadata, variant_path.name) if check_arch else _skip("arch", "not requested"))
    checks.append(
        _check_python_depends(metadata, variant_path.name) if check_deps else _skip("python-depends", "not requested")
    )
    if check_abi:
        checks.append(_check_abi3(variant_path, sorted(listing.files)))

    if copy_to is not None and report.ok:
        try:
            for name, data in ((METADATA_FILENAME, metadata_bytes), (SIGNATURE_FILENAME, signature_bytes)):
                if name == SIGNATURE_FILENAME and not has_signature:
                    continue
                fd = file_reader.private_file(Path(copy_to), name)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        except OSError as e:
            checks.append(_fail("files", f"cannot write the private copy {copy_to}: {e}"))
        else:
            report.copy_path = Path(copy_to)

    previous_origin = (receipt or {}).get("origin")
    report.origin = origin or previous_origin
    if use_receipt and report.ok and not stray:
        if not report.receipt_hit or (origin and origin != previous_origin):
            write_receipt(
                variant_path, listing, metadata_sha256=report.metadata_sha256,
                signature_sha256=report.signature_sha256, origin=report.origin,
                verified_at=(receipt or {}).get("verified_at") if report.receipt_hit
                else _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            )
    elif use_receipt and not report.ok:
        failed = {c.name for c in report.failures}
        if failed & {"digest", "files", "metadata"}:
            invalidate_receipt(variant_path)
    return report
