"""Fetch a located variant (`winattn.sources.Found`) and verify it once, before anything of it is imported.

Every file is copied into a private directory while it is hashed (`winattn.importer.private_copy_dir`): the copy is
what `winattn.load` imports. A cached Hub copy that fails for a reason a download can fix (changed bytes) is
downloaded once more; a wrong key, a signature binding that does not hold, or an unsigned build under
`require_signature` never cost a download (the publication itself is so). Offline, the publisher is trusted only by
this call's opt-in or by the verdict an earlier online verification of this same cache entry recorded.
"""

from __future__ import annotations

import logging
from pathlib import Path

from . import sources
from .errors import UntrustedKernelError, VerificationError
from .trust import TrustKind, recorded_kind

logger = logging.getLogger("winattn")

# A re-fetch heals a cache whose bytes changed (files, digest, metadata, lock).
_REPAIRABLE = {"files", "digest", "metadata", "lock"}


def _verify_copy(variant_dir: Path, **kwargs):
    """`verify_variant` with a private copy made while hashing; the copy is discarded unless verification passed."""
    from .importer import discard, private_copy_dir
    from .verify import verify_variant

    copy = private_copy_dir(variant_dir.name)
    try:
        report = verify_variant(variant_dir, bytecode="purge", copy_to=copy, **kwargs)
    except BaseException:
        discard(copy)
        raise
    if not report.ok or report.copy_path is None:
        discard(copy)
    return report


def _repairable(report) -> bool:
    """A failure a fresh download can fix: changed bytes, or a signature that no longer matches its bytes."""
    for check in report.failures:
        if check.name in _REPAIRABLE:
            return True
        if check.name == "signature" and "bad signature" in check.detail:
            return True
    return False


def verify_found(found: "sources.Found", keys, require_signature):
    """Fetch and verify `found` once, under its variant lock; a cached Hub copy that fails repairably is downloaded
    once more (a corrupted cache heals, a bad publication does not). Raises `VerificationError`."""
    common = dict(public_keys=keys, require_signature=require_signature, lock_entry=found.lock_entry,
                  origin=found.origin, expect=found.expect)
    with found.lock():
        cached = (found.variant_dir / "metadata.json").is_file()
        variant_dir = found.fetch()
        report = _verify_copy(variant_dir, **common)
        if not report.ok and cached and found.can_refetch and _repairable(report):
            logger.warning(
                "cached copy of %s (%s) failed verification (%s); downloading it again",
                found.variant, found.what, "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
            )
            report = _verify_copy(found.refetch(), **common)
    if not report.ok:
        raise verification_error(found.label, report)
    found.after_verification()
    return report


def trust_reason(found: "sources.Found", report) -> str:
    """Why the publisher is trusted. Offline without an opt-in: only because an earlier online verification of
    this same cache entry found a trusted publisher (the receipt's origin); an earlier opt-in is never remembered."""
    if found.trust is not None:
        return found.trust.reason
    earlier = report.origin or {}
    if earlier.get("repo_id") != found.repo_id or earlier.get("commit") != found.commit \
            or recorded_kind(earlier.get("trust")) is not TrustKind.PUBLISHER:
        from .importer import discard

        discard(report.copy_path)
        raise UntrustedKernelError(
            f"Kernel repository '{found.repo_id}' ({found.what}): publisher "
            "trust cannot be checked in offline mode (HF_HUB_OFFLINE) and no online winattn.load of this cache entry "
            "found it to come from a trusted publisher (an earlier trust_remote_code / allowlist opt-in is not "
            f"remembered). Load it online from a trusted publisher, or pass trust_remote_code=True / an allowlist "
            f"containing '{found.repo_id}'."
        )
    logger.warning(
        "Skipping publisher trust check for '%s' because Hugging Face Hub is in offline mode: the cached "
        "variant %s was verified online before and its publisher was trusted (%s).",
        found.repo_id, found.variant, earlier["trust"],
    )
    return f"offline: {earlier['trust']}"


def verification_error(what: str, report) -> VerificationError:
    failures = "\n".join(f"  {c.line()}" for c in report.failures)
    return VerificationError(
        f"refusing to import {what}: verification failed (nothing was imported):\n{failures}", checks=report.checks
    )
