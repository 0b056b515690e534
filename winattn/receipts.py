"""Verified receipts: a JSON file written after a fully successful verification, so that `winattn verify` does not
hash an unchanged variant again (`winattn.verify` describes when one is trusted and when it is rewritten).

A receipt holds the sha256 of metadata.json (and of its signature), the origin of the variant (repository, commit,
publisher verdict: what offline loads rely on), and for each file of the digest (size, mtime_ns, ctime_ns, inode,
device) of the file it resolves to, taken before the file was read. Receipts live next to the snapshot
(`<repo cache>/.winattn/receipts/<commit>/<variant>.json`) or, for other directories, under winattn's own cache
(`cache_layout.winattn_cache_dir`). They are a cache, not a trust anchor, and are read as untrusted input.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

from . import bounded_json, safe_fs
from .cache_layout import parse_cache_variant_dir, winattn_cache_dir
from .errors import RemoteValueError
from .file_reader import Listing
from .untrusted import contained

logger = logging.getLogger(__name__)

RECEIPT_FORMAT = 1
MAX_RECEIPT_BYTES = 16 << 20


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
    return winattn_cache_dir(), winattn_cache_dir() / "receipts" / f"{key}.json"


def read_receipt(variant_path: Path) -> Optional[dict]:
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
    # The shape too, not only the depth: a `files` that is a list (or a stat tuple that is a number) made
    # `receipt_matches` raise TypeError, and an `origin` that is not an object made an offline load's `.get` raise
    # AttributeError, on every later verification of the entry. Such a receipt is not one winattn wrote: ignored.
    files, origin = data.get("files"), data.get("origin")
    if not isinstance(files, dict) or not all(isinstance(v, list) and len(v) == 5 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in v) for v in files.values()):
        return None
    if origin is not None and not isinstance(origin, dict):
        return None
    return data


def write_receipt(variant_path: Path, listing: Listing, *, metadata_sha256: str, signature_sha256: Optional[str],
                  verified_at: Optional[str], origin: Optional[dict]) -> None:
    """Written atomically through a fresh temporary file, never through a link (`safe_fs.write_atomic`), in a
    directory that resolves under the cache it belongs to."""
    data = {
        "format": RECEIPT_FORMAT,
        "variant_path": os.path.realpath(variant_path),
        "metadata_sha256": metadata_sha256,
        "signature_sha256": signature_sha256,
        "files": {rel: list(e.stat_key) for rel, e in listing.files.items()},
        "verified_at": verified_at,
        "origin": origin,
    }
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


def receipt_matches(receipt: dict, listing: Listing, metadata_sha256: str) -> bool:
    """Does the listing (names and stat tuples) and metadata.json equal what the receipt recorded?"""
    if receipt.get("metadata_sha256") != metadata_sha256:
        return False
    recorded = receipt.get("files") or {}
    if sorted(recorded) != sorted(listing.files):
        return False
    return all(list(listing.files[rel].stat_key) == list(recorded[rel]) for rel in listing.files)
