"""A variant's digest: `compute_digest` writes what `check_digest` checks (metadata.json's `digest`).

Computing is kernels' own hashing (`Digest.hash_variant`), so `kernels` and winattn agree on what a build is. Checking
is one comparison (`compare_names`, then `compare_contents`) over the loader's file reader (`winattn.file_reader`: no
link followed, every file read once in 1 MiB chunks), used by every load (`winattn.verify`) and by the publisher, the
signer and the vendor (`check_digest`), so that they refuse exactly what a load would refuse.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import file_reader
from .file_reader import MAX_METADATA_BYTES, FileChanged, Listing, max_variant_bytes, scan_variant
from .variant import METADATA_FILENAME


class DigestMismatch(ValueError):
    """A variant's files do not match its metadata.json `digest`; `violations` names each file."""

    def __init__(self, message: str, violations: list):
        super().__init__(message)
        self.violations = violations


def compute_digest(variant_dir: Path) -> dict:
    """`{"algorithm": "sha256", "files": {rel: base64 sha256}}` of every file but metadata.json, its signature and
    bytecode: kernels' own hashing (`Digest.hash_variant`), so `kernels` and winattn agree on what a build is."""
    from ._kernels_private import Digest, DigestAlgorithm

    digest = Digest.hash_variant(DigestAlgorithm.SHA256, str(variant_dir))
    return {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}


def check_digest(variant_dir: Path, *, follow_file_links: bool = True) -> None:
    """Check the variant's files against metadata.json's `digest`, the way a load checks them.

    `follow_file_links` (default, for the publisher's and signer's own files, e.g. an HF-cache-like copy whose files
    are links into blobs/) reads a link to a regular file as that file, as kernels' hashing does; loads never do.

    Raises:
        DigestMismatch (a ValueError): metadata.json is missing or invalid, has no digest, the variant holds entries
            the digest cannot cover (links, FIFOs, stray bytecode is ignored), or a file is missing, extra or
            different; the message starts with "digest mismatch: " and names every file.
    """
    violations = digest_violations(Path(variant_dir), follow_file_links=follow_file_links)
    if violations:
        raise DigestMismatch("digest mismatch: " + "; ".join(violations), violations)


@dataclass
class Comparison:
    """A listing against a digest.

    Attributes:
        algorithm: the digest's hash algorithm.
        expected: {rel: base64 hash} the digest lists.
        statuses: per file of the listing and the digest: "ok", "MISMATCH", "MISSING", "EXTRA" (never read) or
            "UNREAD" (not hashed yet).
        violations: one line per missing, unknown or different file.
        refusal: why the comparison stopped (no digest, unknown algorithm, too big, a file that cannot be hashed).
    """

    algorithm: str = ""
    expected: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)
    refusal: Optional[str] = None


def compare_names(metadata, listing: Listing) -> Comparison:
    """Names and sizes only, nothing read: a file the digest does not list is never read, and nothing is read when
    the listed files add up to more than the size limit (`refusal`)."""
    expected = metadata.digest
    if expected is None:
        return Comparison(refusal="metadata.json has no `digest`: the variant's files cannot be checked")
    algorithm = str(expected.algorithm).lower()
    if algorithm not in hashlib.algorithms_guaranteed:
        return Comparison(refusal=f"unsupported digest algorithm {algorithm!r}")
    want = dict(expected.files)
    have = [rel for rel in listing.files if rel in want]
    statuses = {rel: "MISSING" for rel in want if rel not in listing.files}
    statuses.update({rel: "EXTRA" for rel in listing.files if rel not in want})
    statuses.update({rel: "UNREAD" for rel in have})
    violations = [f"Missing file: {rel}" for rel in sorted(set(want) - set(have))]
    violations += [f"Unknown file: {rel} (not read)" for rel in sorted(set(listing.files) - set(want))]
    comparison = Comparison(algorithm, want, statuses, violations)
    total, limit = sum(listing.files[rel].size for rel in have), max_variant_bytes()
    if total > limit:
        comparison.refusal = (f"the variant's files add up to {total} bytes, more than the limit of {limit} "
                              "(WINATTN_MAX_VARIANT_BYTES); refused before reading any file")
    return comparison


def compare_contents(comparison: Comparison, listing: Listing, copy_to: Optional[Path] = None) -> None:
    """Hash every listed file the digest names, in name order, into `comparison`; with `copy_to`, copy each file
    there while it is hashed (the copy holds exactly the bytes hashed). Stops at the first file that cannot be
    hashed (`refusal`)."""
    want = comparison.expected
    for rel in sorted(rel for rel in listing.files if rel in want):
        out = None
        try:
            if copy_to is not None:
                out = file_reader.private_file(copy_to, rel)
            got = file_reader.hash_entry(listing.files[rel], comparison.algorithm, out)
        except (OSError, FileChanged) as e:
            comparison.refusal = f"cannot hash {rel}: {e}"
            return
        finally:
            if out is not None:
                os.close(out)
        comparison.statuses[rel] = "ok" if got == want[rel] else "MISMATCH"
        if got != want[rel]:
            comparison.violations.append(f"File hash mismatch for {rel}: expected: {want[rel]}, got: {got}")


def digest_violations(variant_path: Path, metadata=None, *, follow_file_links: bool = False) -> list:
    """Every way the variant's files differ from its metadata.json `digest` ([] when they match), checked with the
    same listing and streaming hasher as a load (no receipt, no copy): `check_digest` for the publisher, the signer
    and the vendor. Stray bytecode is ignored (it is never uploaded or imported).
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
        metadata = metadata or Metadata.from_bytes(file_reader.read_entry(listing.metadata, MAX_METADATA_BYTES))
    except (OSError, FileChanged, ValueError) as e:
        return [f"{METADATA_FILENAME} cannot be read: {e}"]
    if metadata.digest is None:
        return [f"{METADATA_FILENAME} has no `digest`, so it does not cover the variant's files"]
    comparison = compare_names(metadata, listing)
    if comparison.refusal is None:
        compare_contents(comparison, listing)
    return [comparison.refusal] if comparison.refusal is not None else comparison.violations
