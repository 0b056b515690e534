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

import base64
import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from . import bounded_json, safe_fs
from .resolve import parse_cache_variant_dir
from .errors import RemoteValueError
from .untrusted import contained, shown
from .variant import ABI3_TARGET, METADATA_FILENAME, SIGNATURE_FILENAME, abi3_violations, is_bytecode

logger = logging.getLogger(__name__)

RECEIPT_FORMAT = 1
CHUNK_BYTES = 1 << 20  # hashing is streamed: at most this much of a file is in memory at once
MAX_METADATA_BYTES = 16 << 20
MAX_SIGNATURE_BYTES = 4 << 20
MAX_RECEIPT_BYTES = 16 << 20
DEFAULT_MAX_VARIANT_BYTES = 16 << 30  # $WINATTN_MAX_VARIANT_BYTES: refuse bigger variants before reading them


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
# Files


@dataclass(frozen=True)
class Entry:
    """A file of the variant as listed, before anything is read.

    Attributes:
        rel: POSIX path relative to the variant.
        path: what is opened: the file itself, or the blob an HF cache snapshot link points to.
        size: its size (lstat) at listing time.
        stat_key: (size, mtime_ns, ctime_ns, inode, device) at listing time, for the verified-receipt.
    """

    rel: str
    path: str
    size: int
    stat_key: tuple


@dataclass
class Listing:
    """`scan_variant`'s result: regular files (metadata.json and its signature apart), stray bytecode, and every
    entry that the digest cannot cover (links, FIFOs, devices, sockets), as one line each."""

    files: dict = field(default_factory=dict)
    bytecode: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    metadata: Optional[Entry] = None
    signature: Optional[Entry] = None


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), f"a special file (mode {mode:o})")


def _key(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _blobs_dir(variant_path: Path) -> Optional[str]:
    """`<repo cache>/blobs` when `variant_path` is an HF cache snapshot's `build/<variant>`, else None."""
    snapshot = parse_cache_variant_dir(variant_path)
    return os.path.realpath(snapshot[0] / "blobs") if snapshot is not None else None


def scan_variant(variant_path: Path, *, follow_file_links: bool = False) -> Listing:
    """List a variant without following any link and without reading any file.

    Regular files become `Entry`s; in an HF cache snapshot a link to a regular file directly in the repository's
    `blobs/` is a file too (its blob is what is read). Anything else is a problem line: the digest only covers regular
    files, and an import that followed a link to a directory (kernels' variant lookup does) would run files nobody
    hashed. `__pycache__/` and `*.pyc` (of any kind) are stray bytecode. `follow_file_links` (tooling on the
    publisher's own files, never a load) takes any link to a regular file as that file, as kernels' hashing does.
    """
    listing = Listing()
    root = Path(variant_path)
    blobs = _blobs_dir(root)

    def add(full: str, rel: str, st: os.stat_result) -> Optional[Entry]:
        if stat.S_ISREG(st.st_mode):
            return Entry(rel, full, st.st_size, _key(st))
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(full)
            if follow_file_links or (blobs is not None and os.path.dirname(target) == blobs):
                try:
                    tst = os.lstat(target)
                except OSError:
                    tst = None
                if tst is not None and stat.S_ISREG(tst.st_mode):
                    return Entry(rel, target, tst.st_size, _key(tst))
            what = "a directory" if os.path.isdir(full) else "a file" if os.path.isfile(full) else "nothing readable"
            listing.problems.append(f"{rel}: symbolic link to {os.readlink(full)!r} ({what}): links are not covered "
                                    "by the digest")
            return None
        listing.problems.append(f"{rel}: {_kind(st.st_mode)}, not a regular file (not covered by the digest)")
        return None

    def sorted_entries(directory: str) -> list:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)

    # Depth-first in name order, as a stack of (entries left, relative prefix, inside bytecode) instead of recursion:
    # a tree 1,100 levels deep exhausted the interpreter's recursion limit (RecursionError) in the old walk.
    stack = [(iter(sorted_entries(str(root))), "", False)]
    while stack:
        entries, prefix, in_bytecode = stack[-1]
        e = next(entries, None)
        if e is None:
            stack.pop()
            continue
        rel = prefix + e.name
        st = e.stat(follow_symlinks=False)
        bytecode = in_bytecode or is_bytecode(rel)
        if stat.S_ISDIR(st.st_mode):
            stack.append((iter(sorted_entries(e.path)), rel + "/", bytecode))
        elif bytecode:
            listing.bytecode.append(rel)
        elif prefix == "" and e.name in (METADATA_FILENAME, SIGNATURE_FILENAME):
            entry = add(e.path, rel, st)
            if e.name == METADATA_FILENAME:
                listing.metadata = entry
            else:
                listing.signature = entry
        else:
            entry = add(e.path, rel, st)
            if entry is not None:
                listing.files[rel] = entry
    return listing


def list_files(variant_path: Path) -> tuple[list, list]:
    """(files, bytecode) of the variant as sorted POSIX relative paths, without metadata.json and its signature
    (`scan_variant`; entries that are not regular files are in neither list)."""
    listing = scan_variant(Path(variant_path))
    return sorted(listing.files), sorted(listing.bytecode)


def purge_bytecode(variant_path: Path, bytecode: Iterable[str]) -> list:
    """Remove stray bytecode (it is never part of a published variant); return what could not be removed.
    Links are removed, never followed."""
    left = []
    dirs = set()
    for rel in bytecode:
        p = variant_path / rel
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(rel)
        parts = rel.split("/")
        if "__pycache__" in parts:
            dirs.add(variant_path.joinpath(*parts[: parts.index("__pycache__") + 1]))
    for d in sorted(dirs, reverse=True):
        if d.is_symlink():
            d.unlink(missing_ok=True)
        else:
            shutil.rmtree(d, ignore_errors=True)
    return left


def max_variant_bytes() -> int:
    """The size limit of a variant ($WINATTN_MAX_VARIANT_BYTES, default 16 GiB), checked before hashing."""
    raw = os.environ.get("WINATTN_MAX_VARIANT_BYTES")
    if not raw:
        return DEFAULT_MAX_VARIANT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"WINATTN_MAX_VARIANT_BYTES must be an integer number of bytes, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"WINATTN_MAX_VARIANT_BYTES must be positive, got {value}")
    return value


class _Changed(Exception):
    """A file stopped being the regular file of the listing while it was read."""


def _open_regular(entry: Entry) -> int:
    """Open the listed file without following a link (O_NOFOLLOW), without blocking on a FIFO swapped in since the
    listing (O_NONBLOCK), and check that it is still a regular file."""
    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Changed(f"{entry.rel} is no longer a regular file")
    return fd


def _read_small(entry: Entry, limit: int) -> bytes:
    if entry.size > limit:
        raise _Changed(f"{entry.rel} is {entry.size} bytes, more than the {limit} a {entry.rel} may have")
    fd = _open_regular(entry)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _Changed(f"{entry.rel} grew past {limit} bytes while it was read")
    return data


def _hash_file(entry: Entry, algorithm: str, copy_fd: Optional[int]) -> str:
    """base64 digest of the file (kernels' format), streamed; the bytes hashed are written to `copy_fd` as read."""
    h = hashlib.new(algorithm)
    seen = 0
    fd = _open_regular(entry)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            chunk = f.read(CHUNK_BYTES)
            if not chunk:
                break
            seen += len(chunk)
            if seen > entry.size:
                raise _Changed(f"{entry.rel} grew past its listed {entry.size} bytes while it was hashed")
            h.update(chunk)
            if copy_fd is not None:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(copy_fd, view):]
    return base64.b64encode(h.digest()).decode()


def _private_file(copy_to: Path, rel: str) -> int:
    """Create `copy_to/rel` (and its directories, mode 0700) for writing; never follows or reuses an entry."""
    parts = rel.split("/")
    d = copy_to
    for part in parts[:-1]:
        d = d / part
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if d.is_symlink() or not d.is_dir():
                raise
    return os.open(d / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


# ----------------------------------------------------------------------------------------------------------------------
# Receipts


def _user_cache_dir() -> Path:
    if os.environ.get("WINATTN_CACHE"):
        return Path(os.environ["WINATTN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "winattn"


def receipt_path(variant_path: Path) -> Path:
    """Where the verified-receipt of `variant_path` lives (see the module docstring)."""
    return _receipt_place(variant_path)[1]


def _receipt_place(variant_path: Path) -> tuple:
    """(the directory receipts of `variant_path` must stay under once resolved, the receipt's path)."""
    p = Path(os.path.abspath(variant_path))
    snapshot = parse_cache_variant_dir(p)
    if snapshot is not None:
        repo_folder, commit = snapshot
        return repo_folder, repo_folder / ".winattn" / "receipts" / commit / f"{p.name}.json"
    key = hashlib.sha256(os.path.realpath(p).encode()).hexdigest()[:40]
    return _user_cache_dir(), _user_cache_dir() / "receipts" / f"{key}.json"


def _read_receipt(variant_path: Path) -> Optional[dict]:
    """The receipt of `variant_path`, or None when there is none or it is not one winattn wrote: it lives in a
    directory others may write, so it is read without following a link, bounded in size and depth, and a bad one is
    ignored (the variant is hashed), never an error that blocks the load."""
    try:
        data = bounded_json.loads(safe_fs.read_small(receipt_path(variant_path), MAX_RECEIPT_BYTES),
                                  max_bytes=MAX_RECEIPT_BYTES, what="verified-receipt")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != RECEIPT_FORMAT:
        return None
    if data.get("variant_path") != os.path.realpath(variant_path):
        return None
    return data


def _write_receipt(variant_path: Path, data: dict) -> None:
    """Written atomically through a fresh temporary file, never through a link (`safe_fs.write_atomic`), in a
    directory that resolves under the cache it belongs to."""
    root, path = _receipt_place(variant_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        contained(root, path.parent, source="the verified-receipt's directory")  # no link out of the cache
        safe_fs.write_atomic(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except (OSError, RemoteValueError) as e:  # read-only cache: verification still works, without the shortcut
        logger.debug("cannot write verified-receipt %s: %s", path, e)


def invalidate_receipt(variant_path: Path) -> None:
    try:
        receipt_path(variant_path).unlink()
    except OSError:
        pass


def _receipt_matches(receipt: dict, listing: Listing, metadata_sha256: str) -> bool:
    if receipt.get("metadata_sha256") != metadata_sha256:
        return False
    recorded = receipt.get("files") or {}
    if sorted(recorded) != sorted(listing.files):
        return False
    return all(list(listing.files[rel].stat_key) == list(recorded[rel]) for rel in listing.files)


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
    """(Check, receipt_hit, {rel: "ok" | "MISMATCH" | "MISSING" | "EXTRA" | "UNREAD"}, violations). Names and sizes first: a file the digest does not list is never read, and nothing is
    read when the listed files add up to more than the size limit. Then every listed file is hashed in chunks, and
    copied into `copy_to` while hashed (no copy once a violation is known: it could not be imported anyway)."""
    expected = metadata.digest
    if expected is None:
        return _fail("digest", "metadata.json has no `digest`: the variant's files cannot be checked"), False, {}, []
    algorithm = str(expected.algorithm).lower()
    if algorithm not in hashlib.algorithms_guaranteed:
        return _fail("digest", f"unsupported digest algorithm {algorithm!r}"), False, {}, []
    want = dict(expected.files)
    have = {rel: e for rel, e in listing.files.items() if rel in want}
    n = len(want)
    statuses = {rel: "MISSING" for rel in want if rel not in have}
    statuses.update({rel: "EXTRA" for rel in listing.files if rel not in want})
    statuses.update({rel: "UNREAD" for rel in have})
    violations = [f"Missing file: {rel}" for rel in sorted(set(want) - set(have))]
    violations += [f"Unknown file: {rel} (not read)" for rel in sorted(set(listing.files) - set(want))]
    total, limit = sum(e.size for e in have.values()), max_variant_bytes()
    if total > limit:
        return _fail("digest", f"the variant's files add up to {total} bytes, more than the limit of {limit} "
                     "(WINATTN_MAX_VARIANT_BYTES); refused before reading any file"), False, statuses, []
    if violations:
        copy_to = None
    if not violations and copy_to is None and receipt is not None and _receipt_matches(receipt, listing,
                                                                                        metadata_sha256):
        since = receipt.get("verified_at")
        return (_pass("digest", f"{n} files match ({algorithm}, unchanged since verified {since})"), True,
                dict.fromkeys(want, "ok"), [])
    for rel in sorted(have):
        out = None
        try:
            if copy_to is not None:
                out = _private_file(copy_to, rel)
            got = _hash_file(have[rel], algorithm, out)
        except (OSError, _Changed) as e:
            return _fail("digest", f"cannot hash {rel}: {e}"), False, statuses, []
        finally:
            if out is not None:
                os.close(out)
        statuses[rel] = "ok" if got == want[rel] else "MISMATCH"
        if got != want[rel]:
            violations.append(f"File hash mismatch for {rel}: expected: {want[rel]}, got: {got}")
    if violations:
        return (_fail("digest", f"{len(violations)} violation(s): " + "; ".join(violations)), False, statuses,
                violations)
    return (_pass("digest", f"{n} files match ({algorithm})" + (", copied while hashed" if copy_to else "")), False,
            statuses, [])


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


def digest_violations(variant_path: Path, metadata=None, *, follow_file_links: bool = False) -> list:
    """Every way the variant's files differ from its metadata.json `digest` ([] when they match), checked with the
    same listing and streaming hasher as a load (no receipt, no copy): `winattn.variant.check_digest` for the
    publisher, the signer and the vendor. Stray bytecode is ignored (it is never uploaded or imported).
    `metadata` (a parsed `kernels` Metadata) checks the files against that digest instead of the directory's own;
    `follow_file_links` as `scan_variant`."""
    try:
        listing = scan_variant(Path(variant_path), follow_file_links=follow_file_links)
    except OSError as e:
        return [f"cannot list {variant_path}: {e}"]
    if metadata is None and listing.metadata is None:
        return [f"{METADATA_FILENAME} is missing"]
    if listing.problems:
        return listing.problems
    from kernels import Metadata

    try:
        metadata = metadata or Metadata.from_bytes(_read_small(listing.metadata, MAX_METADATA_BYTES))
    except (OSError, _Changed, ValueError) as e:
        return [f"{METADATA_FILENAME} cannot be read: {e}"]
    if metadata.digest is None:
        return [f"{METADATA_FILENAME} has no `digest`, so it does not cover the variant's files"]
    check, _, _, violations = _check_digest(metadata, listing, None, "", None)
    return [] if check.passed else violations or [check.detail]


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
        listing = scan_variant(variant_path)
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
        left = purge_bytecode(variant_path, stray)
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
        metadata_bytes = _read_small(listing.metadata, MAX_METADATA_BYTES)
        signature_bytes = _read_small(listing.signature, MAX_SIGNATURE_BYTES) if listing.signature else b""
    except (OSError, _Changed) as e:
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

    receipt = _read_receipt(variant_path) if use_receipt else None
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
                fd = _private_file(Path(copy_to), name)
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
            _write_receipt(variant_path, {
                "format": RECEIPT_FORMAT,
                "variant_path": os.path.realpath(variant_path),
                "metadata_sha256": report.metadata_sha256,
                "signature_sha256": report.signature_sha256,
                "files": {rel: list(e.stat_key) for rel, e in listing.files.items()},
                "verified_at": (receipt or {}).get("verified_at") if report.receipt_hit
                else _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "origin": report.origin,
            })
    elif use_receipt and not report.ok:
        failed = {c.name for c in report.failures}
        if failed & {"digest", "files", "metadata"}:
            invalidate_receipt(variant_path)
    return report
