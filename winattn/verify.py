"""Verification of one kernel variant directory, before anything in it is imported.

`verify_variant(path, ...)` returns a `VerificationReport` (outcomes as data); `winattn.load` raises
`VerificationError` from it, `winattn verify` prints it. Checks, in order:

1. `files`     metadata.json present; stray bytecode (`__pycache__/`, `*.pyc`, which the digest does not cover and
               Python would execute) purged or reported.
2. `lock`      (vendored variants) sha256 of metadata.json and of its signature equal the lock file's.
3. `signature` metadata.json's `metadata.json.sigstore` verifies with one of the trusted public keys
               (`winattn.signing`), checked on the raw bytes before metadata.json is parsed.
4. `metadata`  metadata.json parses (`kernels._rust.Metadata`).
5. `digest`    every file's hash equals metadata.json's `digest`, no missing or extra file
               (`kernels._rust.Digest.hash_variant` + `Digest.validate`), or an unchanged verified-receipt.
6. `kernels-minver`, `arch` (CUDA/ROCm device vs `backend.archs`), `python-depends`: kernels' own validators.
7. `abi3`      (optional, CLI) the shared objects only use the Python 3.9 stable ABI (`kernel_abi_check`).

Verified receipts: hashing a variant (the .so dominates) on every load is avoided by a JSON receipt written after a
fully successful verification, keyed by the variant path. It holds the sha256 of metadata.json and, for each file of
the digest, (size, mtime_ns, ctime_ns, inode, device) of the file it resolves to (HF cache snapshots are symlinks to
blobs). A later verification re-lists the directory (so extra or missing files are always noticed), re-hashes
metadata.json (small), and re-hashes the whole variant unless every file's stat tuple is unchanged. ctime cannot be
set back by a user, so an in-place rewrite that restores mtime is still noticed. Receipts live next to the snapshot
(`<repo cache>/.winattn/receipts/<commit>/<variant>.json`) or, for other directories, under `$WINATTN_CACHE`
(default `~/.cache/winattn`). They are a cache, not a trust anchor: someone who can rewrite the cache can rewrite the
receipt too; they guard against accidental change and tampering at rest by anyone without that access.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

logger = logging.getLogger(__name__)

METADATA_FILENAME = "metadata.json"
SIGNATURE_FILENAME = "metadata.json.sigstore"  # same name as winattn.signing and kernels.verify
RECEIPT_FORMAT = 1
ABI3_TARGET = "3.9"


class Check(tuple):
    """One verification result: a `(name, passed, detail)` 3-tuple (as `VerificationError.checks` documents) with a
    `status` attribute: "pass", "fail", "warn" (passed, with a caveat) or "skip" (not applicable, counts as passed)."""

    def __new__(cls, name: str, passed: bool, detail: str = "", status: Optional[str] = None):
        self = super().__new__(cls, (name, bool(passed), detail))
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
    """

    variant_path: Path
    checks: list = field(default_factory=list)
    metadata: object = None
    metadata_sha256: Optional[str] = None
    signature_sha256: Optional[str] = None
    receipt_hit: bool = False
    origin: Optional[dict] = None
    signer: Optional[str] = None

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
# Files


def _is_bytecode(rel: str) -> bool:
    return rel.endswith(".pyc") or "__pycache__" in rel.split("/")


def list_files(variant_path: Path) -> tuple[list, list]:
    """(files, bytecode) of the variant as sorted POSIX relative paths, without metadata.json and its signature.

    Symlinks to files count as files (HF cache snapshots are symlinks to blobs); directories are not followed through
    symlinks."""
    files, bytecode = [], []
    root = str(variant_path)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):  # a linked directory: report it as a file entry (it is not expected)
                dirnames.remove(d)
                filenames.append(d)
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if rel in (METADATA_FILENAME, SIGNATURE_FILENAME):
                continue
            (bytecode if _is_bytecode(rel) else files).append(rel)
    return sorted(files), sorted(bytecode)


def purge_bytecode(variant_path: Path, bytecode: Iterable[str]) -> list:
    """Remove stray bytecode (it is never part of a published variant); return what could not be removed."""
    left = []
    dirs = set()
    for rel in bytecode:
        p = variant_path / rel
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(rel)
        parts = rel.split("/")
        if "__pycache__" in parts:
            dirs.add(variant_path.joinpath(*parts[: parts.index("__pycache__") + 1]))
    for d in sorted(dirs, reverse=True):
        shutil.rmtree(d, ignore_errors=True)
    return left


# ----------------------------------------------------------------------------------------------------------------------
# Receipts


def _user_cache_dir() -> Path:
    if os.environ.get("WINATTN_CACHE"):
        return Path(os.environ["WINATTN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "winattn"


def receipt_path(variant_path: Path) -> Path:
    """Where the verified-receipt of `variant_path` lives (see the module docstring)."""
    p = Path(os.path.abspath(variant_path))
    parents = p.parents
    if len(parents) >= 4 and parents[0].name == "build" and parents[2].name == "snapshots":
        repo_folder, commit = parents[3], parents[1].name
        return repo_folder / ".winattn" / "receipts" / commit / f"{p.name}.json"
    key = hashlib.sha256(os.path.realpath(p).encode()).hexdigest()[:40]
    return _user_cache_dir() / "receipts" / f"{key}.json"


def _stat_key(path: Path) -> list:
    st = os.stat(path)  # follows symlinks: the blob behind a snapshot link
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read_receipt(variant_path: Path) -> Optional[dict]:
    try:
        data = json.loads(receipt_path(variant_path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != RECEIPT_FORMAT:
        return None
    if data.get("variant_path") != os.path.realpath(variant_path):
        return None
    return data


def _write_receipt(variant_path: Path, data: dict) -> None:
    path = receipt_path(variant_path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:  # read-only cache: verification still works, just without the shortcut
        logger.debug("cannot write verified-receipt %s: %s", path, e)
        try:
            tmp.unlink()
        except OSError:
            pass


def invalidate_receipt(variant_path: Path) -> None:
    try:
        receipt_path(variant_path).unlink()
    except OSError:
        pass


def _receipt_matches(receipt: dict, variant_path: Path, files: list, metadata_sha256: str) -> bool:
    if receipt.get("metadata_sha256") != metadata_sha256:
        return False
    recorded = receipt.get("files") or {}
    if sorted(recorded) != files:
        return False
    try:
        return all(_stat_key(variant_path / rel) == list(recorded[rel]) for rel in files)
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------------------------------
# Individual checks


def _check_signature(variant_path: Path, public_keys, require_signature: bool, has_signature: bool,
                     metadata_bytes: bytes = b"", signature_bytes: bytes = b""):
    """(Check, signer). The signature is verified over the exact bytes read (copied to a private temporary
    directory): the same bytes that are then parsed and whose digest is checked, and real files even when the
    variant lives in the HF cache, where every file is a symlink to a blob."""
    if not public_keys:
        if require_signature:
            return _fail("signature", "require_signature=True but no trusted public keys were given"), None
        if has_signature:
            return _skip("signature", f"{SIGNATURE_FILENAME} present, not checked (no public keys given)"), None
        return _skip("signature", "unsigned, not required (no public keys given)"), None
    if not has_signature:
        detail = f"no {SIGNATURE_FILENAME} in the variant (unsigned)"
        if require_signature:
            return _fail("signature", detail + " and require_signature=True"), None
        logger.warning(
            "variant %s is unsigned although public keys were given (pass require_signature=True to refuse it)",
            variant_path.name,
        )
        return _warn("signature", detail + "; loading anyway because require_signature=False"), None
    try:
        from . import signing
    except ImportError as e:  # model-signing missing
        return _fail("signature", f"cannot verify signatures: {e} (install winattn[tools])"), None
    from .errors import VerificationError

    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="winattn-sig-") as tmp:
            copy = Path(tmp) / variant_path.name
            copy.mkdir()
            (copy / METADATA_FILENAME).write_bytes(metadata_bytes)
            (copy / SIGNATURE_FILENAME).write_bytes(signature_bytes)
            signer = signing.verify_variant_signature(copy, [Path(k) for k in public_keys], check_files=False)
    except VerificationError as e:
        return _fail("signature", str(e).replace(str(copy), str(variant_path))), None
    except ImportError as e:
        return _fail("signature", f"cannot verify signatures: {e} (install winattn[tools])"), None
    return _pass("signature", f"metadata.json signed by {signer}"), signer


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


def _check_digest(variant_path: Path, metadata, files: list, receipt: Optional[dict], metadata_sha256: str):
    """(Check, receipt_hit)."""
    from kernels._rust import Digest, DigestValidationError

    expected = metadata.digest
    if expected is None:
        return _fail("digest", "metadata.json has no `digest`: the variant's files cannot be checked"), False
    algorithm = str(expected.algorithm).lower()
    n = len(expected.files)
    if (
        receipt is not None
        and sorted(expected.files) == files
        and _receipt_matches(receipt, variant_path, files, metadata_sha256)
    ):
        since = receipt.get("verified_at")
        return _pass("digest", f"{n} files match ({algorithm}, unchanged since verified {since})"), True
    try:
        actual = Digest.hash_variant(expected.algorithm, str(variant_path))
    except (OSError, RuntimeError) as e:
        return _fail("digest", f"cannot hash the variant: {e}"), False
    try:
        expected.validate(actual)
    except DigestValidationError as e:
        violations = [str(v) for v in e.violations]
        return _fail("digest", f"{len(violations)} violation(s): " + "; ".join(violations)), False
    return _pass("digest", f"{n} files match ({algorithm})"), False


def _check_validator(name: str, validator, metadata, variant: str):
    try:
        validator.validate_metadata(metadata=metadata, variant=variant)
    except (ValueError, ImportError, RuntimeError) as e:
        return _fail(name, str(e))
    return None


def _check_arch(metadata, variant: str):
    from kernels._rust import Backend
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
        import kernel_abi_check
    except ImportError:
        return _skip("abi3", "kernel-abi-check not installed")
    objects = [rel for rel in files if rel.endswith((".so", ".pyd"))]
    if not objects:
        return _skip("abi3", "no shared object")
    problems = []
    for rel in objects:
        try:
            violations = kernel_abi_check.ObjectFile(str(variant_path / rel)).check_python_abi(ABI3_TARGET)
        except Exception as e:  # unreadable or not an object file
            problems.append(f"{rel}: {e}")
            continue
        problems += [f"{rel}: {v}" for v in violations]
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
    """
    variant_path = Path(variant_path)
    report = VerificationReport(variant_path=variant_path)
    checks = report.checks
    metadata_path = variant_path / METADATA_FILENAME
    signature_path = variant_path / SIGNATURE_FILENAME

    if not variant_path.is_dir():
        checks.append(_fail("files", f"{variant_path} is not a directory"))
        return report
    if not metadata_path.is_file():
        checks.append(_fail("files", f"{METADATA_FILENAME} is missing"))
        return report

    files, stray = list_files(variant_path)
    if stray and bytecode == "purge":
        left = purge_bytecode(variant_path, stray)
        if left:
            checks.append(_fail("files", f"cannot remove stray bytecode not covered by the digest: {', '.join(left)}"))
        else:
            logger.info("removed stray bytecode from %s: %s", variant_path, ", ".join(stray))
            checks.append(_pass("files", f"{len(files)} files; removed {len(stray)} stray bytecode file(s)"))
        stray = left
    elif stray and bytecode == "warn":
        checks.append(_warn("files", f"stray bytecode not covered by the digest (Python may execute it): "
                            f"{', '.join(stray)}"))
    elif stray:
        checks.append(_fail("files", f"stray bytecode not covered by the digest (Python would execute it): "
                            f"{', '.join(stray)}"))
    else:
        checks.append(_pass("files", f"{len(files)} files besides metadata.json"))

    metadata_bytes = metadata_path.read_bytes()
    report.metadata_sha256 = hashlib.sha256(metadata_bytes).hexdigest()
    has_signature = signature_path.is_file()
    signature_bytes = signature_path.read_bytes() if has_signature else b""
    report.signature_sha256 = hashlib.sha256(signature_bytes).hexdigest() if has_signature else None

    if lock_entry is not None:
        checks.append(_check_lock(lock_entry, report.metadata_sha256, report.signature_sha256))

    # The signature is checked on the raw bytes, before metadata.json is parsed.
    sig_check, report.signer = _check_signature(
        variant_path, public_keys, require_signature, has_signature, metadata_bytes, signature_bytes
    )
    checks.append(sig_check)

    from kernels._rust import Metadata

    try:
        metadata = Metadata.from_bytes(metadata_bytes)
    except ValueError as e:
        checks.append(_fail("metadata", f"{METADATA_FILENAME} is invalid: {e}"))
        return report
    report.metadata = metadata
    checks.append(_pass("metadata", f"{metadata.name} v{metadata.version}, id {metadata.id}, "
                        f"backend {str(metadata.backend.backend_type).lower()}"))

    receipt = _read_receipt(variant_path) if use_receipt else None
    if receipt is not None and receipt.get("metadata_sha256") != report.metadata_sha256:
        receipt = None
    digest_check, report.receipt_hit = _check_digest(
        variant_path, metadata, files, None if stray else receipt, report.metadata_sha256
    )
    checks.append(digest_check)

    checks.append(_check_minver(metadata, variant_path.name))
    checks.append(_check_arch(metadata, variant_path.name) if check_arch else _skip("arch", "not requested"))
    checks.append(
        _check_python_depends(metadata, variant_path.name) if check_deps else _skip("python-depends", "not requested")
    )
    if check_abi:
        checks.append(_check_abi3(variant_path, files))

    previous_origin = (receipt or {}).get("origin")
    report.origin = origin or previous_origin
    if use_receipt and report.ok and not stray:
        if not report.receipt_hit or (origin and origin != previous_origin):
            try:
                stats = {rel: _stat_key(variant_path / rel) for rel in files}
            except OSError:
                stats = None
            if stats is not None:
                _write_receipt(variant_path, {
                    "format": RECEIPT_FORMAT,
                    "variant_path": os.path.realpath(variant_path),
                    "metadata_sha256": report.metadata_sha256,
                    "signature_sha256": report.signature_sha256,
                    "files": stats,
                    "verified_at": (receipt or {}).get("verified_at") if report.receipt_hit
                    else _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "origin": report.origin,
                })
    elif use_receipt and not report.ok:
        failed = {c.name for c in report.failures}
        if failed & {"digest", "files", "metadata"}:
            invalidate_receipt(variant_path)
    return report
