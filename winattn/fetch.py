"""Fetch a located variant (`winattn.sources.Found`) and verify it once, before anything of it is imported.

`install` puts a Hub variant into the cache (downloaded through `winattn.download`, under a per-variant file lock
that concurrent processes share, `variant_lock`); vendored and cached variants are already where they are.

Every file is copied into a private directory while it is hashed (`winattn.importer.private_copy_dir`): the copy is
what `winattn.load` imports. A cached Hub copy that fails for a reason a download can fix (changed bytes) is
downloaded once more; a wrong key, a signature binding that does not hold, or an unsigned build under
`require_signature` never cost a download (the publication itself is so). Offline, the publisher is trusted only by
this call's opt-in or by the verdict an earlier online verification of this same cache entry recorded.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from . import cache_layout, safe_fs, sources, untrusted
from .errors import UntrustedKernelError, VerificationError
from .trust import TrustKind, recorded_kind
from .variant import METADATA_FILENAME

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
    with variant_lock(found):
        cached = (found.variant_dir / METADATA_FILENAME).is_file()
        variant_dir = install(found)
        report = _verify_copy(variant_dir, **common)
        if not report.ok and cached and found.remote is not None and _repairable(report):
            logger.warning(
                "cached copy of %s (%s) failed verification (%s); downloading it again",
                found.variant, found.what, "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
            )
            report = _verify_copy(install(found, force=True), **common)
    if not report.ok:
        raise verification_error(found.label, report)
    if found.remote is not None and found.revision != found.commit:
        _write_ref(found.remote.pin)  # offline loads resolve the revision to the commit verified here
    return report


def variant_lock(found: "sources.Found"):
    """A per-variant file lock around install + verify (concurrent processes share one download)."""
    if found.source == "vendored" or found.commit is None:
        return contextlib.nullcontext()
    return _variant_lock(found.repo_id, found.commit, found.variant)


def install(found: "sources.Found", *, force: bool = False) -> Path:
    """The variant's directory: a Hub variant not in the cache yet is downloaded there first. `force` (Hub variants
    only) removes the cached copy and downloads it again: a corrupted cache heals."""
    if found.remote is None:
        return found.variant_dir
    if force:
        _remove_snapshot_variant(found.variant_dir)  # snapshot links only; blobs are re-fetched by force
    elif (found.variant_dir / METADATA_FILENAME).is_file():
        return found.variant_dir
    return _download(found.remote.api, found.remote.pin, found.variant, force=force)


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


# ----------------------------------------------------------------------------------------------------------------------
# The Hub cache


def _variant_lock(repo_id: str, commit: str, variant: str):
    """A file lock in the cache's `.locks/`, named after a checked commit and variant, created without following a
    link (a link planted there would otherwise be created or touched through)."""
    from filelock import FileLock

    folder = cache_layout.repo_cache_folder(repo_id)
    locks = Path(cache_layout.cache_dir()) / ".locks" / folder.name
    name = f"winattn-{untrusted.commit_id(commit, source='the pinned commit')}-" \
           f"{untrusted.name(variant, source='the variant name')}.lock"
    lock_path = locks / name
    try:
        locks.mkdir(parents=True, exist_ok=True)
        untrusted.contained(cache_layout.cache_dir(), locks, source="the cache's lock directory")
        safe_fs.touch_lock(lock_path)
    except (OSError, VerificationError) as e:  # read-only cache (offline use), or a link out: nothing written there
        logger.debug("no lock for %s: %s", lock_path, e)
        return contextlib.nullcontext()
    return FileLock(str(lock_path))


def _download(api, pin, variant: str, *, force: bool) -> Path:
    """Download the variant into the cache: listed, checked and guarded (`winattn.download`)."""
    from .download import download

    snapshot = download(api, pin, [variant], cache_dir=cache_layout.cache_dir(), force=force)
    return snapshot / "build" / variant


def _remove_snapshot_variant(variant_dir: Path) -> None:
    """Remove a cached variant directory without following anything in it (links, FIFOs and all), iteratively."""
    try:
        safe_fs.remove_tree(variant_dir)
    except OSError as e:
        logger.warning("cannot remove %s before downloading it again: %s", variant_dir, e)


def _write_ref(pin) -> None:
    """Record `refs/<revision>` -> commit in the cache (what `hf_hub_download(revision=<branch>)` writes), so that an
    offline load (kernels' or ours) can resolve `version=N` to the commit verified here. Written atomically, through a
    fresh temporary file, never through a link (`safe_fs.write_atomic`), and only under `refs/`."""
    refs = cache_layout.repo_cache_folder(pin.repo_id) / "refs"
    ref = refs / untrusted.ref_name(pin.revision, source="the revision")
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        # the directory written into must resolve under refs/; the ref itself is replaced, a link there included
        untrusted.contained(refs, ref.parent, source=f"the ref {pin.revision}")
        safe_fs.write_atomic(ref, untrusted.commit_id(pin.commit, source="the pinned commit").encode())
    except (OSError, VerificationError) as e:
        logger.debug("cannot write %s: %s", ref, e)
